"""Sparse MLA decode attention (hisparse_jax.sparse_attention, contract in ffi/sparse_attention.h).

Ladder: a NumPy oracle of the contract's arithmetic (16 fixed chunks, 32-token stages, online
softmax, p rounded to bfloat16, chunks then the open page merged in order) -> the XLA reference
(any backend) -> the CUDA kernels (tests marked `gpu`; ffi/tests/sparse_attention_cuda_check.cu
holds them to the CPU implementation and checks batch and source invariance bit for bit).
Scores are float32 sums in different orders, so values are compared within a rounding
tolerance; the oracle against exact float64 softmax attention shows the chunked arithmetic is
attention (within the bfloat16 rounding of p), and the model's own `layers.attend` agrees too.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hisparse_jax as hs
from hisparse_jax.models import layers

sa = importlib.import_module("hisparse_jax.sparse_attention")  # the module; the package exports the op
BF16 = np.dtype(ml_dtypes.bfloat16)
W, DV = sa.WIDTH, sa.VALUE_WIDTH


def make(rng, b=2, H=64, k=512, P=1, N=700, invalid=0.0, out_of_range=0.0, spread=1.0, tail_p=0.5):
    """Random operands; ids distinct per request, some -1 / out of range."""
    q = rng.uniform(-1, 1, (b, H, W)).astype(BF16)
    source = (spread * rng.uniform(-1, 1, (b, N, P, W))).astype(BF16)
    tail = (spread * rng.uniform(-1, 1, (b, P, W))).astype(BF16)
    index = np.stack([rng.permutation(N)[:k] if k <= N else rng.integers(0, N, k) for _ in range(b)]).astype(np.int32)
    u = rng.uniform(size=index.shape)
    index[u < invalid] = -1
    index[(u >= invalid) & (u < invalid + out_of_range)] = N + 3
    tail_valid = rng.uniform(size=(b, P)) < tail_p
    tail_valid[:, 0] = True
    return q, source, index, tail, tail_valid


def round_bf16(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def oracle(q, source, index, tail, tail_valid, scale):
    """The contract's arithmetic in NumPy float32 (scores summed in float64, rounded once)."""
    q64 = np.asarray(q).astype(np.float64)
    src = np.asarray(source).astype(np.float32)
    b, N, P, _ = src.shape
    k = index.shape[1]
    T = k * P
    chunk = T // sa.CHUNKS
    H = q64.shape[1]
    out = np.zeros((b, H, DV), np.float32)
    scale = np.float32(scale)
    for r in range(b):
        ids = np.repeat(index[r], P)
        tok = np.tile(np.arange(P), k)
        ok = (ids >= 0) & (ids < N)
        keys = np.where(ok[:, None], src[r, np.where(ok, ids, 0), tok], 0.0).astype(np.float32)
        s = (q64[r] @ keys.astype(np.float64).T).astype(np.float32) * scale  # [H, T]
        s = np.where(ok[None], s, -np.inf).astype(np.float32)
        ms, ls, os = [], [], []
        for c in range(sa.CHUNKS):
            m = np.full(H, -np.inf, np.float32)
            l = np.zeros(H, np.float32)
            o = np.zeros((H, DV), np.float32)
            for t0 in range(c * chunk, (c + 1) * chunk, sa.STAGE):
                sj = s[:, t0:t0 + sa.STAGE]
                nxt = np.maximum(m, sj.max(axis=1))
                with np.errstate(invalid="ignore"):
                    alpha = np.where(m == -np.inf, 0.0, np.exp(m - nxt)).astype(np.float32)
                    p = round_bf16(np.where(sj == -np.inf, 0.0, np.exp(sj - nxt[:, None])))
                l = alpha * l + p.sum(axis=1, dtype=np.float32)
                o = alpha[:, None] * o + p @ keys[t0:t0 + sa.STAGE, :DV]
                m = nxt
            ms.append(m), ls.append(l), os.append(o)
        ts = (q64[r] @ np.asarray(tail[r]).astype(np.float64).T).astype(np.float32) * scale  # [H, P]
        ts = np.where(tail_valid[r][None], ts, -np.inf)
        big = np.maximum(np.max(ms, axis=0), ts.max(axis=1))
        with np.errstate(invalid="ignore"):
            w = [np.where(m == -np.inf, 0.0, np.exp(m - big)) for m in ms]
            pt = np.where(ts == -np.inf, 0.0, np.exp(ts - big[:, None]))
        total = sum(wc * lc for wc, lc in zip(w, ls)) + pt.sum(axis=1)
        num = sum(wc[:, None] * oc for wc, oc in zip(w, os)) + pt @ np.asarray(tail[r]).astype(np.float32)[:, :DV]
        out[r] = np.where(total[:, None] > 0, num / np.where(total > 0, total, 1.0)[:, None], 0.0)
    return out


def exact(q, source, index, tail, tail_valid, scale):
    """Softmax attention in float64 over the same tokens, no rounding of p."""
    b, N, P, _ = source.shape
    out = np.zeros((b, q.shape[1], DV))
    for r in range(b):
        ids, tok = np.repeat(index[r], P), np.tile(np.arange(P), index.shape[1])
        ok = (ids >= 0) & (ids < N)
        toks = np.concatenate([np.asarray(source[r, ids[ok], tok[ok]]), np.asarray(tail[r][tail_valid[r]])])
        toks = toks.astype(np.float64)
        s = np.asarray(q[r]).astype(np.float64) @ toks.T * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[r] = (p / p.sum(axis=1, keepdims=True)) @ toks[:, :DV]
    return out


def close(got, want, rel):
    got, want = np.asarray(got), np.asarray(want)
    top = np.abs(want).max(axis=-1, keepdims=True) + 1e-6
    err = np.abs(got - want) / top
    assert np.isfinite(got).all()
    assert err.max() <= rel, f"worst |err| / max|ref| = {err.max():.3g} > {rel:.3g}"


CASES = {
    "plain": dict(),
    "invalid-ids": dict(invalid=0.3, out_of_range=0.05),
    "page2-tail-mask": dict(k=256, P=2, N=300, invalid=0.1),
    "h128": dict(b=1, H=128, k=512, N=600),
    "peaky": dict(spread=3.0),
}


def on_cpu():
    """The XLA reference on XLA:CPU, what these tests hold to the oracle at 1e-4. On a GPU, XLA sums
    a score's products in another order, and a score one ulp away can round its p to the other
    bfloat16 (2^-8 relative): the GPU's reference lands within ~1e-3 of the oracle, like the CUDA
    kernel, whose own tests are marked `gpu`."""
    return jax.default_device(jax.devices("cpu")[0])


@pytest.mark.parametrize("case", list(CASES))
def test_reference_follows_the_contract(case):
    args = make(np.random.default_rng(1), **CASES[case])
    scale = 0.3
    want = oracle(*args, scale)
    with on_cpu():
        got = hs.sparse_attention_reference(*args, scale)
    close(got, want, 1e-4)
    close(want, exact(*args, scale), 1e-2)  # the chunked arithmetic is attention, to bf16 p


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto picks by the default backend: CUDA on a GPU")
def test_auto_on_cpu_is_the_reference():
    args = make(np.random.default_rng(2))
    auto, reference = hs.sparse_attention(*args, 0.2), hs.sparse_attention_reference(*args, 0.2)
    assert np.array_equal(np.asarray(auto), np.asarray(reference))


def test_matches_the_model_attend():
    """The op and the model's f32 attention (layers.attend over the gathered records + the open page)."""
    q, source, index, tail, tail_valid = make(np.random.default_rng(3), b=2, k=512, invalid=0.2)
    scale = 0.25
    ok = index >= 0
    rows = np.asarray(source)[np.arange(2)[:, None], np.where(ok, index, 0), 0]
    rec = layers.Part(jnp.asarray(rows), jnp.asarray(rows[..., :DV]), jnp.asarray(ok))
    tl = layers.Part(jnp.asarray(tail), jnp.asarray(tail[..., :DV]), jnp.asarray(tail_valid))
    want = layers.attend(jnp.asarray(q), [rec, tl], scale)
    close(hs.sparse_attention(q, source, index, tail, tail_valid, scale), want, 1e-2)


def test_hot_buffer_and_device_kv_give_the_same_bits():
    """The same records read by slot from a hot buffer or by id from the device KV."""
    rng = np.random.default_rng(4)
    q, source, index, tail, tail_valid = make(rng, b=2, k=512, N=900, invalid=0.1)
    slots = 600
    hot = np.zeros((2, slots, 1, W), BF16)
    slot_index = np.full_like(index, -1)
    for r in range(2):
        perm = rng.permutation(slots)
        for j, i in enumerate(index[r]):
            if i >= 0:
                hot[r, perm[j]] = source[r, i]
                slot_index[r, j] = perm[j]
    a = hs.sparse_attention(q, source, index, tail, tail_valid, 0.3)
    b = hs.sparse_attention(q, hot, slot_index, tail, tail_valid, 0.3)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_unselected_and_invalid_rows_are_never_read():
    """NaN in every row the selection does not name (and behind -1 ids) changes nothing."""
    q, source, index, tail, tail_valid = make(np.random.default_rng(5), invalid=0.2)
    poisoned = np.full_like(source, np.nan)
    for r in range(source.shape[0]):
        keep = index[r][index[r] >= 0]
        poisoned[r, keep] = source[r, keep]
    a = hs.sparse_attention(q, source, index, tail, tail_valid, 0.3)
    b = hs.sparse_attention(q, poisoned, index, tail, tail_valid, 0.3)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_nothing_valid_gives_zeros_and_only_the_tail_gives_its_value():
    q, source, index, tail, tail_valid = make(np.random.default_rng(6), b=1)
    none = np.full_like(index, -1)
    out = hs.sparse_attention(q, source, none, tail, np.zeros_like(tail_valid), 0.3)
    assert np.array_equal(np.asarray(out), np.zeros((1, 64, DV), np.float32))
    out = hs.sparse_attention(q, source, none, tail, tail_valid, 0.3)  # P = 1: the one tail token
    want = np.broadcast_to(np.asarray(tail[0, 0, :DV]).astype(np.float32), (1, 64, DV))
    assert np.array_equal(np.asarray(out), want)


def test_a_whole_invalid_chunk():
    q, source, index, tail, tail_valid = make(np.random.default_rng(7), b=1)
    index[0, 64:96] = -1  # chunk 2 of 16 (32 records each at k = 512)
    with on_cpu():
        got = hs.sparse_attention_reference(q, source, index, tail, tail_valid, 0.3)
    close(got, oracle(q, source, index, tail, tail_valid, 0.3), 1e-4)


def test_a_stacked_source_and_its_layer():
    """[L, b, N, P, W] with a (traced) layer == that layer's [b, N, P, W]; outside [0, L): tail only."""
    rng = np.random.default_rng(13)
    q, source, index, tail, tail_valid = make(rng, b=2)
    stacked = np.stack([(rng.uniform(-1, 1, source.shape)).astype(BF16), source, source * 0])
    one = jax.jit(lambda src, idx: hs.sparse_attention(q, src, idx, tail, tail_valid, 0.3))
    f = jax.jit(lambda l: hs.sparse_attention(q, stacked, index, tail, tail_valid, 0.3, layer=l))
    close(f(jnp.int32(1)), one(source, index), 1e-6)  # one program each: XLA may fuse them differently
    close(f(jnp.int32(3)), one(source, np.full_like(index, -1)), 1e-6)


def test_works_under_jit():
    args = make(np.random.default_rng(8), b=1)
    f = jax.jit(lambda *a: hs.sparse_attention(*a, 0.3))
    close(f(*args), oracle(*args, 0.3), 1e-4)


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: (a[0].astype(np.float32),) + a[1:], TypeError, "q must be bfloat16"),
    (lambda a: (a[0], a[1], a[2].astype(np.float32)) + a[3:], TypeError, "index must be int32"),
    (lambda a: a[:4] + (a[4].astype(np.int32),), TypeError, "tail_valid must be bool"),
    (lambda a: (a[0][:, :32],) + a[1:], ValueError, "multiple of 64"),
    (lambda a: (a[0], a[1], a[2][:, :500]) + a[3:], ValueError, "multiple of 512; pad the selection with -1"),
    (lambda a: (a[0], a[1][..., :512]) + a[2:], ValueError, r"\[b, N, P, 576\]"),
    (lambda a: a[:3] + (a[3][:1],) + a[4:], ValueError, r"tail has shape"),
    (lambda a: (a[0], a[1][None, :, :, :, :, None]) + a[2:], ValueError, r"\[L, b, N, P, 576\]"),
])
def test_bad_operands_name_the_argument_and_the_fix(mutate, error, match):
    args = make(np.random.default_rng(9), b=2)
    with pytest.raises(error, match=match):
        hs.sparse_attention(*mutate(args), 0.3)


def test_ffi_without_cuda_says_what_to_do():
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU backend runs the kernel")
    args = make(np.random.default_rng(10), b=1)
    with pytest.raises(RuntimeError):
        hs.sparse_attention(*args, 0.3, implementation="ffi")


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_the_reference(case):
    args = make(np.random.default_rng(11), **CASES[case])
    got = hs.sparse_attention(*args, 0.3, implementation="ffi")
    close(got, oracle(*args, 0.3), 2e-3)


@pytest.mark.gpu
def test_kernel_is_batch_invariant():
    args = make(np.random.default_rng(12), b=5, k=2048, N=4096, invalid=0.05)
    full = np.asarray(hs.sparse_attention(*args, 0.07, implementation="ffi"))
    for r in (0, 3):
        alone = hs.sparse_attention(*(a[r:r + 1] for a in args), 0.07, implementation="ffi")
        assert np.array_equal(np.asarray(alone)[0], full[r])

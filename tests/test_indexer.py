"""The lightning indexer's scores (hisparse_jax.indexer, contract in ffi/indexer.h).

Ladder: a float64 NumPy oracle -> the XLA reference (any backend) -> the CUDA kernel (tests
marked `gpu`). Scores are float32 sums whose order differs between implementations, so values
are compared within the contract's rounding bound,

  |score - exact| <= (n + H + 4) * 2^-23 * sum_h |w_h| sum_i |q_hi| |key_ti| |scale_t|,

n = d for bfloat16 q and 3d for float32 q (split into three bfloat16 parts on the GPU): a
float32 sum of N terms in any order is within about N * 2^-24 of its exact value relative to the
sum of the terms' magnitudes, 2^-23 allows for tensor cores that truncate, and the products of
bfloat16 and fp8 values are exact in float32. The -inf past lengths[b] is compared exactly.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hisparse_jax as hs
from hisparse_jax import targets

from helpers import check_inside_lax_scan

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)

# Every implementation; "ffi" is the CUDA kernel (there is no CPU handler).
IMPLS = ["reference", pytest.param("ffi", marks=pytest.mark.gpu)]


# --------------------------------------------------------------------------- oracle


def oracle(q, w, keys, lengths, key_scale=None):
    """(scores float64 [b, T] with -inf past lengths, bound [b, T]): the contract in float64."""
    q64, w64, k64 = (np.asarray(x).astype(np.float64) for x in (q, w, keys))
    dots = np.einsum("bhd,btd->bht", q64, k64)
    magnitude = np.einsum("bhd,btd->bht", np.abs(q64), np.abs(k64))
    if key_scale is not None:
        s64 = np.asarray(key_scale).astype(np.float64)[:, None, :]
        dots, magnitude = dots * s64, magnitude * np.abs(s64)
    scores = np.einsum("bht,bh->bt", np.maximum(dots, 0.0), w64)
    magnitude = np.einsum("bht,bh->bt", magnitude, np.abs(w64))
    _, H, d = q64.shape
    n = 3 * d if np.asarray(q).dtype == F32 else d
    bound = (n + H + 4) * 2.0**-23 * magnitude
    T = k64.shape[1]
    past = np.arange(T)[None, :] >= np.asarray(lengths)[:, None]
    return np.where(past, -np.inf, scores), bound


def assert_scores(got, q, w, keys, lengths, key_scale=None):
    want, bound = oracle(q, w, keys, lengths, key_scale)
    got = np.asarray(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    past = np.isneginf(want)
    np.testing.assert_array_equal(np.isneginf(got), past, err_msg="-inf exactly from lengths[b] on")
    err = np.abs(got[~past].astype(np.float64) - want[~past])
    worst = np.argmax(err - bound[~past]) if err.size else 0
    assert np.all(err <= bound[~past]), (
        f"error {err[worst]:.3g} > bound {bound[~past][worst]:.3g} (score {want[~past][worst]:.6g})"
    )


# --------------------------------------------------------------------------- inputs


def make_inputs(rng, b, H, T, d, *, q_dtype=BF16, key_dtype=BF16, lengths=None):
    """Random operands (normal q and keys, mixed-sign weights with 1/sqrt(H d) folded in)."""
    q = rng.standard_normal((b, H, d)).astype(q_dtype)
    w = (rng.standard_normal((b, H)) / np.sqrt(H * d)).astype(F32)
    keys = rng.standard_normal((b, T, d)).astype(np.float32)
    scale = None
    if key_dtype == FP8:
        codes, scale = hs.quantize_keys_fp8(jnp.asarray(keys, jnp.bfloat16))
        keys, scale = np.asarray(codes), np.asarray(scale)
    else:
        keys = keys.astype(key_dtype)
    if lengths is None:
        lengths = rng.integers(0, T + 1, size=b)
    return q, w, keys, np.asarray(lengths, np.int32), scale


def scores_of(impl, q, w, keys, lengths, scale=None):
    fn = jax.jit(lambda *a: hs.index_scores(*a[:4], key_scale=a[4], implementation=impl))
    return fn(q, w, keys, lengths, scale)


# --------------------------------------------------------------------------- the oracle itself


def test_oracle_matches_a_loop():
    """The float64 einsum oracle against the contract written as plain loops."""
    rng = np.random.default_rng(0)
    q, w, keys, lengths, scale = make_inputs(rng, 2, 3, 5, 16, key_dtype=FP8, lengths=[3, 5])
    want, _ = oracle(q, w, keys, lengths, scale)
    for b in range(2):
        for t in range(5):
            if t >= lengths[b]:
                assert want[b, t] == -np.inf
                continue
            total = 0.0
            for h in range(3):
                dot = sum(float(q[b, h, i]) * float(keys[b, t, i]) for i in range(16)) * float(scale[b, t])
                total += float(w[b, h]) * max(dot, 0.0)
            assert want[b, t] == pytest.approx(total, rel=1e-12, abs=1e-300)


# --------------------------------------------------------------------------- values


# (b, H, T, d): T not a multiple of the 16- and 32-token tiles, H not of 8 or 16. The CUDA kernel
# for each (ffi/indexer_cuda.h): register-q for H <= 64 and d <= 128 (d = 128 with its k-steps fixed
# at compile time, other d counted at run time, odd d / 16 loading a last half pair of fp8 keys;
# 8, 16, 32 or 64 heads padded, the padding skipped), general otherwise (two head passes, d > 128).
SHAPES = [
    (1, 1, 1, 16),  # register-q, run-time k-steps, one k-step
    (2, 4, 37, 16),
    (3, 7, 100, 48),  # odd k-steps
    (2, 17, 65, 32),
    (2, 64, 300, 128),  # register-q at the DSA shape: fixed k-steps, no padded head
    (9, 64, 20, 128),  # rows shorter than a block's warps' tiles: each warp's copies run across rows
    (2, 33, 90, 112),  # 64 heads with 31 padded, 7 k-steps
    (3, 64, 47, 64),
    (1, 100, 70, 64),  # general: two head passes
    (2, 128, 33, 128),
    (1, 16, 40, 256),  # general: d > 128
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_H{}_T{}_d{}".format(*s))
def test_scores_match_oracle(impl, key_dtype, shape):
    rng = np.random.default_rng(sum(shape))
    q, w, keys, lengths, scale = make_inputs(rng, *shape, key_dtype=key_dtype)
    assert_scores(scores_of(impl, q, w, keys, lengths, scale), q, w, keys, lengths, scale)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("shape", [(2, 5, 70, 32), (2, 64, 100, 128), (1, 128, 40, 128)],
                         ids=lambda s: "b{}_H{}_T{}_d{}".format(*s))
def test_float32_q(impl, key_dtype, shape):
    rng = np.random.default_rng(7)
    q, w, keys, lengths, scale = make_inputs(rng, *shape, q_dtype=F32, key_dtype=key_dtype)
    assert_scores(scores_of(impl, q, w, keys, lengths, scale), q, w, keys, lengths, scale)


def test_float32_keys_in_the_reference():
    rng = np.random.default_rng(3)
    q, w, keys, lengths, _ = make_inputs(rng, 2, 4, 50, 24, q_dtype=F32, key_dtype=F32)
    assert_scores(scores_of("reference", q, w, keys, lengths), q, w, keys, lengths)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_lengths_corner_cases(impl, key_dtype):
    """0 and negative lengths score nothing; T and beyond score everything; -inf is exact."""
    rng = np.random.default_rng(11)
    T = 70
    lengths = [0, T, -5, T + 100, 1, 31, 32, 33]
    q, w, keys, lengths, scale = make_inputs(rng, len(lengths), 8, T, 32, key_dtype=key_dtype, lengths=lengths)
    got = np.asarray(scores_of(impl, q, w, keys, lengths, scale))
    assert np.all(np.isneginf(got[0])) and np.all(np.isneginf(got[2]))
    assert np.all(np.isfinite(got[1])) and np.all(np.isfinite(got[3]))
    assert_scores(got, q, w, keys, lengths, scale)


@pytest.mark.parametrize("impl", IMPLS)
def test_fp8_subnormal_codes(impl):
    """Keys whose fp8 codes are all subnormal (m * 2^-9), against large q on those dims: a
    kernel that flushed them to zero would score 0."""
    rng = np.random.default_rng(5)
    b, H, T, d = 1, 8, 40, 32
    q = np.full((b, H, d), 64.0, BF16)
    w = np.abs(rng.standard_normal((b, H))).astype(F32)
    mantissa = rng.integers(1, 8, size=(b, T, d))
    keys = (mantissa * 2.0**-9).astype(FP8)
    assert np.all(np.abs(keys.astype(np.float64)) < 2.0**-6), "all codes subnormal"
    scale = np.full((b, T), 3.0, F32)
    lengths = np.array([T], np.int32)
    got = scores_of(impl, q, w, keys, lengths, scale)
    assert np.all(np.asarray(got) > 0)
    assert_scores(got, q, w, keys, lengths, scale)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("magnitude", [2.0**-100, 2.0**-20, 1.0, 2.0**7, 2.0**8, 2.0**40, 2.0**100])
def test_fp8_keys_with_q_of_any_magnitude(impl, magnitude):
    """The CUDA kernel multiplies q by a power of two per row before the tensor cores and the
    row's scores by the inverse: every magnitude (2^7 is the largest left unscaled) keeps q."""
    rng = np.random.default_rng(int(np.log2(magnitude)) + 200)
    q, w, keys, lengths, scale = make_inputs(rng, 2, 16, 64, 32, key_dtype=FP8, lengths=[64, 40])
    q = (q.astype(np.float64) * magnitude).astype(BF16)
    assert_scores(scores_of(impl, q, w, keys, lengths, scale), q, w, keys, lengths, scale)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_nan_propagates(impl, key_dtype):
    """relu(NaN) is NaN (not 0): a NaN in one head's q makes its row's scored tokens NaN."""
    rng = np.random.default_rng(9)
    q, w, keys, lengths, scale = make_inputs(rng, 2, 8, 50, 32, key_dtype=key_dtype, lengths=[40, 50])
    q[0, 3, 5] = np.nan
    got = np.asarray(scores_of(impl, q, w, keys, lengths, scale))
    assert np.all(np.isnan(got[0, :40])) and np.all(np.isneginf(got[0, 40:]))
    assert np.all(np.isfinite(got[1]))


def test_fp8_nan_scale_gives_nan_scores():
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((1, 6, 16)).astype(np.float32)
    keys[0, 2, 3] = np.inf
    keys[0, 4, 0] = np.nan
    codes, scale = hs.quantize_keys_fp8(jnp.asarray(keys))
    q, w, *_ = make_inputs(rng, 1, 4, 6, 16)
    got = np.asarray(scores_of("reference", q, w, codes, np.array([6], np.int32), scale))
    assert np.all(np.isnan(got[0, [2, 4]])) and np.all(np.isfinite(got[0, [0, 1, 3, 5]]))


# --------------------------------------------------------------------------- jit, scan, determinism


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_inside_lax_scan(impl, key_dtype):
    """One call per layer inside a jitted scan, each layer's operands sliced from the carry."""
    rng = np.random.default_rng(13)
    L, b, H, T, d = 3, 2, 8, 45, 32
    layers = [make_inputs(rng, b, H, T, d, key_dtype=key_dtype) for _ in range(L)]

    def op(q, w, keys, lengths, scale):
        return hs.index_scores(q, w, keys, lengths, key_scale=scale, implementation=impl)

    check_inside_lax_scan(op, layers, assert_scores, functools.partial(scores_of, impl) if impl == "ffi" else None)


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_cuda_kernel_is_deterministic(key_dtype):
    """Same inputs, same bits: run to run, and whatever the batch a row is computed in (work
    goes to threads by position only, never through atomics)."""
    rng = np.random.default_rng(17)
    q, w, keys, lengths, scale = make_inputs(rng, 6, 64, 5000, 128, key_dtype=key_dtype)
    first = np.asarray(scores_of("ffi", q, w, keys, lengths, scale)).view(np.uint32)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(scores_of("ffi", q, w, keys, lengths, scale)).view(np.uint32), first)
    pick = lambda x, rows: None if x is None else x[rows]
    alone = scores_of("ffi", *(pick(x, slice(4, 5)) for x in (q, w, keys, lengths, scale)))
    np.testing.assert_array_equal(np.asarray(alone).view(np.uint32)[0], first[4])
    assert_scores(first.view(np.float32), q, w, keys, lengths, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_cuda_kernel_is_batch_invariant_at_a_decode_batch(key_dtype):
    """GLM-5's index heads (H = 32, d = 128) in a decode batch of 17: a row alone gets the bits it
    gets inside the batch. The launch's grid and the warps' tiles depend on the batch (and the
    launch shape on the operands); a request's scores, so its top-k ids, must not depend on which
    requests share its step (ffi/tests/indexer_cuda_check.cu checks every launch shape)."""
    rng = np.random.default_rng(31)
    b, T = 17, 3000
    lengths = [T, T - 1, 17, 0, T // 2, 1, 33, 64, 65] + [T] * (b - 9)
    q, w, keys, lengths, scale = make_inputs(rng, b, 32, T, 128, key_dtype=key_dtype, lengths=lengths)
    batch = np.asarray(scores_of("ffi", q, w, keys, lengths, scale)).view(np.uint32)
    pick = lambda x, rows: None if x is None else x[rows]
    for row in (0, 2, 8, b - 1):
        alone = scores_of("ffi", *(pick(x, slice(row, row + 1)) for x in (q, w, keys, lengths, scale)))
        np.testing.assert_array_equal(np.asarray(alone).view(np.uint32)[0], batch[row], err_msg=f"row {row}")
    assert_scores(batch.view(np.float32), q, w, keys, lengths, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_cuda_kernel_at_the_realistic_shape(key_dtype):
    """H = 64, d = 128 with a long row, lengths inside tiles and at T."""
    rng = np.random.default_rng(19)
    T = 40000
    q, w, keys, lengths, scale = make_inputs(rng, 3, 64, T, 128, key_dtype=key_dtype, lengths=[T, 12345, 31])
    assert_scores(scores_of("ffi", q, w, keys, lengths, scale), q, w, keys, lengths, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("shape", [(5, 64, 3000, 128), (4, 20, 700, 48)], ids=["H64_d128", "H20_d48"])
def test_cuda_kernels_write_the_same_bits(key_dtype, shape):
    """The register-q kernel (H <= 64) against the general one (H = 65): the same operands plus
    heads of zeros with weight 0, each of which adds an exact +0 to its chain. ffi/indexer_cuda.h
    says both kernels run the same tensor-core steps in the same order; this holds them to it."""
    b, H, T, d = shape
    rng = np.random.default_rng(43)
    lengths = [T, T - 1, 17, 0, T // 2][:b]
    q, w, keys, lengths, scale = make_inputs(rng, b, H, T, d, key_dtype=key_dtype, lengths=lengths)
    pad = 65 - H
    q_general = np.concatenate([q, np.zeros((b, pad, d), q.dtype)], axis=1)
    w_general = np.concatenate([w, np.zeros((b, pad), w.dtype)], axis=1)
    register = np.asarray(scores_of("ffi", q, w, keys, lengths, scale))
    general = np.asarray(scores_of("ffi", q_general, w_general, keys, lengths, scale))
    np.testing.assert_array_equal(register.view(np.uint32), general.view(np.uint32))
    assert_scores(register, q, w, keys, lengths, scale)


# --------------------------------------------------------------------------- the compiled program


def _big_arrays(hlo: str, elements: int) -> list[str]:
    """Array shapes in an HLO text with at least `elements` elements."""
    out = []
    for dims in re.findall(r"\b(?:f32|bf16|f16|f64)\[([\d,]+)\]", hlo):
        if np.prod([int(x) for x in dims.split(",")]) >= elements:
            out.append(dims)
    return out


B_, H_, T_, D_ = 3, 24, 1000, 16  # d < H, so keys [b, T, d] are smaller than [b, H, T]


def _compiled(impl, key_dtype=BF16):
    rng = np.random.default_rng(23)
    q, w, keys, lengths, scale = make_inputs(rng, B_, H_, T_, D_, key_dtype=key_dtype)
    fn = jax.jit(lambda *a: hs.index_scores(*a[:4], key_scale=a[4], implementation=impl))
    return fn.lower(q, w, keys, lengths, scale).compile().as_text()


def test_reference_program_has_the_intermediate():
    """The control for the check below: the XLA reference materializes [b, H, T] (on CPU, where
    the fusion decisions are stable; the check itself is text parsing)."""
    if jax.default_backend() != "cpu":
        pytest.skip("CPU backend only")
    hlo = _compiled("reference")
    assert _big_arrays(hlo, B_ * H_ * T_)
    assert targets.INDEX_SCORES not in hlo


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_ffi_program_is_one_custom_call_without_intermediate(key_dtype):
    hlo = _compiled("ffi", key_dtype)
    assert hlo.count(f'custom_call_target="{targets.INDEX_SCORES}"') == 1
    assert not _big_arrays(hlo, B_ * H_ * T_), "no [b, H, T]-sized array"


def test_auto_is_the_reference_on_cpu():
    if jax.default_backend() != "cpu":
        pytest.skip("CPU backend only")
    assert targets.INDEX_SCORES not in _compiled("auto")


@pytest.mark.gpu
def test_auto_is_the_kernel_on_gpu_where_it_applies():
    assert f'custom_call_target="{targets.INDEX_SCORES}"' in _compiled("auto", FP8)
    rng = np.random.default_rng(29)
    q, w, keys, lengths, _ = make_inputs(rng, 2, 4, 50, 24, key_dtype=F32)  # f32 keys, d % 16 != 0
    hlo = jax.jit(lambda *a: hs.index_scores(*a, implementation="auto")).lower(q, w, keys, lengths).compile().as_text()
    assert targets.INDEX_SCORES not in hlo


@pytest.mark.gpu
def test_handler_rejects_bad_operands():
    """A direct ffi_call (no Python checks) gets the handler's own error, naming the operand."""
    q = jnp.zeros((2, 4, 20), jnp.bfloat16)  # d not a multiple of 16
    call = jax.ffi.ffi_call(targets.INDEX_SCORES, jax.ShapeDtypeStruct((2, 8), jnp.float32))
    args = (q, jnp.zeros((2, 4), jnp.float32), jnp.zeros((2, 8, 20), jnp.bfloat16),
            jnp.zeros((0,), jnp.float32), jnp.zeros((2,), jnp.int32))
    with pytest.raises(Exception, match="hisparse_index_scores: q: d must be a multiple of 16"):
        jax.block_until_ready(jax.jit(call)(*args))
    args = (jnp.zeros((2, 4, 16), jnp.bfloat16), args[1], jnp.zeros((2, 8, 16), jnp.bfloat16),
            jnp.zeros((2, 8), jnp.float32), args[4])
    with pytest.raises(Exception, match="key_scale .* must be an empty"):
        jax.block_until_ready(jax.jit(call)(*args))


# --------------------------------------------------------------------------- quantize_keys_fp8


def test_quantize_special_tokens():
    keys = np.zeros((4, 16), np.float32)
    keys[1, 3] = -2.5
    keys[2, 0] = np.inf
    keys[3, 7] = np.nan
    codes, scale = hs.quantize_keys_fp8(jnp.asarray(keys))
    codes, scale = np.asarray(codes).astype(np.float64), np.asarray(scale)
    assert scale[0] == 2.0**-126 and np.all(codes[0] == 0), "a zero token: codes 0, the smallest normal scale"
    assert scale[1] == pytest.approx(2.5 / 448, rel=2.0**-23)
    assert codes[1, 3] == -448 and np.count_nonzero(codes[1]) == 1
    assert np.isnan(scale[2]) and np.isnan(scale[3]), "non-finite tokens get a NaN scale"


# --------------------------------------------------------------------------- errors


def _good():
    rng = np.random.default_rng(37)
    q, w, keys, lengths, _ = make_inputs(rng, 2, 4, 10, 16)
    return dict(q=q, weights=w, keys=keys, lengths=lengths)


def _fp8():
    rng = np.random.default_rng(41)
    q, w, keys, lengths, scale = make_inputs(rng, 2, 4, 10, 16, key_dtype=FP8)
    return dict(q=q, weights=w, keys=keys, lengths=lengths, key_scale=scale)


BAD = {
    "q_dtype": (dict(q=np.zeros((2, 4, 16), np.float16)), TypeError, "q must be bfloat16 or float32"),
    "q_rank": (dict(q=np.zeros((2, 16), BF16)), ValueError, r"q has shape \(2, 16\); it must be \[b, H, d\]"),
    "weights_dtype": (dict(weights=np.zeros((2, 4), BF16)), TypeError, "weights must be float32"),
    "weights_shape": (dict(weights=np.zeros((2, 5), F32)), ValueError, r"weights has shape \(2, 5\)"),
    "keys_dtype": (dict(keys=np.zeros((2, 10, 16), np.int8)), TypeError, "keys must be bfloat16, float8_e4m3fn"),
    "keys_d": (dict(keys=np.zeros((2, 10, 32), BF16)), ValueError, r"keys has shape \(2, 10, 32\)"),
    "keys_b": (dict(keys=np.zeros((3, 10, 16), BF16)), ValueError, r"keys has shape \(3, 10, 16\)"),
    "scale_without_fp8": (dict(key_scale=np.ones((2, 10), F32)), ValueError, "key_scale is only for float8_e4m3fn"),
    "fp8_without_scale": (dict(keys=np.zeros((2, 10, 16), FP8)), ValueError, "float8_e4m3fn keys need key_scale"),
    "lengths_dtype": (dict(lengths=np.zeros(2, np.int64)), TypeError, "lengths must be int32"),
    "lengths_shape": (dict(lengths=np.zeros((2, 1), np.int32)), ValueError, r"lengths has shape \(2, 1\)"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_errors_name_the_argument(case):
    change, exc, message = BAD[case]
    with pytest.raises(exc, match=f"^index_scores: {message}"):
        hs.index_scores(**{**_good(), **change}, implementation="reference")


@pytest.mark.parametrize(
    "change, exc, message",
    [
        (dict(key_scale=np.ones((2, 10), np.float16)), TypeError, "key_scale must be float32"),
        (dict(key_scale=np.ones((2, 11), F32)), ValueError, r"key_scale has shape \(2, 11\)"),
    ],
)
def test_fp8_scale_errors(change, exc, message):
    with pytest.raises(exc, match=f"^index_scores: {message}"):
        hs.index_scores(**{**_fp8(), **change}, implementation="reference")


def test_unknown_implementation():
    with pytest.raises(ValueError, match="implementation must be"):
        hs.index_scores(**_good(), implementation="cuda")


def test_ffi_off_cuda_is_an_error():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU 'ffi' is the kernel")
    with pytest.raises(RuntimeError, match="CUDA kernel.*pass implementation='reference'"):
        hs.index_scores(**_good(), implementation="ffi")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(keys=np.zeros((2, 10, 16), F32)), "float32 keys run only in the reference"),
        (dict(q=np.zeros((2, 4, 24), BF16), keys=np.zeros((2, 10, 24), BF16)), "d = 24"),
        (dict(q=np.zeros((2, 129, 16), BF16), weights=np.zeros((2, 129), F32)), "H = 129"),
        (dict(q=np.zeros((2, 128, 256), F32), weights=np.zeros((2, 128), F32),
              keys=np.zeros((2, 10, 256), BF16)), r"H \* d <= 16384"),
    ],
)
def test_kernel_domain_errors(change, message):
    with pytest.raises(ValueError, match=f"^index_scores: .*{message}"):
        hs.index_scores(**{**_good(), **change}, implementation="ffi")

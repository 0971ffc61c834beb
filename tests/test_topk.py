"""TOP-K selection (select_topk): a NumPy oracle with the order of XLA's TopK comparator, the
XLA reference against it, the FFI handler (C++ on CPU, CUDA on GPU) against both with zero
tolerance. Named corner cases, seeded bulk runs over the shapes of every launch path,
hypothesis over ragged sealed lengths, ties, special floats, k from 1 to R and stream shapes;
jit and lax.scan; the compiled program; every error."""

from __future__ import annotations

import re
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_jax as hs
from hisparse_jax import targets
from hisparse_jax.topk import select_topk_reference, workspace_words
from helpers import IMPLEMENTATIONS, examples

needs_ffi = pytest.mark.skipif("ffi" not in IMPLEMENTATIONS, reason="no FFI handler for this backend")

# --------------------------------------------------------------------------- the oracle


def comparator_key(x: np.ndarray) -> np.ndarray:
    """int64 keys whose order is that of XLA's TopK comparator on float32: the bits as int32,
    negatives with their magnitude bits flipped (x ^ INT32_MAX), compared as signed ints."""
    bits = np.ascontiguousarray(x, np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def widened_float32(scores) -> np.ndarray:
    """float32 of float16 / bfloat16 scores by their bits, in NumPy (as select_topk widens them:
    NaN payloads and signalling NaNs kept; NumPy's own astype may quiet them)."""
    x = np.asarray(scores)
    if x.dtype == ml_dtypes.bfloat16:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if x.dtype == np.float16:
        h = x.view(np.uint16).astype(np.uint32)
        sign, exponent, mantissa = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
        normal = ((exponent + 112) << 23) | (mantissa << 13)
        special = (0xFF << 23) | (mantissa << 13)
        tiny = (mantissa.astype(np.float32) * np.float32(2.0**-24)).view(np.uint32)
        return (sign | np.where(exponent == 0x1F, special, np.where(exponent == 0, tiny, normal))).astype(
            np.uint32).view(np.float32)
    return x.astype(np.float32)


def oracle_topk(scores, sealed, k: int) -> np.ndarray:
    """select_topk by its definition, one stream at a time: unsealed ids score -inf, a stable
    descending sort (np.lexsort: key descending, then id ascending) taken k deep, the sealed
    ids among them ascending, then -1."""
    scores = widened_float32(scores)
    *streams, R = scores.shape
    rows, limits = scores.reshape(-1, R), np.asarray(sealed).reshape(-1)
    out = np.full((rows.shape[0], k), -1, np.int32)
    ids = np.arange(R)
    for s in range(rows.shape[0]):
        n = min(max(int(limits[s]), 0), R)
        masked = np.where(ids < n, rows[s], np.float32(-np.inf))
        top = np.lexsort((ids, -comparator_key(masked)))[:k]
        chosen = np.sort(top[top < n])
        out[s, : len(chosen)] = chosen
    return out.reshape(*streams, k)


def assert_identical(got, want, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        bad = np.argwhere((got != want).reshape(-1, got.shape[-1]).any(-1)) if got.shape == want.shape else []
        np.testing.assert_array_equal(got, want, err_msg=f"{what}: streams {list(bad)[:8]} differ", strict=True)


# select_topk under one jit: a compiled program per (shapes, k, implementation). Called eagerly,
# JAX compiles each of the reference's ops on its own for every new shape, ~5x the time of one
# program; the hypothesis tests draw a new shape almost every example, so they call this (the
# same ops, integer keys: the same ids). The eager path is the named, bulk and 16-bit tests'.
jitted_topk = jax.jit(hs.select_topk, static_argnames=("k", "implementation"))


def check_all(scores, sealed, k: int, what: str = "", reference: bool = True, select=hs.select_topk) -> np.ndarray:
    """Oracle, then every implementation on this backend against it (and the FFI against the
    reference) with zero tolerance. reference=False leaves the reference out (see
    reference_follows_total_order); `select` is select_topk or jitted_topk."""
    want = oracle_topk(scores, sealed, k)
    got = {}
    for implementation in IMPLEMENTATIONS:
        if implementation == "reference" and not reference:
            continue
        got[implementation] = np.asarray(select(scores, sealed, k=k, implementation=implementation))
        assert_identical(got[implementation], want, f"{implementation} vs oracle {what}")
    if "ffi" in got and "reference" in got:
        assert_identical(got["ffi"], got["reference"], f"ffi vs reference {what}")
    return want


def reference_follows_total_order(R: int, k: int, stream_rank: int) -> bool:
    """Always, now: the reference ranks integer keys, so XLA:GPU's small-k kernel (k <= 16 over
    [R] or [b, R] with R >= 1024, which compares floats with IEEE `>`) no longer sees a float."""
    return True


# --------------------------------------------------------------------------- scores


def f32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


QNAN, NEG_QNAN = f32(0x7FC00000), f32(0xFFC00000)
SPECIALS = np.array(
    [
        np.inf, -np.inf, 0.0, -0.0, QNAN, NEG_QNAN,
        f32(0x7FC00001), f32(0xFFC00001),  # NaN payloads: +NaN ranks by payload up, -NaN down
        f32(0x7F800001), f32(0xFF800001),  # signalling NaNs
        f32(0x00000001), f32(0x80000001),  # subnormals
        np.finfo(np.float32).max, -np.finfo(np.float32).max, 1.0, -1.0,
    ],
    np.float32,
)
KINDS = ("normal", "quantized", "equal", "special", "raw_bits", "uniform_1_2")


def random_scores(rng: np.random.Generator, shape, kind: str) -> np.ndarray:
    """float32 scores of a kind: normal; quantized (a handful of distinct values: many ties);
    equal (one value); special (normals mixed with every special value); raw_bits (uniform
    random bit patterns: NaNs of every payload, infs, subnormals); uniform_1_2 (one exponent:
    the top digit of every key is the same)."""
    if kind == "normal":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "quantized":
        return rng.integers(-3, 4, size=shape).astype(np.float32) * np.float32(0.5)
    if kind == "equal":
        return np.full(shape, rng.choice([0.0, -0.0, 1.5, -np.inf, np.inf]), np.float32)
    if kind == "special":
        x = rng.standard_normal(shape).astype(np.float32)
        pick = rng.random(shape) < 0.4
        x[pick] = rng.choice(SPECIALS, size=int(pick.sum()))
        return x
    if kind == "raw_bits":
        return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if kind == "uniform_1_2":
        return rng.uniform(1.0, 2.0, size=shape).astype(np.float32)
    raise ValueError(kind)


def random_sealed(rng: np.random.Generator, streams, R: int, k: int) -> np.ndarray:
    """Ragged sealed lengths: 0, 1, < k, k, > k, R, negative, beyond R, anything."""
    choices = [0, 1, max(k - 1, 0), k, min(k + 1, R), R, -3, R + 5, int(rng.integers(0, R + 1))]
    return rng.choice(choices, size=streams).astype(np.int32)


# --------------------------------------------------------------------------- the oracle itself


def test_comparator_key_is_ieee_total_order():
    """The oracle's key orders -NaN < -inf < -max < -1 < -subnormal < -0 < +0 < subnormal < 1
    < max < inf < NaN, and NaNs by payload (larger payload further out)."""
    ascending = np.array(
        [
            f32(0xFFC00001), NEG_QNAN, f32(0xFF800001), -np.inf, -np.finfo(np.float32).max, -1.0,
            f32(0x80000001), -0.0, 0.0, f32(0x00000001), 1.0, np.finfo(np.float32).max, np.inf,
            f32(0x7F800001), QNAN, f32(0x7FC00001),
        ],
        np.float32,
    )
    keys = comparator_key(ascending)
    assert (np.diff(keys) > 0).all(), keys


# Hand-computed selections: (scores, sealed, k, expected); the stream dims are () here.
NAMED = {
    "ties_to_lower_id": ([1, 2, 2, 2, 0], 5, 2, [1, 2]),
    "output_ascending": ([0, 9, 1, 8, 2, 7], 6, 3, [1, 3, 5]),
    "fewer_sealed_than_k": ([5, 4, 3, 2], 2, 3, [0, 1, -1]),
    "nothing_sealed": ([5, 4, 3], 0, 2, [-1, -1]),
    "negative_sealed": ([5, 4, 3], -7, 2, [-1, -1]),
    "sealed_beyond_R": ([1, 3, 2], 99, 2, [1, 2]),
    "k_equals_R": ([3, 1, 2], 3, 3, [0, 1, 2]),
    "sealed_minus_inf_before_unsealed": ([-np.inf, -np.inf, 7, 7], 2, 3, [0, 1, -1]),
    "neg_nan_below_unsealed_minus_inf": ([NEG_QNAN, 1, 5, 5], 2, 3, [1, -1, -1]),
    "neg_nan_taken_when_nothing_lower": ([NEG_QNAN, NEG_QNAN, 1], 3, 3, [0, 1, 2]),
    "nan_above_inf": ([np.inf, QNAN, 1], 3, 1, [1]),
    "plus_zero_above_minus_zero": ([-0.0, 0.0, -0.0], 3, 1, [1]),
    "nan_payload_up": ([QNAN, f32(0x7FC00001)], 2, 1, [1]),
    "neg_nan_payload_down": ([f32(0xFFC00001), NEG_QNAN], 2, 1, [1]),
    "all_equal_takes_lowest": ([4, 4, 4, 4, 4], 5, 2, [0, 1]),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_cases(name):
    scores, sealed, k, expected = NAMED[name]
    scores = np.array(scores, np.float32)
    sealed = np.int32(sealed)
    want = check_all(scores, sealed, k, name)
    assert want.tolist() == expected, f"oracle {want.tolist()} != hand-computed {expected}"


# --------------------------------------------------------------------------- seeded bulk runs

# Stream shapes, R and k of the CUDA launch plans (ffi/topk_cuda.h): the resident kernel with
# clusters of 16, 8, 4 and 1 blocks per row (few rows), one block per row in two waves (many
# rows), four per row in waves (many long rows), the streaming kernel (rows too long to stay
# resident), R not a multiple of 4 (scalar loads) or of 128.
BULK = {
    "tiny_R": ((3,), 5, 2),
    "R_not_multiple_of_4": ((2, 3), 1001, 40),
    "scalar_stream": ((), 777, 100),
    "cluster4_R16K": ((3,), 16384, 2048),
    "cluster8_R32K": ((2,), 32768, 2048),
    "cluster16_R128K": ((1,), 131072, 2048),
    "many_rows_R32K": ((140,), 32768, 2048),
    "waves_R128K": ((40,), 131072, 2048),
    "streaming_R600K": ((2,), 600000, 2048),
    "k_equals_R": ((2, 2), 2048, 2048),
    "k1_large_R": ((2,), 40000, 1),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(BULK))
def test_bulk(case, kind):
    streams, R, k = BULK[case]
    rng = np.random.default_rng(zlib.crc32(f"{case}/{kind}".encode()))
    scores = random_scores(rng, (*streams, R), kind)
    sealed = random_sealed(rng, streams, R, k)
    check_all(scores, sealed, k, f"{case}/{kind} sealed {sealed.ravel()[:8].tolist()}",
              reference=reference_follows_total_order(R, k, len(streams)))


@pytest.mark.parametrize("kind", ["normal", "quantized"])
@pytest.mark.parametrize("rows,R", [(17, 131072), (41, 32768)], ids=["17x131072", "41x32768"])
def test_a_row_alone_gets_the_ids_it_gets_in_a_batch(rows, R, kind):
    """Batch invariance at the slices' decode batches (17 requests at 128K, 41 at 32K): a request's
    ids do not depend on which requests share its step. On a GPU the launch plan does (clusters
    of 6 and 2 blocks a row in these batches, 16 and 8 for a row alone); ties (quantized scores)
    must still go to the lowest ids in both."""
    rng = np.random.default_rng(zlib.crc32(f"alone/{rows}/{R}/{kind}".encode()))
    scores = random_scores(rng, (rows, R), kind)
    sealed = np.full((rows,), R, np.int32)
    sealed[1], sealed[2] = R // 2, 1000  # shorter requests in the same step
    k = 2048
    for implementation in IMPLEMENTATIONS:
        batch = np.asarray(hs.select_topk(scores, sealed, k=k, implementation=implementation))
        for row in (0, 1, 2, rows - 1):
            alone = np.asarray(hs.select_topk(scores[row:row + 1], sealed[row:row + 1], k=k,
                                              implementation=implementation))
            assert_identical(alone[0], batch[row], f"{implementation}: row {row} alone vs in a batch of {rows}")
        assert_identical(batch[:3], oracle_topk(scores[:3], sealed[:3], k), f"{implementation} vs oracle")


@needs_ffi
@pytest.mark.parametrize("kind", ["special", "raw_bits"])
def test_ffi_total_order_at_small_k_over_long_rows(kind):
    """The FFI keeps the total order where XLA:GPU's small-k kernel does not (k <= 16, R >= 1024)."""
    rng = np.random.default_rng(11)
    scores = random_scores(rng, (4, 4096), kind)
    sealed = np.array([4096, 3000, 17, 0], np.int32)
    for k in (1, 5, 16):
        want = oracle_topk(scores, sealed, k)
        assert_identical(hs.select_topk(scores, sealed, k, implementation="ffi"), want, f"k={k}")


def test_bfloat16_scores():
    """bf16 scores are widened to f32 (exactly, signalling NaNs too) by both implementations."""
    rng = np.random.default_rng(12)
    x = random_scores(rng, (3, 500), "special")
    scores = (x.view(np.uint32) >> 16).astype(np.uint16).view(ml_dtypes.bfloat16)  # NumPy would quiet sNaNs
    check_all(jnp.asarray(scores), np.array([500, 200, 3], np.int32), 64, "bf16")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("eager_numpy", [True, False])
def test_every_16_bit_pattern(dtype, eager_numpy):
    """All 65536 bit patterns of a 16-bit float (signalling and quiet NaNs of every payload,
    subnormals, both zeros, infinities), shuffled over rows, as NumPy arrays and as jax arrays:
    the same ids from the oracle and every implementation (the C++ or CUDA handler, the
    reference), at k from 1 to whole rows."""
    rng = np.random.default_rng(13)
    bits = rng.permutation(np.arange(2**16, dtype=np.uint32)).astype(np.uint16)
    scores = bits.view(dtype).reshape(16, 4096)
    sealed = np.array([4096, 4096, 4000, 2048, 17, 0, -1, 5000] * 2, np.int32)
    for k in (1, 16, 300, 4096):
        check_all(scores if eager_numpy else jnp.asarray(scores), sealed, k, f"{np.dtype(dtype).name} k={k}")


# --------------------------------------------------------------------------- hypothesis

STREAM_SHAPES = [(), (1,), (3,), (2, 3), (2, 1, 2)]


@st.composite
def problems(draw):
    streams = draw(st.sampled_from(STREAM_SHAPES))
    R = draw(st.integers(1, 300))
    k = draw(st.sampled_from(["one", "small", "R", "any"]))
    k = {"one": 1, "small": min(R, 3), "R": R, "any": draw(st.integers(1, R))}[k]
    n = int(np.prod(streams, dtype=np.int64))
    lengths = st.one_of(
        st.sampled_from([0, 1, max(k - 1, 0), k, min(k + 1, R), R, -1, R + 1]), st.integers(-2, R + 2)
    )
    sealed = np.array(draw(st.lists(lengths, min_size=n, max_size=n)), np.int32).reshape(streams)
    kind = draw(st.sampled_from(KINDS))
    seed = draw(st.integers(0, 2**32 - 1))
    scores = random_scores(np.random.default_rng(seed), (*streams, R), kind)
    return scores, sealed, k


@settings(max_examples=examples(150))
@given(problem=problems())
def test_hypothesis(problem):
    scores, sealed, k = problem
    check_all(scores, sealed, k, f"k={k} sealed={sealed.tolist()}", select=jitted_topk)


@settings(max_examples=examples(100))
@given(
    values=st.lists(st.sampled_from(list(SPECIALS) + [2.0, 2.0, -2.0]), min_size=1, max_size=24),
    data=st.data(),
)
def test_hypothesis_explicit_values(values, data):
    """hypothesis writes every score itself, so a failure shrinks to a minimal row."""
    scores = np.array(values, np.float32)
    R = scores.shape[0]
    k = data.draw(st.integers(1, R), label="k")
    sealed = np.int32(data.draw(st.integers(-1, R + 1), label="sealed"))
    check_all(scores, sealed, k, select=jitted_topk)


# --------------------------------------------------------------------------- jit and scan


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_jit_inside_scan(implementation):
    """A jitted lax.scan over decode steps, two stream dims, sealed growing each step."""
    T, streams, R, k = 5, (2, 3), 257, 16
    rng = np.random.default_rng(13)
    scores = np.stack([random_scores(rng, (*streams, R), kind) for kind in ("normal", "quantized", "special", "equal", "raw_bits")])
    sealed = (rng.integers(0, R, size=streams)[None] + 40 * np.arange(T)[:, None, None]).astype(np.int32)

    @jax.jit
    def run(scores, sealed):
        def step(count, xs):
            ids = hs.select_topk(xs[0], xs[1], k, implementation=implementation)
            return count + jnp.sum(ids >= 0), ids

        return jax.lax.scan(step, jnp.int32(0), (scores, sealed))

    count, ids = run(scores, sealed)
    want = np.stack([oracle_topk(scores[t], sealed[t], k) for t in range(T)])
    assert_identical(ids, want, f"{implementation} in scan")
    assert int(count) == int((want >= 0).sum())


# --------------------------------------------------------------------------- the compiled program


def compiled_text(implementation: str, scores, sealed, k: int) -> str:
    fn = jax.jit(lambda s, n: hs.select_topk(s, n, k, implementation=implementation))
    return fn.lower(scores, sealed).compile().as_text()


@needs_ffi
def test_ffi_program_has_the_custom_call_and_no_sort():
    scores, sealed = jnp.zeros((4, 2, 1024), jnp.float32), jnp.zeros((4, 2), jnp.int32)
    text = compiled_text("ffi", scores, sealed, 64)
    assert text.count(f'custom_call_target="{targets.TOPK}"') == 1
    assert not re.search(r"\bsort\(", text), "the FFI path must not sort"
    assert 'custom_call_target="TopK"' not in text and "__gpu$TopK" not in text
    # The reference does sort (lax.top_k plus the ascending sort), so the check can see one.
    assert re.search(r"\bsort\(", compiled_text("reference", scores, sealed, 64))


def test_auto_picks_the_handler_when_registered():
    scores, sealed = jnp.zeros((2, 300), jnp.float32), jnp.zeros((2,), jnp.int32)
    text = compiled_text("auto", scores, sealed, 8)
    assert (f'custom_call_target="{targets.TOPK}"' in text) == hs.has_ffi()


@needs_ffi
def test_workspace_words_match_the_handler():
    """The scratch output's size is the handler's formula (TopkWorkspaceWords): any R works,
    a wrong size is refused."""
    for R in (1, 127, 128, 129, 1000):
        assert workspace_words(R) == 8 * ((R + 127) // 128)
        hs.select_topk(jnp.zeros((2, R)), jnp.full((2,), R, jnp.int32), 1, implementation="ffi")


# --------------------------------------------------------------------------- errors


def _scores(shape=(2, 10), dtype=jnp.float32):
    return jnp.zeros(shape, dtype)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "scores, sealed, k, error, message",
    [
        pytest.param(_scores(), jnp.zeros(2, jnp.int32), 0, ValueError,
                     r"select_topk: k=0 must lie in \[1, R=10\]", id="k_zero"),
        pytest.param(_scores(), jnp.zeros(2, jnp.int32), 11, ValueError,
                     r"select_topk: k=11 must lie in \[1, R=10\]", id="k_above_R"),
        pytest.param(_scores(), jnp.zeros(2, jnp.int32), 2.0, TypeError,
                     r"select_topk: k must be a Python int", id="k_float"),
        pytest.param(_scores(), jnp.zeros(2, jnp.int32), True, TypeError,
                     r"select_topk: k must be a Python int", id="k_bool"),
        pytest.param(_scores(), jnp.zeros(2, jnp.int32), jnp.int32(3), TypeError,
                     r"select_topk: k must be a Python int", id="k_traced"),
        pytest.param(_scores(dtype=jnp.int32), jnp.zeros(2, jnp.int32), 2, TypeError,
                     r"select_topk: scores must be a float array, got int32", id="scores_int"),
        pytest.param(jnp.float32(1), jnp.int32(1), 1, ValueError,
                     r"select_topk: scores must be \[\*streams, R\], got a scalar", id="scores_scalar"),
        pytest.param(_scores(), jnp.zeros(2, jnp.float32), 2, TypeError,
                     r"select_topk: sealed must be int32, got float32", id="sealed_dtype"),
        pytest.param(_scores(), jnp.zeros(3, jnp.int32), 2, ValueError,
                     r"select_topk: sealed has shape \(3,\), expected the stream shape \(2,\)", id="sealed_shape"),
        pytest.param(_scores((2, 3, 10)), jnp.zeros(2, jnp.int32), 2, ValueError,
                     r"select_topk: sealed has shape \(2,\), expected the stream shape \(2, 3\)", id="sealed_rank"),
    ],
)
def test_errors(implementation, scores, sealed, k, error, message):
    with pytest.raises(error, match=message):
        hs.select_topk(scores, sealed, k, implementation=implementation)
    with pytest.raises(error, match=message):  # at trace time under jit too
        jax.jit(lambda s, n: hs.select_topk(s, n, k, implementation=implementation))(scores, sealed)


def test_implementation_error():
    with pytest.raises(ValueError, match="implementation must be 'auto', 'ffi' or 'reference'"):
        hs.select_topk(_scores(), jnp.zeros(2, jnp.int32), 2, implementation="sort")


def _direct_topk(scores, sealed, k, out_k=None, words=None):
    """The TOP-K target called without the Python checks, as a careless caller would."""
    streams, R = scores.shape[:-1], scores.shape[-1]
    call = jax.ffi.ffi_call(
        targets.TOPK,
        (
            jax.ShapeDtypeStruct((*streams, k if out_k is None else out_k), jnp.int32),
            jax.ShapeDtypeStruct((*streams, workspace_words(R) if words is None else words), jnp.uint32),
        ),
    )
    return jax.block_until_ready(call(scores, sealed, k=np.int64(k)))


@needs_ffi
@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(dict(scores=_scores(dtype=jnp.bfloat16)), r"hisparse_topk: scores must be float32", id="scores_dtype"),
        pytest.param(dict(sealed=jnp.zeros(2, jnp.float32)), r"hisparse_topk: sealed must be int32", id="sealed_dtype"),
        pytest.param(dict(sealed=jnp.zeros(3, jnp.int32)), r"hisparse_topk: sealed \[3\] must have the stream dims", id="sealed_dims"),
        pytest.param(dict(k=11), r"hisparse_topk: k = 11 must lie in \[0, R = 10\]", id="k_above_R"),
        pytest.param(dict(k=-1, out_k=0), r"hisparse_topk: k = -1 must lie in \[0, R = 10\]", id="k_negative"),
        pytest.param(dict(out_k=4), r"hisparse_topk: selected \[2, 4\] must be \[\*streams, k\] with k = 3", id="selected_dims"),
        pytest.param(dict(words=1), r"hisparse_topk: workspace \[2, 1\] must be \[\*streams, 8\]", id="workspace_dims"),
    ],
)
def test_handler_refuses_malformed_operands(args, message):
    call = dict(scores=_scores(), sealed=jnp.zeros(2, jnp.int32), k=3) | args
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        _direct_topk(**call)


@needs_ffi
def test_handler_k_zero_selects_nothing():
    """k = 0 is defined by the contract (an empty selection) even though select_topk refuses it."""
    selected, _ = _direct_topk(_scores(), jnp.full((2,), 10, jnp.int32), 0)
    assert selected.shape == (2, 0)


def test_reference_is_exported_for_the_models():
    """select_topk_reference is the XLA body the models used before the FFI op existed."""
    scores = random_scores(np.random.default_rng(14), (3, 50), "quantized")
    sealed = np.array([50, 20, 0], np.int32)
    assert_identical(select_topk_reference(jnp.asarray(scores), jnp.asarray(sealed), 7), oracle_topk(scores, sealed, 7), "reference")

"""The MoE grouped matmul (hisparse_jax.grouped_matmul, contract in ffi/grouped_matmul.h).

Ladder: a float64 NumPy oracle -> the XLA reference (any backend) -> the CUDA kernel (tests
marked `gpu`). Outputs are float32 sums whose order differs between implementations, so values
are compared within the contract's rounding bound,

  |y - exact| <= (K + 4) * 2^-23 * |scale[e, n]| * sum_k |x[m, k] w[e, n, k]|,

(a float32 sum of K terms in any order is within about K * 2^-24 of its exact value relative to
the sum of the terms' magnitudes; 2^-23 allows for tensor cores that truncate; products of
bfloat16 and fp8 values are exact in float32). Rows past the last group are +0 exactly, and a
sum of one non-zero product is exact, so those are compared bit for bit.
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
from hisparse_jax.grouped_matmul import clamped_group_sizes

from helpers import check_inside_lax_scan

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)

# Every implementation; "ffi" is the CUDA kernel (there is no CPU handler).
IMPLS = ["reference", pytest.param("ffi", marks=pytest.mark.gpu)]
# (x dtype, w dtype) pairs the kernel takes; the reference takes float32 too (the CPU cases).
KERNEL_DTYPES = [(BF16, BF16), (BF16, FP8)]
DTYPE_IDS = {(BF16, BF16): "bf16", (BF16, FP8): "fp8", (F32, F32): "f32", (F32, FP8): "f32x_fp8"}


# --------------------------------------------------------------------------- oracle


def clamped_sizes_oracle(group_sizes, rows: int) -> list[int]:
    """ffi/grouped_matmul.h's group layout, as a loop over Python integers (no overflow)."""
    out, start = [], 0
    for size in np.asarray(group_sizes).tolist():
        take = min(max(size, 0), rows - start)
        out.append(take)
        start += take
    return out


def oracle(x, w, group_sizes, scale=None):
    """(y float64 [M, N], bound [M, N]): the contract in float64; rows past the groups are 0."""
    x64 = np.asarray(x).astype(np.float64)
    M, N = x64.shape[0], np.shape(w)[1]
    K = x64.shape[1]
    y = np.zeros((M, N))
    magnitude = np.zeros((M, N))
    start = 0
    for e, size in enumerate(clamped_sizes_oracle(group_sizes, M)):
        if size == 0:
            continue
        rows = slice(start, start + size)
        w64 = np.asarray(w[e]).astype(np.float64)
        s64 = np.ones(N) if scale is None else np.asarray(scale[e]).astype(np.float64)
        y[rows] = (x64[rows] @ w64.T) * s64
        magnitude[rows] = (np.abs(x64[rows]) @ np.abs(w64).T) * np.abs(s64)
        start += size
    return y, (K + 4) * 2.0**-23 * magnitude, start


def assert_matches(got, x, w, group_sizes, scale=None):
    want, bound, covered = oracle(x, w, group_sizes, scale)
    got = np.asarray(got)
    assert got.dtype == F32 and got.shape == want.shape
    np.testing.assert_array_equal(got[covered:].view(np.uint32), 0, err_msg="rows past the groups are +0")
    err = np.abs(got[:covered].astype(np.float64) - want[:covered])
    if err.size:
        worst = np.unravel_index(np.argmax(err - bound[:covered]), err.shape)
        assert np.all(err <= bound[:covered]), (
            f"error {err[worst]:.3g} > bound {bound[:covered][worst]:.3g} at {worst} (y {want[:covered][worst]:.6g})"
        )


# --------------------------------------------------------------------------- inputs


def routed_sizes(rng, rows: int, experts: int) -> np.ndarray:
    """Exact bincounts of `rows` tokens routed uniformly at random (what the MoE layer passes)."""
    return np.bincount(rng.integers(0, experts, size=rows), minlength=experts).astype(np.int32)


def make_inputs(rng, M, E, N, K, *, x_dtype=BF16, w_dtype=BF16, sizes=None, scaled=True):
    """Random operands: normal x, weights of unit-ish outputs, a scale per channel (fp8: from
    quantize_weights_fp8; else random positive, or None with scaled=False)."""
    x = rng.standard_normal((M, K)).astype(x_dtype)
    w = (rng.standard_normal((E, N, K)) / np.sqrt(K)).astype(np.float32)
    if w_dtype == FP8:
        codes, scale = hs.quantize_weights_fp8(jnp.asarray(w))
        w, scale = np.asarray(codes), np.asarray(scale)
    else:
        w = w.astype(w_dtype)
        scale = rng.uniform(0.5, 2.0, size=(E, N)).astype(F32) if scaled else None
    if sizes is None:
        sizes = routed_sizes(rng, M, E)
    return x, w, np.asarray(sizes, np.int32), scale


@functools.lru_cache(maxsize=None)
def _jitted(impl):
    return jax.jit(functools.partial(hs.grouped_matmul, implementation=impl))


def matmul_of(impl, x, w, sizes, scale=None):
    return _jitted(impl)(x, w, sizes, scale)


def check(impl, x, w, sizes, scale=None):
    got = matmul_of(impl, x, w, sizes, scale)
    assert_matches(got, x, w, sizes, scale)
    return np.asarray(got)


# --------------------------------------------------------------------------- the oracle itself


def test_oracle_matches_a_loop():
    """The float64 oracle against the contract written as plain loops, malformed sizes included."""
    rng = np.random.default_rng(0)
    M, E, N, K = 9, 4, 3, 5
    x, w, _, scale = make_inputs(rng, M, E, N, K, x_dtype=F32, w_dtype=F32)
    for sizes in ([2, 0, 4, 3], [-3, 5, 7, 1], [0, 0, 0, 0], [1, 1, 1, 1]):
        want, _, covered = oracle(x, w, sizes, scale)
        offsets = np.concatenate([[0], np.cumsum(np.maximum(sizes, 0))])
        for m in range(M):
            e = next((e for e in range(E) if offsets[e] <= m < offsets[e + 1]), None)
            for n in range(N):
                exact = 0.0
                if e is not None:
                    exact = sum(float(x[m, k]) * float(w[e, n, k]) for k in range(K)) * float(scale[e, n])
                assert want[m, n] == pytest.approx(exact, rel=1e-12, abs=1e-300)
        assert covered == min(M, int(np.maximum(sizes, 0).sum()))


@pytest.mark.parametrize(
    "sizes, rows, want",
    [
        ([2, 0, 3], 10, [2, 0, 3]),  # below M: kept
        ([4, 6], 10, [4, 6]),  # exactly M
        ([-1, 3, -7, 2], 10, [0, 3, 0, 2]),  # negative: 0
        ([6, 6, 6], 10, [6, 4, 0]),  # past M: cut at M
        ([2**31 - 1, 2**31 - 1, 5], 10, [10, 0, 0]),  # a plain int32 sum would overflow
        ([0, 0], 0, [0, 0]),
    ],
)
def test_clamped_group_sizes(sizes, rows, want):
    assert clamped_sizes_oracle(sizes, rows) == want
    got = jax.jit(clamped_group_sizes, static_argnums=1)(jnp.asarray(sizes, jnp.int32), rows)
    np.testing.assert_array_equal(np.asarray(got), want)


# --------------------------------------------------------------------------- values


# (M, E, N, K): N not a multiple of the 16-row weight tile or of the kernel's 128-row blocks,
# K with a partial last 64-byte chunk (bf16 K % 32, fp8 K % 64), experts with more rows than one
# pass of the kernel holds.
SHAPES = [
    (1, 1, 16, 64),
    (5, 3, 24, 48),
    (37, 4, 130, 96),
    (64, 8, 40, 208),
    (200, 2, 72, 128),  # ~100 rows per expert: more than one pass
    (33, 16, 8, 64),  # most experts with 0-3 rows
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{}_E{}_N{}_K{}".format(*s))
def test_matches_oracle(impl, dtypes, shape):
    rng = np.random.default_rng(sum(shape))
    x, w, sizes, scale = make_inputs(rng, *shape, x_dtype=dtypes[0], w_dtype=dtypes[1])
    check(impl, x, w, sizes, scale)


@pytest.mark.parametrize("dtypes", [(F32, F32), (F32, FP8)], ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "M{}_E{}_N{}_K{}".format(*s))
def test_float32_in_the_reference(dtypes, shape):
    rng = np.random.default_rng(sum(shape) + 1)
    x, w, sizes, scale = make_inputs(rng, *shape, x_dtype=dtypes[0], w_dtype=dtypes[1])
    check("reference", x, w, sizes, scale)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize(
    "sizes",
    [
        [0, 7, 0, 0, 9, 0],  # empty groups between and around
        [16, 0, 0, 0, 0, 0],  # every row in the first expert
        [0, 0, 16, 0, 0, 0],  # ... in a middle one
        [0, 0, 0, 0, 0, 16],  # ... in the last one
        [3, 0, 2, 0, 1, 0],  # summing below M: rows 6.. are 0
        [0, 0, 0, 0, 0, 0],  # no rows at all: y is all 0
        [1, 1, 1, 1, 1, 11],
    ],
    ids=["empty_groups", "all_first", "all_middle", "all_last", "sum_below_m", "no_rows", "ones"],
)
def test_group_corner_cases(impl, dtypes, sizes):
    rng = np.random.default_rng(len(sizes) + sum(sizes))
    x, w, sizes, scale = make_inputs(rng, 16, 6, 48, 64, x_dtype=dtypes[0], w_dtype=dtypes[1], sizes=sizes)
    got = check(impl, x, w, sizes, scale)
    covered = int(sizes.sum())
    assert np.all(got[covered:] == 0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
def test_one_expert(impl, dtypes):
    """E = 1: a plain matmul of the first group_sizes[0] rows."""
    rng = np.random.default_rng(3)
    x, w, _, scale = make_inputs(rng, 20, 1, 40, 96, x_dtype=dtypes[0], w_dtype=dtypes[1])
    for size in (20, 13, 0):
        check(impl, x, w, np.array([size], np.int32), scale)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_scale(impl):
    """bfloat16 weights without a scale: the same as a scale of ones."""
    rng = np.random.default_rng(4)
    x, w, sizes, _ = make_inputs(rng, 30, 5, 24, 64, scaled=False)
    got = check(impl, x, w, sizes)
    ones = matmul_of(impl, x, w, sizes, np.ones((5, 24), F32))
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(ones).view(np.uint32))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "sizes",
    [[-5, 10, 3], [10, 10, 10], [-(2**31), 2**31 - 1, 2**31 - 1], [20, -1, -1], [0, 0, 25]],
    ids=["negative", "sum_above_m", "extremes", "first_past_m", "last_past_m"],
)
def test_malformed_sizes_follow_the_clamped_contract(impl, sizes):
    """Sizes no MoE layer passes are still defined (ffi/grouped_matmul.h): negative counts as 0,
    groups are cut at M; the kernel neither faults nor touches rows past M."""
    rng = np.random.default_rng(5)
    for dtypes in KERNEL_DTYPES:
        x, w, sizes_, scale = make_inputs(rng, 16, 3, 40, 64, x_dtype=dtypes[0], w_dtype=dtypes[1], sizes=sizes)
        check(impl, x, w, sizes_, scale)


# --------------------------------------------------------------------------- fp8


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("x_dtype", [BF16, F32], ids=["bf16_x", "f32_x"])
def test_every_fp8_code_decodes_exactly(impl, x_dtype):
    """w holds every finite e4m3 code (subnormals, +-0, +-448) and x is one-hot, so each output
    is one product, exact in every implementation: compared bit for bit."""
    if impl == "ffi" and x_dtype == F32:
        pytest.skip("the kernel takes bfloat16 x")
    codes = np.arange(256, dtype=np.uint8).view(FP8)
    codes = codes[np.isfinite(codes.astype(np.float32))]  # drop the two NaN codes
    K = 64
    N = -(-codes.size // K) * 8  # whole 16-byte pieces per row; codes spread over rows and k
    w = np.zeros((1, N, K), FP8)
    flat = w.reshape(-1)
    flat[: codes.size * 8 : 8] = codes  # one code every 8 k values
    w = flat.reshape(1, N, K)
    x = np.zeros((K, K), x_dtype)
    x[np.arange(K), np.arange(K)] = 1.0  # row m picks k = m
    scale = np.ones((1, N), F32)
    got = np.asarray(matmul_of(impl, x, w, np.array([K], np.int32), scale))
    want = w[0].astype(np.float32).T  # y[m, n] = w[n, m]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_fp8_subnormal_codes(impl):
    """Weights whose fp8 codes are all subnormal (m * 2^-9) against large x: a kernel that
    flushed them to zero would give 0."""
    rng = np.random.default_rng(6)
    E, N, K, M = 2, 24, 64, 10
    w = (rng.integers(1, 8, size=(E, N, K)) * 2.0**-9).astype(FP8)
    assert np.all(np.abs(w.astype(np.float64)) < 2.0**-6), "all codes subnormal"
    x = np.full((M, K), 64.0, BF16)
    scale = np.full((E, N), 3.0, F32)
    sizes = np.array([4, 6], np.int32)
    got = check(impl, x, w, sizes, scale)
    assert np.all(got > 0)


def test_quantize_special_rows():
    w = np.zeros((1, 4, 16), np.float32)
    w[0, 1, 3] = -2.5
    w[0, 2, 0] = np.inf
    w[0, 3, 7] = np.nan
    codes, scale = hs.quantize_weights_fp8(jnp.asarray(w))
    codes, scale = np.asarray(codes), np.asarray(scale)
    assert scale[0, 0] == 2.0**-126 and np.all(codes[0, 0].astype(np.float32) == 0), "a zero row: codes 0, the smallest normal scale"
    assert scale[0, 1] == np.float32(2.5 / 448)
    assert np.isnan(scale[0, 2]) and np.isnan(scale[0, 3]), "a non-finite row: scale NaN"
    assert np.all(codes[0, 2:].astype(np.float32) == 0), "... and codes 0"
    assert not np.any(np.isnan(codes.astype(np.float32))), "no fp8 NaN code is ever written"


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_scale_gives_nan_rows(impl):
    rng = np.random.default_rng(8)
    w = rng.standard_normal((2, 16, 64)).astype(np.float32)
    w[1, 5, 9] = np.inf
    codes, scale = hs.quantize_weights_fp8(jnp.asarray(w))
    x = rng.standard_normal((6, 64)).astype(BF16)
    got = np.asarray(matmul_of(impl, x, codes, np.array([3, 3], np.int32), scale))
    assert np.all(np.isnan(got[3:, 5])) and np.all(np.isfinite(np.delete(got, 5, axis=1)))
    assert np.all(np.isfinite(got[:3]))


# --------------------------------------------------------------------------- jit, scan, determinism


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
def test_inside_lax_scan(impl, dtypes):
    """One call per layer inside a jitted scan, each layer's weights sliced from the stack."""
    rng = np.random.default_rng(9)
    L, M, E, N, K = 3, 24, 4, 40, 64
    layers = [make_inputs(rng, M, E, N, K, x_dtype=dtypes[0], w_dtype=dtypes[1]) for _ in range(L)]
    op = functools.partial(hs.grouped_matmul, implementation=impl)
    check_inside_lax_scan(op, layers, assert_matches, functools.partial(matmul_of, impl) if impl == "ffi" else None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
def test_cuda_kernel_is_deterministic(dtypes):
    """Same inputs, same bits, call after call; and an expert's rows get the same bits when
    computed alone (no other group, a smaller M, hence another launch plan): each element is
    summed in a fixed k order (slices of K fixed by the weight's shape, added in slice order),
    whatever the batch."""
    rng = np.random.default_rng(10)
    M, E, N, K = 300, 8, 520, 1024
    x, w, sizes, scale = make_inputs(rng, M, E, N, K, x_dtype=dtypes[0], w_dtype=dtypes[1])
    first = np.asarray(matmul_of("ffi", x, w, sizes, scale)).view(np.uint32)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(matmul_of("ffi", x, w, sizes, scale)).view(np.uint32), first)
    e = int(np.argmax(sizes))
    start = int(sizes[:e].sum())
    rows = slice(start, start + int(sizes[e]))
    alone_sizes = np.zeros(E, np.int32)
    alone_sizes[e] = sizes[e]
    alone = np.asarray(matmul_of("ffi", x[rows], w, alone_sizes, scale)).view(np.uint32)
    np.testing.assert_array_equal(alone, first[rows])
    assert_matches(first.view(np.float32), x, w, sizes, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
def test_cuda_kernel_writes_zeros_past_the_groups(dtypes):
    """y starts as whatever XLA's allocator held: rows past the last group must be written."""
    rng = np.random.default_rng(11)
    x, w, _, scale = make_inputs(rng, 500, 4, 64, 64, x_dtype=dtypes[0], w_dtype=dtypes[1])
    sizes = np.array([3, 0, 40, 1], np.int32)

    @jax.jit
    def garbage_then_matmul(x, w, sizes, scale):
        junk = jnp.full((500, 64), jnp.nan, jnp.float32)  # likely to leave NaNs in a freed buffer
        return junk.sum() * 0, hs.grouped_matmul(x, w, sizes, scale, implementation="ffi")

    for _ in range(2):
        got = np.asarray(garbage_then_matmul(x, w, sizes, scale)[1])
        np.testing.assert_array_equal(got[44:].view(np.uint32), 0)
        assert_matches(got, x, w, sizes, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtypes", KERNEL_DTYPES, ids=lambda d: DTYPE_IDS[d])
@pytest.mark.parametrize("rows", [16, 136, 640])
def test_cuda_kernel_at_a_deployment_shape(dtypes, rows):
    """GLM-5.1-FP8 on 8 GPUs: 32 local experts, the down projection (K = 2048, N = 6144), P rows
    routed uniformly. Weights are made on the device; the oracle takes one expert at a time."""
    E, N, K = 32, 6144, 2048
    rng = np.random.default_rng(rows)
    key = jax.random.PRNGKey(rows)
    w = jax.random.normal(key, (E, N, K), jnp.float32) / np.sqrt(K)
    if dtypes[1] == FP8:
        w, scale = hs.quantize_weights_fp8(w)
    else:
        w, scale = w.astype(jnp.bfloat16), jnp.asarray(rng.uniform(0.5, 2.0, (E, N)), jnp.float32)
    x = rng.standard_normal((rows, K)).astype(BF16)
    sizes = routed_sizes(rng, rows, E)
    got = np.asarray(matmul_of("ffi", x, w, sizes, scale))
    w_host, scale_host = np.asarray(w), np.asarray(scale)
    assert_matches(got, x, w_host, sizes, scale_host)


# --------------------------------------------------------------------------- the compiled program


def _compiled(impl, w_dtype=BF16):
    rng = np.random.default_rng(12)
    x, w, sizes, scale = make_inputs(rng, 40, 4, 32, 64, w_dtype=w_dtype)
    return _jitted(impl).lower(x, w, sizes, scale).compile().as_text()


def test_auto_is_the_reference_on_cpu():
    if jax.default_backend() != "cpu":
        pytest.skip("CPU backend only")
    assert targets.GROUPED_MATMUL not in _compiled("auto")


@pytest.mark.gpu
@pytest.mark.parametrize("w_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_ffi_program_is_one_custom_call(w_dtype):
    hlo = _compiled("ffi", w_dtype)
    assert hlo.count(f'custom_call_target="{targets.GROUPED_MATMUL}"') == 1
    assert f'custom_call_target="{targets.GROUPED_MATMUL}"' in _compiled("auto", w_dtype)


@pytest.mark.gpu
def test_auto_is_the_reference_outside_the_kernel_domain():
    rng = np.random.default_rng(13)
    for x_dtype, w_dtype, K in [(F32, F32, 64), (BF16, BF16, 36)]:  # float32; K not a multiple of 8
        x, w, sizes, scale = make_inputs(rng, 10, 2, 16, K, x_dtype=x_dtype, w_dtype=w_dtype)
        assert targets.GROUPED_MATMUL not in _jitted("auto").lower(x, w, sizes, scale).compile().as_text()
        check("auto", x, w, sizes, scale)
        with pytest.raises(ValueError, match="grouped_matmul: .*pass implementation='reference'"):
            hs.grouped_matmul(x, w, sizes, scale, implementation="ffi")


@pytest.mark.gpu
def test_handler_rejects_bad_operands():
    """A direct ffi_call (no Python checks) gets the handler's own error, naming the operand."""
    call = jax.ffi.ffi_call(targets.GROUPED_MATMUL, jax.ShapeDtypeStruct((4, 16), jnp.float32))
    x = jnp.zeros((4, 36), jnp.bfloat16)  # K not a multiple of 8
    args = (x, jnp.zeros((2, 16, 36), jnp.bfloat16), jnp.ones((2, 16), jnp.float32), jnp.zeros((2,), jnp.int32))
    with pytest.raises(Exception, match="hisparse_grouped_matmul: w: K must be a multiple of 8"):
        jax.block_until_ready(jax.jit(call)(*args))
    args = (jnp.zeros((4, 64), jnp.bfloat16), jnp.zeros((2, 16, 64), jnp.bfloat16), jnp.ones((2, 16), jnp.float32),
            jnp.zeros((3,), jnp.int32))
    with pytest.raises(Exception, match=re.escape("group_sizes [3] must be [E] of w [2, 16, 64]")):
        jax.block_until_ready(jax.jit(call)(*args))


# --------------------------------------------------------------------------- argument errors


def _valid(rng=None):
    rng = rng or np.random.default_rng(14)
    return make_inputs(rng, 8, 3, 16, 32)


@pytest.mark.parametrize(
    "change, exc, message",
    [
        (lambda a: {**a, "x": a["x"].astype(np.float16)}, TypeError, "x must be bfloat16 or float32"),
        (lambda a: {**a, "x": a["x"][None]}, ValueError, r"x has shape \(1, 8, 32\); it must be \[M, K\]"),
        (lambda a: {**a, "w": a["w"].astype(np.int8)}, TypeError, "w must be bfloat16, float8_e4m3fn or float32"),
        (lambda a: {**a, "w": np.swapaxes(a["w"], 1, 2)}, ValueError, r"w has shape \(3, 32, 16\).*K = 32 of x"),
        (lambda a: {**a, "w": a["w"][:0], "sizes": a["sizes"][:0], "scale": a["scale"][:0]}, ValueError,
         "w has no experts"),
        (lambda a: {**a, "sizes": a["sizes"].astype(np.int64)}, TypeError, "group_sizes must be int32"),
        (lambda a: {**a, "sizes": a["sizes"][:2]}, ValueError, r"group_sizes has shape \(2,\); it must be \[E\]"),
        (lambda a: {**a, "scale": a["scale"].astype(BF16)}, TypeError, "scale must be float32"),
        (lambda a: {**a, "scale": a["scale"][:, :8]}, ValueError, r"scale has shape \(3, 8\); it must be \[E, N\]"),
        (lambda a: {**a, "w": a["w"].astype(FP8), "scale": None}, ValueError,
         "float8_e4m3fn w needs scale .* quantize_weights_fp8"),
    ],
    ids=["x_dtype", "x_rank", "w_dtype", "w_transposed", "no_experts", "sizes_dtype", "sizes_shape",
         "scale_dtype", "scale_shape", "fp8_without_scale"],
)
def test_argument_errors(change, exc, message):
    x, w, sizes, scale = _valid()
    a = change({"x": x, "w": w, "sizes": sizes, "scale": scale})
    for impl in ("reference", "auto"):
        with pytest.raises(exc, match=f"grouped_matmul: {message}"):
            hs.grouped_matmul(a["x"], a["w"], a["sizes"], a["scale"], implementation=impl)


def test_implementation_name():
    x, w, sizes, scale = _valid()
    with pytest.raises(ValueError, match="implementation must be 'auto', 'ffi' or 'reference'"):
        hs.grouped_matmul(x, w, sizes, scale, implementation="cuda")


def test_ffi_off_cuda_is_an_error():
    if jax.default_backend() != "cpu":
        pytest.skip("CPU backend only")
    x, w, sizes, scale = _valid()
    with pytest.raises(RuntimeError, match="grouped_matmul: implementation='ffi' is a CUDA kernel"):
        hs.grouped_matmul(x, w, sizes, scale, implementation="ffi")

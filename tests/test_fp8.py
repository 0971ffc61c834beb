"""hisparse_jax.fp8: the one float8_e4m3fn quantizer (per-row scale), its rule on special rows,
and both call sites (the indexer's keys, the grouped matmul's weights) using it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hisparse_jax as hs
from hisparse_jax import fp8

MIN_NORMAL = 2.0**-126


def quantize(x):
    codes, scale = fp8.quantize_rows(jnp.asarray(x))
    return np.asarray(codes), np.asarray(scale)


def test_all_zero_row_gets_codes_zero_and_the_smallest_normal_scale():
    codes, scale = quantize(np.zeros((3, 16), np.float32))
    assert codes.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and scale.dtype == np.float32
    assert np.all(scale == MIN_NORMAL) and np.all(codes.astype(np.float32) == 0)
    np.testing.assert_array_equal(np.asarray(fp8.dequantize_rows(codes, scale)), 0.0)


def test_negative_zero_row_dequantizes_to_zero():
    codes, scale = quantize(np.full((2, 8), -0.0, np.float32))
    assert np.all(scale == MIN_NORMAL)
    assert np.all(np.asarray(fp8.dequantize_rows(codes, scale)) == 0)


def test_tiny_row_keeps_a_normal_scale():
    # Normal values whose amax / 448 would be subnormal: the scale stops at the smallest normal
    # float32. (Subnormal inputs themselves read as 0 on XLA:CPU, which flushes them.)
    x = np.zeros((1, 16), np.float32)
    x[0, :4] = [1e-37, -3e-37, 5e-38, 0.0]
    codes, scale = quantize(x)
    assert scale[0] == MIN_NORMAL
    back = np.asarray(fp8.dequantize_rows(codes, scale))
    assert np.all(np.abs(back - x) <= 2.0**-4 * np.abs(x) + 2.0**-10 * MIN_NORMAL)


def test_huge_row_maps_its_max_to_448():
    x = np.array([[3e38, -1e38, 1.0, 0.0]], np.float32)
    codes, scale = quantize(x)
    # XLA on a GPU divides by the constant 448 as a multiply by its reciprocal: within one ulp.
    exact = np.float32(np.float32(3e38) / np.float32(448))
    assert np.isfinite(scale[0]) and np.nextafter(exact, 0) <= scale[0] <= np.nextafter(exact, np.inf)
    assert codes[0, 0].astype(np.float32) == 448 and np.all(np.isfinite(codes.astype(np.float32)))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_row_gets_codes_zero_and_scale_nan(bad):
    x = np.ones((2, 8), np.float32)
    x[1, 3] = bad
    codes, scale = quantize(x)
    assert np.isnan(scale[1]) and np.all(codes[1].astype(np.float32) == 0)
    assert np.isfinite(scale[0]), "other rows are unaffected"
    assert not np.any(np.isnan(codes.astype(np.float32))), "no fp8 NaN code is ever written"
    assert np.all(np.isnan(np.asarray(fp8.dequantize_rows(codes, scale))[1]))


# The indexer's keys [b, T, d] (seed 31, as its tests drew them), the grouped matmul's weights
# [E, N, K] (seed 7), and the quantizer itself: each row's scale, the bound, the +-448 maximum.
ROUND_TRIP = {
    "keys": (hs.quantize_keys_fp8, 31, (3, 50, 64)),
    "weights": (hs.quantize_weights_fp8, 7, (3, 20, 64)),
    "rows": (fp8.quantize_rows, 5, (8, 32, 64)),
}


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("site", sorted(ROUND_TRIP))
def test_quantize_round_trip(site, dtype):
    quantizer, seed, shape = ROUND_TRIP[site]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, size=(*shape[:-1], 1)))).astype(dtype)
    codes, scale = quantizer(jnp.asarray(w))
    assert codes.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and codes.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == w.shape[:-1]
    x = w.astype(np.float64)
    s = np.asarray(scale).astype(np.float64)
    np.testing.assert_allclose(s, np.abs(x).max(-1) / 448.0, rtol=2.0**-23)
    back = np.asarray(codes).astype(np.float64) * s[..., None]
    # e4m3: 3 mantissa bits (half an ulp = 2^-4 relative); subnormal spacing 2^-9 of the scale.
    assert np.all(np.abs(back - x) <= 2.0**-4 * np.abs(x) * (1 + 2.0**-20) + 2.0**-10 * s[..., None])
    np.testing.assert_array_equal(np.asarray(fp8.dequantize_rows(codes, scale)), (np.asarray(codes).astype(np.float32) * np.asarray(scale)[..., None]))
    top = np.take_along_axis(np.asarray(codes).astype(np.float64), np.abs(x).argmax(-1)[..., None], -1)
    np.testing.assert_array_equal(np.abs(top), 448.0)  # each row's largest |x| becomes +-448


def test_jit_gives_the_same_bits():
    x = np.random.default_rng(6).standard_normal((4, 48)).astype(np.float32)
    eager, jitted = fp8.quantize_rows(x), jax.jit(fp8.quantize_rows)(x)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("quantizer", [hs.quantize_keys_fp8, hs.quantize_weights_fp8])
def test_both_call_sites_use_the_one_quantizer(quantizer):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    x[0, 1] = 0.0
    x[1, 2, 4] = np.nan
    got, want = quantizer(jnp.asarray(x)), fp8.quantize_rows(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.uint8), np.asarray(want[0]).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(got[1]).view(np.uint32), np.asarray(want[1]).view(np.uint32))


def test_packed_rows_round_trip_bit_for_bit_nan_patterns_included():
    """pack_rows keeps codes and scale as bytes: unpack_rows gives back their bits, a NaN scale
    and scales whose bytes read as fp8 NaN patterns (0x7f, 0xff) included."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 6, 16)).astype(np.float32)
    x[0, 1, 3] = np.nan
    codes, scale = fp8.quantize_rows(jnp.asarray(x))
    scale = scale.at[2, :2].set(jnp.asarray(np.array([0x7F7F7F7F, 0x3FFFFFFF], np.uint32).view(np.float32)))
    packed = jax.jit(fp8.pack_rows)(codes, scale)
    assert packed.dtype == jnp.uint8 and packed.shape == (3, 6, 16 + fp8.SCALE_BYTES)
    back_codes, back_scale = jax.jit(fp8.unpack_rows)(packed)
    np.testing.assert_array_equal(np.asarray(back_codes).view(np.uint8), np.asarray(codes).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(back_scale).view(np.uint32), np.asarray(scale).view(np.uint32))


def test_round_trip_is_what_a_reader_of_the_codes_computes_with_a_straight_through_gradient():
    x = jnp.asarray(np.random.default_rng(9).standard_normal((4, 32)).astype(np.float32))
    want = fp8.dequantize_rows(*fp8.unpack_rows(fp8.pack_rows(*fp8.quantize_rows(x))))
    np.testing.assert_array_equal(np.asarray(jax.jit(fp8.round_trip)(x)).view(np.uint32),
                                  np.asarray(want).view(np.uint32))
    assert not np.array_equal(np.asarray(want), np.asarray(x))  # it did round
    weights = jnp.arange(32.0)
    grad = jax.grad(lambda v: jnp.sum(fp8.round_trip(v) * weights))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.broadcast_to(np.asarray(weights), x.shape))

"""The one float8_e4m3fn quantizer of the package: a float32 scale per row (the last axis).

The indexer's keys (one scale per token) and the grouped matmul's expert weights (one scale per
expert and output channel) are both rows quantized by `quantize_rows`, under one rule:

  amax  = max |x| over the row
  scale = max(amax / 448, 2**-126)            (448: the largest finite e4m3 value)
  codes = x / scale rounded to nearest e4m3, clipped to [-448, 448]

so codes * scale recovers each value within 2^-4 of its magnitude (2^-10 * scale for the
smallest ones). The floor at the smallest normal float32 keeps the scale normal: an all-zero row
gets codes 0 and scale 2**-126 and dequantizes to exactly 0 (so does -0.0), and a row whose amax
is below 448 * 2**-126 is not divided by a subnormal scale that a flush-to-zero backend would
read as 0. A row holding inf or NaN gets codes 0 and scale NaN, so its non-finiteness shows
(in every product with its scale) instead of vanishing; no fp8 NaN code is ever written (the
CUDA kernels do not decode them).

A record store keeps such rows as bytes (`pack_rows`: the codes, then the scale's 4 bytes, uint8),
never as fp8 values: records are copied as bits, and no select or copy must meet the NaN patterns
a scale's bytes can hold. `round_trip` is what a trained model sees of fp8 keys: the values
decode reads back, with the gradient passed straight through the rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The largest finite float8_e4m3fn value: a row's max |x| maps to it.
FP8_MAX = 448.0
# The smallest normal float32: the floor of every scale.
MIN_SCALE = 2.0**-126


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-row fp8 quantization of `x` [..., n] (bfloat16 or float32) under the module's rule.

    Returns (codes [..., n] float8_e4m3fn, scale [...] float32); codes * scale ~ x.
    """
    x = jnp.asarray(x).astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1)
    finite = jnp.isfinite(amax)
    scale = jnp.where(finite, jnp.maximum(amax / FP8_MAX, MIN_SCALE), jnp.nan)
    divisor = jnp.where(finite, scale, 1.0)[..., None]
    # x / (amax / 448) can round to just above 448, which float8_e4m3fn would turn into NaN;
    # the clip only takes back that last rounding.
    codes = jnp.where(finite[..., None], jnp.clip(x / divisor, -FP8_MAX, FP8_MAX), 0.0)
    return codes.astype(jnp.float8_e4m3fn), scale.astype(jnp.float32)


def dequantize_rows(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """codes * scale in float32: the values `quantize_rows` stands for ([..., n] float32)."""
    return codes.astype(jnp.float32) * scale[..., None]


# The bytes of a row's float32 scale, stored after its codes (pack_rows).
SCALE_BYTES = 4


def pack_rows(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """codes [..., n] float8_e4m3fn and scale [...] float32 (quantize_rows) -> [..., n + 4] uint8:
    each row's code bytes, then its scale's bytes."""
    return jnp.concatenate([jax.lax.bitcast_convert_type(codes, jnp.uint8),
                            jax.lax.bitcast_convert_type(scale.astype(jnp.float32), jnp.uint8)], axis=-1)


def unpack_rows(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The inverse of pack_rows, bit for bit: [..., n + 4] uint8 -> (codes [..., n] float8_e4m3fn,
    scale [...] float32)."""
    codes = jax.lax.bitcast_convert_type(packed[..., :-SCALE_BYTES], jnp.float8_e4m3fn)
    return codes, jax.lax.bitcast_convert_type(packed[..., -SCALE_BYTES:], jnp.float32)


@jax.custom_vjp
def round_trip(x: jax.Array) -> jax.Array:
    """x [..., n] -> dequantize_rows(*quantize_rows(x)) float32: the values fp8 rows of x stand
    for, bit for bit what a reader of the codes and scales computes; the gradient is the identity
    (straight through the rounding, as quantization-aware training takes it)."""
    codes, scale = quantize_rows(x)
    # The barrier keeps the convert to fp8 and the one back apart: XLA's GPU compiler deletes such
    # a pair when excess precision is allowed (hisparse_jax/rounding.py), which would train on
    # unrounded keys.
    return dequantize_rows(jax.lax.optimization_barrier(codes), scale)


round_trip.defvjp(lambda x: (round_trip(x), None), lambda _, g: (g,))

"""A value rounded to the dtype that stores it, kept as a rounding under jit on every backend.

Training reads keys as decode will read them back from their records (bfloat16, fp8 codes), so
it rounds: x.astype(stored).astype(float32). XLA may delete exactly that pair: with excess
precision allowed (XLA's default), its GPU compiler removes a lossy convert followed by the
convert back ("simplify FP conversions"), and the jitted program then trains on unrounded keys
while decode reads rounded ones. An optimization barrier between the two converts is opaque to
that pass; it costs one materialized array of the rounded values, and nothing on backends that
never removed the pair (the same bits on CPU as before).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def as_stored(x: jax.Array, dtype) -> jax.Array:
    """x rounded to `dtype` (a float dtype: what a store of x holds), read back as float32."""
    return jax.lax.optimization_barrier(jnp.asarray(x).astype(dtype)).astype(jnp.float32)

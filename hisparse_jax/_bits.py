"""Records as unsigned integers of their width, for the pure-JAX references that copy them.

XLA may canonicalize float NaNs (e.g. bfloat16 through float32 on CPU) in selects and scatters;
integer bits move exactly, so the references copy records bit for bit as the FFI handlers do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def as_bits(x):
    """`x` bitcast to the unsigned integer dtype of its itemsize."""
    return jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])


def from_bits(x, dtype):
    """The inverse of as_bits: the unsigned integers `x` bitcast back to `dtype`."""
    return jax.lax.bitcast_convert_type(x, dtype)

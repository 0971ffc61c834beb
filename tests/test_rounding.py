"""rounding.as_stored: under jit, on every backend, the value rounded to its store's dtype (XLA's
GPU compiler deletes a bare convert-down/convert-up pair when excess precision is allowed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax.testing.program import fully_optimized
from hisparse_jax.rounding import as_stored


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn])
def test_jitted_value_is_the_numpy_rounding(dtype):
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32) * 4
    want = x.astype(np.dtype(dtype)).astype(np.float32)
    assert not np.array_equal(want, x), "the inputs must need rounding, or the test proves nothing"
    got = np.asarray(jax.jit(lambda v: as_stored(v, dtype))(x))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_rounding_survives_in_the_compiled_program():
    lowered = jax.jit(lambda v: as_stored(v, jnp.bfloat16)).lower(jnp.zeros((4, 8), jnp.float32))
    text = fully_optimized(lowered)
    assert "bf16[4,8]" in text, "the convert to bfloat16 was optimized away"


def test_the_gradient_passes_the_rounding_straight_through_a_convert():
    g = jax.grad(lambda v: jnp.sum(as_stored(v, jnp.bfloat16) * 3.0))(jnp.ones((5,), jnp.float32))
    np.testing.assert_array_equal(np.asarray(g), np.full((5,), 3.0, np.float32))


def test_float32_is_unchanged():
    x = np.float32([1.0000001, -3.3, 0.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: as_stored(v, jnp.float32))(x)), x)

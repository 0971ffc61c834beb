"""layers.weight_einsum: a weight matmul whose single row is computed as two (XLA would turn a
one-row matmul into a multiply and a reduce that reads the weight at a fifth of HBM on a GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax.models import layers

# Integer-valued operands: every sum is exact in float32, so the padded and the plain einsum
# must agree bit for bit whatever order the backend sums in.
CASES = [
    ("...d,dv->...v", (1, 8), (8, 5)),
    ("...d,dv->...v", (8,), (8, 5)),  # no leading axis at all
    ("...d,dv->...v", (3, 8), (8, 5)),
    ("...d,dhe->...he", (1, 1, 8), (8, 2, 3)),
    ("...hn,hnc->...hc", (1, 4, 6), (4, 6, 7)),  # MLA's query absorption: heads are a batch axis
    ("...hn,hnc->...hc", (2, 4, 6), (4, 6, 7)),
    ("...hv,hvd->...d", (1, 4, 6), (4, 6, 7)),
]


def _ints(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).integers(-4, 5, shape), dtype)


@pytest.mark.parametrize("spec,x_shape,w_shape", CASES)
def test_same_values_and_shape_as_einsum(spec, x_shape, w_shape):
    x, w = _ints(x_shape, 0), _ints(w_shape, 1)
    want = jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
    got = jax.jit(lambda a, b: layers.weight_einsum(spec, a, b, preferred_element_type=jnp.float32))(x, w)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_single_row_is_computed_as_two_rows():
    x, w = _ints((1, 8), 0, jnp.bfloat16), _ints((8, 5), 1, jnp.bfloat16)
    hlo = jax.jit(lambda a, b: layers.weight_einsum("...d,dv->...v", a, b)).lower(x, w).as_text()
    assert "tensor<2x8xbf16>" in hlo, "the single row was not padded to two before the dot"
    many = jax.jit(lambda a, b: layers.weight_einsum("...d,dv->...v", a, b)).lower(_ints((3, 8), 0, jnp.bfloat16), w)
    assert "concatenate" not in many.as_text(), "rows > 1 must go to the einsum unchanged"


def test_a_spec_without_leading_rows_is_refused():
    with pytest.raises(ValueError, match=r"weight_einsum: the spec must start with '\.\.\.'"):
        layers.weight_einsum("bd,dv->bv", jnp.ones((1, 2)), jnp.ones((2, 3)))

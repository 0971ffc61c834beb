"""A weight's product with a layer's input, computed ahead of time by one merged matmul, standing
in for the weight where the model code multiplies by it.

Several projections of a decode layer read the same input h (the layer's normed input): MLA's
w_q_a (or w_q) and w_kv, and at a selecting layer the lightning indexer's w_q, w_k and w_head.
Apart, each is a matmul of its own that reads its weight with a few rows of h (a decode step is
weight-bandwidth bound); kit.inputs stores those weights side by side in one [D, N] matrix, once
at load, computes h @ W once per step and hands each consumer its slice as a `Product`. The model
code calls `project(spec, h, w)` where it would call `layers.weight_einsum(spec, h, w)`: a weight
gives the einsum, a Product its precomputed value in the dtype the einsum would have returned.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from . import layers


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Product:
    """h @ w of this step's h, float32 (the merged matmul accumulates and returns float32).

    value: [rows, *w.shape[1:]] or [..., *w.shape[1:]] with h's rows in order.
    weight_dtype: the dtype w was stored in: `project` returns what einsum(h, w) would (its result
      dtype, or preferred_element_type).
    """

    value: jax.Array
    weight_dtype: str = dataclasses.field(metadata=dict(static=True))


def _check_spec(spec: str) -> int:
    """Trailing weight dims of an 'h times weight' spec "...d,d<rest>-><out>" (out = ...<rest>)."""
    lhs, rest = spec.split(",")
    w, out = rest.split("->")
    if not (lhs.startswith("...") and len(lhs) == 4 and w[:1] == lhs[3] and out == "..." + w[1:]):
        raise ValueError(f"products.project: the spec must read '...d,d<rest>->...<rest>' (h times a weight "
                         f"over h's last axis), got {spec!r}")
    return len(w) - 1


def project(spec: str, h: jax.Array, w, **kwargs) -> jax.Array:
    """layers.weight_einsum(spec, h, w, **kwargs) for a weight w; for a Product, its value (same
    rows, shaped like the einsum's result) in the einsum's dtype (kwargs' preferred_element_type,
    else the result dtype of h and the weight). Only 'h times a weight' specs (_check_spec)."""
    if not isinstance(w, Product):
        return layers.weight_einsum(spec, h, w, **kwargs)
    trailing = w.value.shape[w.value.ndim - _check_spec(spec):]
    lead = h.shape[:-1]
    if math.prod(w.value.shape[: w.value.ndim - len(trailing)]) != math.prod(lead):
        raise ValueError(f"products.project: the product holds {w.value.shape} for an input of shape {h.shape}: "
                         "it was computed from another h (kit.inputs.apply with this layer's input)")
    want = kwargs.get("preferred_element_type") or jnp.result_type(h.dtype, w.weight_dtype)
    return w.value.reshape(*lead, *trailing).astype(want)

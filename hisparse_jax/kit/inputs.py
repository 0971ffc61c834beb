"""The decode layout of the kit model's weights: a layer's input projections as ONE weight.

A decode step reads every weight once for a few rows of activations, so its time is the weights'
bytes over HBM bandwidth plus what each matmul launch wastes. MLA's w_q_a (or w_q) and w_kv, and
at a selecting layer (a group's anchor) its indexer's input weights (the names the Indexer lists
in `input_weights`: the lightning indexer's w_q, w_k and w_head), all multiply the same normed
layer input h. `merge` stores them side by side in one [D, N] matrix per layer (columns: the
layer's, then the indexer's), ONCE when the weights are loaded for decoding; `apply` then runs
one matmul h @ W per layer and step (float32 out) and hands each consumer its slice as a
models.products.Product, which products.project returns where the model code would multiply.
Never concatenate per step: that copies the weights every step (hisparse_jax.testing's
assert_no_big_copies counts the merged shapes among the weights' and catches it).

Which form is where:
- init_weights, training and checkpoints keep the weights apart (one array per projection): a
  checkpoint written before the merged layout existed is this layout, and training's matmuls
  have thousands of rows, where merging saves nothing;
- decoding takes either: the decode benchmark merges (Family.decode_weights); prefill splits a
  merged layout back (slices, once per prefill call) and computes as before;
- save_model splits before writing, so a checkpoint never holds the merged layout.

Bits: the merged matmul sums each output in the order XLA picks for the wider matrix, which
need not be the separate matmuls' order (XLA:CPU differs at batch >= 2), so merged and separate
weights give logits equal within rounding, not bit for bit. Every decode mode reads the same
merged weights, so HiSparse == full-KV stays bit-exact with either layout.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ..models import layers
from ..models.products import Product

LAYER_INPUTS = ("w_q", "w_q_a", "w_kv")  # LayerWeights' projections of the layer's normed input
LAYER, INDEXER = "layer", "indexer"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MergedInputs:
    """One layer's input projections side by side.

    w: [D, N], the pieces' matrices flattened to [D, n] each, in `pieces` order.
    pieces: ((owner, name, trailing shape), ...): owner "layer" (a LayerWeights field) or
      "indexer" (an entry of the group's indexer parameters), the piece's weight [D, *shape].
    """

    w: jax.Array
    pieces: tuple[tuple[str, str, tuple[int, ...]], ...] = dataclasses.field(metadata=dict(static=True))


def _get(params, name: str):
    return params[name] if isinstance(params, dict) else getattr(params, name)


def _replace(params, values: dict):
    return {**params, **values} if isinstance(params, dict) else dataclasses.replace(params, **values)


def is_merged(weights) -> bool:
    return any(getattr(lw, "inputs", None) is not None for lw in weights.layers)


def merge(config, weights):
    """The weights with each layer's input projections in one matrix (see the module docstring);
    weights already merged come back as they are. Concatenates once: call it when the weights
    are loaded, never inside a step. Pieces of another dtype than the layer's first stay apart."""
    if is_merged(weights):
        return weights
    input_names = tuple(getattr(config.indexer, "input_weights", ()))
    out_layers, indexers = list(weights.layers), list(weights.indexers)
    for i, lw in enumerate(weights.layers):
        pieces, mats, layer_none, group = [], [], {}, None
        for name in LAYER_INPUTS:
            a = getattr(lw, name)
            if a is not None:
                pieces.append((LAYER, name, tuple(a.shape[1:])))
                mats.append(a)
                layer_none[name] = None
        if i % config.index_share == 0 and input_names:
            group = i // config.index_share
            for name in input_names:
                a = _get(indexers[group], name)
                if a is not None and a.dtype == mats[0].dtype and a.shape[0] == mats[0].shape[0]:
                    pieces.append((INDEXER, name, tuple(a.shape[1:])))
                    mats.append(a)
        if len(mats) < 2:
            continue
        w = jnp.concatenate([m.reshape(m.shape[0], -1) for m in mats], axis=1)
        out_layers[i] = dataclasses.replace(lw, inputs=MergedInputs(w, tuple(pieces)), **layer_none)
        taken = {name: None for owner, name, _ in pieces if owner == INDEXER}
        if taken:
            indexers[group] = _replace(indexers[group], taken)
    return dataclasses.replace(weights, layers=tuple(out_layers), indexers=tuple(indexers))


def _pieces(m: MergedInputs):
    """(owner, name, shape, start, width) of each piece of m.w's columns."""
    start = 0
    for owner, name, shape in m.pieces:
        width = math.prod(shape)
        yield owner, name, shape, start, width
        start += width


def split(config, weights):
    """The weights with every merged layer's projections apart again (slices of the merged
    matrix: the same values): the layout of init_weights and of checkpoints."""
    if not is_merged(weights):
        return weights
    out_layers, indexers = list(weights.layers), list(weights.indexers)
    for i, lw in enumerate(weights.layers):
        m = lw.inputs
        if m is None:
            continue
        apart = {LAYER: {}, INDEXER: {}}
        for owner, name, shape, start, width in _pieces(m):
            apart[owner][name] = m.w[:, start:start + width].reshape(m.w.shape[0], *shape)
        out_layers[i] = dataclasses.replace(lw, inputs=None, **apart[LAYER])
        if apart[INDEXER]:
            group = i // config.index_share  # the merged layer is its group's anchor
            indexers[group] = _replace(indexers[group], apart[INDEXER])
    return dataclasses.replace(weights, layers=tuple(out_layers), indexers=tuple(indexers))


def apply(w, params, h: jax.Array):
    """(w, params) with the merged pieces replaced by Products of h: one matmul h [..., D] @
    w.inputs.w [D, N] (float32 out), sliced per piece. `params`: the group's indexer parameters
    at its anchor layer (None elsewhere). Without merged inputs: (w, params) unchanged."""
    m = getattr(w, "inputs", None)
    if m is None:
        return w, params
    y = layers.weight_einsum("...d,dn->...n", h, m.w, preferred_element_type=jnp.float32)
    got = {LAYER: {}, INDEXER: {}}
    for owner, name, shape, start, width in _pieces(m):
        got[owner][name] = Product(y[..., start:start + width].reshape(*h.shape[:-1], *shape), str(m.w.dtype))
    if got[INDEXER]:
        if params is None:
            raise ValueError("kit.inputs.apply: this layer's merged weight holds its indexer's inputs; pass the "
                             "group's indexer parameters (it is the group's anchor layer)")
        params = _replace(params, got[INDEXER])
    return dataclasses.replace(w, inputs=None, **got[LAYER]), params

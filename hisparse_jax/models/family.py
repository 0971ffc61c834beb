"""A model family as a value: the functions `decode`, `sharding` and the benchmarks drive.

Each family module (dsa, nsa, quest) defines `FAMILY = Family(...)`; hisparse_jax.models
.get_family maps a name to it. A user-defined family is a `Family(...)` of its own, passed
wherever a family name is accepted; `sharding.sharded_family` is the same value with its
per-stream functions replaced. hisparse_jax/models/__init__.py describes what each function
must do.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family (hashable: a static jit argument).

    Attributes:
      name: the family's name ("dsa"), or a description of a derived family.
      Config: its static configuration class (named like the family modules' own class, so
        `family.Config.tiny()` reads the same for a module and a Family).
      init_weights, init_state, prefill, decode_step, selecting_layout, metadata_bytes_read: the
        protocol's functions (hisparse_jax.models).
      selection_weights: names, on their pytree paths, of the weights the family's selection
        reads (weights.weight_bytes counts them as "selection").
      decode_weights: (config, weights) -> the same weights in the layout decoding reads fastest
        (the kit: each layer's input projections in one matrix, kit.inputs), made once at load;
        decode_step and prefill take either layout. None: init_weights' layout is the one.
    """

    name: str
    Config: type
    init_weights: Callable
    init_state: Callable
    prefill: Callable
    decode_step: Callable
    selecting_layout: Callable
    metadata_bytes_read: Callable
    selection_weights: tuple[str, ...] = ()
    decode_weights: Callable | None = None


def decode_weights(family: Family, config, weights):
    """`weights` in the family's decode layout (Family.decode_weights; unchanged without one).
    `family`: a Family, a family module or a name (models.get_family)."""
    from . import get_family  # models/__init__ imports this module

    convert = get_family(family).decode_weights
    return weights if convert is None else convert(config, weights)


def in_decode_layout(family: Family, config, weights) -> bool:
    """Whether `weights` already are in the family's decode layout (decode_weights would return
    them as they are): compared by tree structure and leaf shapes, traced abstractly (nothing is
    concatenated) once per family, config and weight structure. True for families without a
    decode layout."""
    from . import get_family

    family = get_family(family)
    if family.decode_weights is None:
        return True
    leaves, tree = jax.tree.flatten(weights)
    return _in_decode_layout(family, config, tree, tuple((tuple(a.shape), str(a.dtype)) for a in leaves))


@functools.lru_cache(maxsize=64)
def _in_decode_layout(family: Family, config, tree, shapes: tuple) -> bool:
    abstract = jax.tree.unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in shapes])
    converted = jax.eval_shape(lambda w: decode_weights(family, config, w), abstract)
    leaves, converted_tree = jax.tree.flatten(converted)
    return converted_tree == tree and tuple((tuple(a.shape), str(a.dtype)) for a in leaves) == shapes

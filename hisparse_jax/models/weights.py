"""Seeded random weights for benchmarks and tests, stored one buffer per layer, and their bytes.

Per-layer weights are tuples of per-layer pytrees, not arrays stacked on a layer axis: the
decode step unrolls its layers and every matmul reads its layer's own buffer in place. (A layer
scan over stacked weights makes XLA slice each layer's matrices out of the stack, and on the GPU
it copies them: ~3x the weight traffic a step needs.)

`weight_bytes(family, config)` is the model's bytes by component, from the shapes alone.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Parameters are drawn in groups of at most this many values per jitted draw: small models draw
# in one program (XLA:CPU compiles each threefry program for about a second), large ones one
# parameter at a time (no device buffer of every weight in float32 at once).
_DRAW_ELEMENTS = 2**27


def init_normal(seed: int, specs: Mapping[str, tuple[tuple[int, ...], int]], dtype,
                stream: Sequence[int] = ()) -> dict[str, jax.Array]:
    """Normal(0, 1/fan_in) parameters: {name: (shape, fan_in)} -> {name: array in `dtype`}.

    Deterministic in (seed, stream, the specs' names, shapes and order). `stream` picks an
    independent sequence of draws: a model draws most weights in one call (stream ()) and may
    draw others apart, e.g. one layer's experts at a time, each call with its own stream.
    """
    names = list(specs)
    groups, current, size = [], [], 0
    for name in names:
        n = math.prod(specs[name][0])
        if current and size + n > _DRAW_ELEMENTS:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        groups.append(current)
    out = {}
    for index, group in enumerate(groups):
        shapes = tuple(tuple(int(d) for d in specs[n][0]) for n in group)
        scales = tuple(1.0 / math.sqrt(specs[n][1]) for n in group)
        out.update(zip(group, _draw(shapes, scales, np.dtype(dtype), seed, np.asarray(stream, np.int32), index)))
    return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _draw(shapes, scales, dtype, seed, stream, group):
    sizes = [math.prod(s) for s in shapes]
    key = jax.random.key(seed)
    for i in range(stream.shape[0]):  # a traced stream: one compilation serves every layer's draws
        key = jax.random.fold_in(key, stream[i])
    key = jax.random.fold_in(key, group)
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    return tuple(
        (flat[o : o + n] * scale).astype(dtype).reshape(s) for o, n, s, scale in zip(offsets, sizes, shapes, scales)
    )


def split_layers(stacked: Mapping[str, jax.Array], count: int, build: Callable[..., object]) -> tuple:
    """Per-layer pytrees from arrays stacked on a leading [count] axis: (build(**{name: a[i]}) for i)."""
    return tuple(build(**layer) for layer in _unstack(dict(stacked), count))


@functools.partial(jax.jit, static_argnums=1)
def _unstack(stacked: dict, count: int) -> tuple:
    # Every slice in one program: eagerly, each a[i] compiled a slice and a squeeze per shape.
    return tuple({name: array[i] for name, array in stacked.items()} for i in range(count))


def ones(shape: Sequence[int], dtype) -> jax.Array:
    return jnp.ones(tuple(shape), dtype)


# --------------------------------------------------------------------------- bytes by component

COMPONENTS = ("attention", "indexer", "routed experts", "shared experts", "dense MLP", "embeddings")
_EMBEDDINGS = ("embed", "unembed", "final_norm")


def weight_bytes(family: Any, config: Any) -> dict[str, int]:
    """Bytes of the model's weights by component, from their shapes (nothing is allocated).

    Args:
      family: a family name or module (hisparse_jax.models.get_family).
      config: its Config.
    Returns:
      {component: bytes} for every name in COMPONENTS (0 where the model has none), and "total",
      their sum. A leaf of `family.init_weights(config, 0)` is classified by the names on its
      pytree path, first rule that applies:
        - "embed", "unembed", "final_norm" at the top: "embeddings";
        - a name the family lists in SELECTION_WEIGHTS (DSA: its lightning "indexers"; NSA: the
          compression maps "cmp_k", "cmp_v" whose keys score the selection blocks): "indexer";
        - under a layer's "moe": "shared experts" under its "shared", else "routed experts"
          (the experts, their fp8 scales, the router and the MoE's input norm);
        - under a layer's "mlp" (the dense SwiGLU and its input norm): "dense MLP";
        - anything else of a layer (projections, attention and query/KV norms): "attention".
      Weights fused into another matrix count with it (NSA's branch gates are columns of the
      attention input projection: "attention").
    """
    from . import get_family  # the package imports its families lazily

    family = get_family(family)
    shapes = jax.eval_shape(lambda: family.init_weights(config, 0))
    selection = set(family.selection_weights)
    out = dict.fromkeys(COMPONENTS, 0)
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        names = [_key_name(key) for key in path]
        out[_component(names, selection)] += math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    out["total"] = sum(out[c] for c in COMPONENTS)
    return out


def _key_name(key) -> str | None:
    for attr in ("name", "key"):  # GetAttrKey, DictKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return None  # a sequence index (the layer)


def _component(names: list, selection: set) -> str:
    if names[0] in _EMBEDDINGS:
        return "embeddings"
    if selection.intersection(names):
        return "indexer"
    if "moe" in names:
        return "shared experts" if "shared" in names else "routed experts"
    if "mlp" in names:
        return "dense MLP"
    return "attention"

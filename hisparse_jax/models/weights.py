"""Seeded random weights for benchmarks and tests, stored one buffer per layer.

Per-layer weights are tuples of per-layer pytrees, not arrays stacked on a layer axis: the
decode step unrolls its layers and every matmul reads its layer's own buffer in place. (A layer
scan over stacked weights makes XLA slice each layer's matrices out of the stack, and on the GPU
it copies them: ~3x the weight traffic a step needs.)
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Parameters are drawn in groups of at most this many values per jitted draw: small models draw
# in one program (XLA:CPU compiles each threefry program for about a second), large ones one
# parameter at a time (no device buffer of every weight in float32 at once).
_DRAW_ELEMENTS = 2**27


def init_normal(seed: int, specs: Mapping[str, tuple[tuple[int, ...], int]], dtype) -> dict[str, jax.Array]:
    """Normal(0, 1/fan_in) parameters: {name: (shape, fan_in)} -> {name: array in `dtype`}.

    Deterministic in (seed, the specs' names, shapes and order).
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
        out.update(zip(group, _draw(shapes, scales, np.dtype(dtype), seed, index)))
    return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _draw(shapes, scales, dtype, seed, group):
    sizes = [math.prod(s) for s in shapes]
    key = jax.random.fold_in(jax.random.key(seed), group)
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    return tuple(
        (flat[o : o + n] * scale).astype(dtype).reshape(s) for o, n, s, scale in zip(offsets, sizes, shapes, scales)
    )


def split_layers(stacked: Mapping[str, jax.Array], count: int, build: Callable[..., object]) -> tuple:
    """Per-layer pytrees from arrays stacked on a leading [count] axis: (build(**{name: a[i]}) for i)."""
    return tuple(build(**{name: array[i] for name, array in stacked.items()}) for i in range(count))


def ones(shape: Sequence[int], dtype) -> jax.Array:
    return jnp.ones(tuple(shape), dtype)

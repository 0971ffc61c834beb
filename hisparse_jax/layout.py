"""The declared layout of decode state: where each array lives, what it holds, its batch axis.

Every array field of a state pytree (HotCache, RecordStore, a model family's State) declares its
layout on the dataclass field itself, with `field(category, batch_axis, memory)`. The byte
account (hisparse_jax.bench.decode.capacity), the synthetic fill (hisparse_jax.bench.decode.synthetic) and the
sharding specs (hisparse_jax.sharding) all read it from there, so a new state array is counted,
filled and sharded by saying once what it is.

A field may hold one array, a tuple of arrays with the same layout (per-layer arrays: one buffer
per layer, so each layer reads its own buffer in place), a nested state dataclass (walked
recursively), or None (absent in this mode).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax

# What an array holds. "kv records" is every copy of attended keys and values (device KV, the hot
# buffer, NSA's sliding window and compressed KV; the host pool, in host memory); "open page" the
# tail of tokens not yet sealed into a record.
KV_RECORDS = "kv records"
SLOT_METADATA = "slot metadata"
INDEXER_METADATA = "indexer metadata"
OPEN_PAGE = "open page"
COUNTERS = "counters"
CATEGORIES = (KV_RECORDS, SLOT_METADATA, INDEXER_METADATA, OPEN_PAGE, COUNTERS)

DEVICE = "device"
PINNED_HOST = "pinned_host"
MEMORIES = (DEVICE, PINNED_HOST)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The declared layout of one state field.

    Attributes:
      category: one of CATEGORIES.
      batch_axis: the axis of each array that indexes requests (the first stream dim), or None
        for an array shared by all requests.
      memory: "device" or "pinned_host".
    """

    category: str
    batch_axis: int | None
    memory: str = DEVICE

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"Layout.category must be one of {CATEGORIES}, got {self.category!r}")
        if self.memory not in MEMORIES:
            raise ValueError(f"Layout.memory must be one of {MEMORIES}, got {self.memory!r}")


def field(category: str, batch_axis: int | None, memory: str = DEVICE, **kwargs) -> Any:
    """A dataclass field declaring its Layout (use for every array field of a state)."""
    metadata = {**kwargs.pop("metadata", {}), "layout": Layout(category, batch_axis, memory)}
    return dataclasses.field(metadata=metadata, **kwargs)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One array of a state with its declared layout. `path` reads like attribute access,
    e.g. "store.host_pool" or "index_keys[1]"."""

    path: str
    value: Any
    layout: Layout


def _is_static(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("static"))


def leaves(state) -> Iterator[Leaf]:
    """Every array of `state` with its layout, in field order (nested states walked)."""
    yield from _walk(state, "")


def _walk(node, prefix: str) -> Iterator[Leaf]:
    if not dataclasses.is_dataclass(node):
        raise TypeError(f"layout.leaves: {prefix or 'the state'} is a {type(node).__name__}, not a state dataclass")
    for f in dataclasses.fields(node):
        if _is_static(f):
            continue
        value = getattr(node, f.name)
        path = f"{prefix}{f.name}"
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            yield from _walk(value, path + ".")
            continue
        layout = f.metadata.get("layout")
        if layout is None:
            raise TypeError(
                f"{type(node).__name__}.{f.name} declares no layout: declare it with "
                "hisparse_jax.layout.field(category, batch_axis, memory)"
            )
        if isinstance(value, tuple):
            for i, array in enumerate(value):
                yield Leaf(f"{path}[{i}]", array, layout)
        else:
            yield Leaf(path, value, layout)


def map_arrays(fn: Callable[..., Any], state, *others):
    """A copy of `state` with every array replaced by fn(leaf, *ys): `leaf` the array's Leaf
    (path, value, layout), ys the values at the same place in `others` (states of the same
    structure). Static fields and None stay as they are; the result has the state's pytree
    structure (e.g. a State of PartitionSpecs for shard_map)."""
    return _map(fn, state, others, "")


def _map(fn, node, others, prefix: str):
    changes = {}
    for f in dataclasses.fields(node):
        if _is_static(f):
            continue
        value = getattr(node, f.name)
        rest = [getattr(o, f.name) for o in others]
        path = f"{prefix}{f.name}"
        if value is None:
            continue
        if dataclasses.is_dataclass(value):
            changes[f.name] = _map(fn, value, rest, path + ".")
            continue
        lay = f.metadata["layout"]
        if isinstance(value, tuple):
            changes[f.name] = tuple(
                fn(Leaf(f"{path}[{i}]", v, lay), *(r[i] for r in rest)) for i, v in enumerate(value)
            )
        else:
            changes[f.name] = fn(Leaf(path, value, lay), *rest)
    return _replace(node, changes)


def _replace(node, changes: dict):
    """dataclasses.replace without __init__ checks: the values may be specs or shapes."""
    out = object.__new__(type(node))
    for f in dataclasses.fields(node):
        object.__setattr__(out, f.name, changes.get(f.name, getattr(node, f.name)))
    return out


def commit(state, sharding=None):
    """Every array of `state` committed: device-memory arrays to `sharding` (default: where they
    are), host-memory arrays (the pinned pool) where they are.

    Fresh jnp arrays are uncommitted while arrays out of a jitted prefill are committed; jit keys
    its cache on that, so a state built by init_state must match what prefill and generate
    return, or the first generate compiles twice. Tracers (init_state under jax.eval_shape, for
    byte accounts) pass through.
    """
    def place(x):
        if isinstance(x, jax.core.Tracer):
            return x
        stay = sharding is None or jax.typeof(x).memory_space == jax.memory.Space.Host
        return jax.device_put(x, x.sharding if stay else sharding)

    return jax.tree.map(place, state)

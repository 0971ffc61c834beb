"""The kit model's decode State: the store, the open pages, the lengths, and the indexer's
metadata, one value per selecting group.

Every field of the indexer's metadata dataclass becomes a field of the State holding a tuple of
the groups' arrays, with the layout the indexer declared on it. So a State is flat like every
family's (DSA's is store, tail, index_keys, index_scale, lengths: `state.index_keys[g]`), each
group's array is its own buffer (read and written in place by the unrolled step), and the byte
account, synthetic fill and sharding read the declaration through hisparse_jax.layout.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from .. import kv_store, layout
from ..kv_store import RecordStore
from . import checks


@functools.cache
def state_class(metadata_cls: type, records: bool = False) -> type:
    """The State class of a model whose indexer keeps `metadata_cls` (one class per metadata
    class, so a state's type says what it holds and jit sees one pytree structure); `records`:
    the indexer has a record kind of its own (kit.RecordKind), kept in `index_store` (a
    RecordStore: "hisparse" host pool + hot buffer, else device buffers; one layer per group)
    with its open records in `index_tail` (G arrays [b, page, width] on the device)."""
    fields = [("store", RecordStore),
              ("tail", tuple, layout.field(layout.OPEN_PAGE, batch_axis=0))]
    fields += [(f.name, tuple, dataclasses.field(metadata=f.metadata)) for f in dataclasses.fields(metadata_cls)]
    if records:
        fields += [("index_store", RecordStore), ("index_tail", tuple, layout.field(layout.OPEN_PAGE, batch_axis=0))]
    fields.append(("lengths", jax.Array, layout.field(layout.COUNTERS, batch_axis=0)))
    names = ", ".join(f.name for f in dataclasses.fields(metadata_cls))
    doc = (f"Decode state of a kit model whose indexer keeps {metadata_cls.__name__}.\n\n"
           "Attributes:\n  store: sealed records of every layer (host pool + hot buffer, or device).\n"
           "  tail: L arrays [b, P, W], the open page of each layer.\n"
           f"  {names}: the indexer metadata's fields, a tuple of G arrays (one per selecting group;\n"
           "    None where the indexer keeps none).\n"
           "  lengths: [b] int32 tokens held per stream (the next token's position).\n")
    cls = dataclasses.make_dataclass("State", fields, frozen=True, namespace={"METADATA": metadata_cls, "__doc__": doc})
    cls.__module__ = __name__
    return jax.tree_util.register_dataclass(cls)


def has_records(state) -> bool:
    """Whether the state keeps an indexer record kind (index_store, index_tail)."""
    return any(f.name == "index_store" for f in dataclasses.fields(state))


def metadata_names(state) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(state.METADATA))


def group_metadata(state, group: int):
    """Selecting group `group`'s metadata value, as the indexer made it (its own class)."""
    return state.METADATA(**{n: None if getattr(state, n) is None else getattr(state, n)[group]
                             for n in metadata_names(state)})


def metadata_fields(groups: list) -> dict[str, tuple | None]:
    """Per-group metadata values -> {field: tuple over groups, or None}: State fields."""
    out = {}
    for f in dataclasses.fields(groups[0]):
        values = [getattr(m, f.name) for m in groups]
        out[f.name] = None if values[0] is None else tuple(values)
    return out


def replace_metadata(state, groups: list, **changes):
    """`state` with the groups' metadata (and `changes` to the kit's own fields)."""
    return dataclasses.replace(state, **metadata_fields(groups), **changes)


def init_state(config, batch: int, mode: kv_store.Mode, sharding=None):
    """An empty state for `batch` streams; `mode` is "hisparse", "device" or "dense"."""
    c, indexer = config, config.indexer
    groups = [checks.check_metadata(indexer, c, batch, indexer.init_metadata(c, batch)) for _ in range(c.groups)]
    index = c.index_cache_config(batch)
    records = {}
    if index is not None:
        # "dense" selects nothing: the indexer's records are kept (device buffers) but never read.
        index_mode = "device" if mode == "dense" else mode
        records = dict(index_store=kv_store.init_store(index_mode, index, sharding, c.implementation),
                       index_tail=tuple(jnp.zeros((batch, index.page_size, index.record_width), index.dtype)
                                        for _ in range(c.groups)))
    state = state_class(type(groups[0]), index is not None)(
        store=kv_store.init_store(mode, c.cache_config(batch), sharding, c.implementation, c.prefetch),
        tail=tuple(jnp.zeros((batch, c.page_size, c.record_width), c.dtype) for _ in range(c.num_layers)),
        **metadata_fields(groups),
        **records,
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return layout.commit(state, sharding)

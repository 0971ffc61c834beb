"""Where sealed KV records live, behind one interface for the three decode modes.

- "hisparse": authoritative records in the pinned host pool, a hot buffer of B slots per stream
  on device; `locate` runs RESOLVE, `gather` reads the hot slots.
- "device":   every record in HBM, one buffer per layer; `gather` reads the selected records
  from it. The baseline HiSparse must match bit for bit.
- "dense":    like "device", but nothing is selected: `gather` hands attention the whole layer
  buffer in place (every sealed record, in position order, no gather).

Only placement differs between modes: the records attention sees are the same values, in the same
order, with the same shapes, whatever the mode (for "dense", the same as a selection of every id).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from . import _checks, layout
from .cache import HotCache, alloc_host_pool, init_hot_cache
from .config import CacheConfig
from .pool import write_records
from .prefetch import PendingFetch, join_prefetch, resolve_prefetch
from .resolve import resolve

Mode = Literal["hisparse", "device", "dense"]
MODES = ("hisparse", "device", "dense")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RecordStore:
    """Sealed records of every layer and stream.

    Attributes:
      sealed: [*S] int32, sealed records per stream (ids in [0, sealed) exist).
      host_pool: [L, *S, R, P, W] pinned_host ("hisparse"), else None.
      cache: HotCache on device ("hisparse"), else None.
      device_kv: L arrays [*S, R, P, W] on device, one per layer ("device", "dense"), else None.
      mode: static.
      fetch: static; False makes RESOLVE skip copying missed records into the hot buffer
        (benchmarks of the pure resolve cost: what attention reads is then stale). Slots,
        misses and LRU state are what they would be.
      implementation: static; RESOLVE's implementation ("auto", "ffi", "reference").
      prefetch: static; True makes every layer's RESOLVE copy its misses off the compute stream
        (hisparse_jax.prefetch), joined right before the layer reads them (`await_located`).
    """

    sealed: jax.Array = layout.field(layout.COUNTERS, batch_axis=0)
    host_pool: jax.Array | None = layout.field(layout.KV_RECORDS, batch_axis=1, memory=layout.PINNED_HOST)
    cache: HotCache | None = dataclasses.field(default=None)
    device_kv: tuple[jax.Array, ...] | None = layout.field(layout.KV_RECORDS, batch_axis=0, default=None)
    mode: str = dataclasses.field(default="hisparse", metadata=dict(static=True))
    fetch: bool = dataclasses.field(default=True, metadata=dict(static=True))
    implementation: str = dataclasses.field(default="auto", metadata=dict(static=True))
    prefetch: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def num_layers(self) -> int:
        return self.host_pool.shape[0] if self.mode == "hisparse" else len(self.device_kv)


def init_store(mode: Mode, config: CacheConfig, sharding=None, implementation: str = "auto",
               prefetch: bool = False) -> RecordStore:
    """An empty store: no sealed records. `prefetch` matters in "hisparse" mode only."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(prefetch, bool):
        raise ValueError(f"prefetch must be True or False, got {prefetch!r}")
    # Committed like every array a jitted prefill/decode returns, so the first
    # decode call does not compile a second program for uncommitted inputs.
    device = sharding if sharding is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sealed = jax.device_put(jnp.zeros(config.stream_shape, jnp.int32), device)
    if mode == "hisparse":
        return RecordStore(
            sealed=sealed, host_pool=alloc_host_pool(config, sharding), cache=init_hot_cache(config, sharding),
            mode=mode, implementation=implementation, prefetch=prefetch,
        )
    layer_shape = config.pool_shape[1:]
    kv = tuple(jax.device_put(jnp.zeros(layer_shape, config.dtype), device) for _ in range(config.num_layers))
    return RecordStore(sealed=sealed, host_pool=None, device_kv=kv, mode=mode, implementation=implementation)


def _write_layer(kv, records, start, count):
    """kv[s, start[s] + i] = records[s, i] for i < count[s] (one layer's device buffer)."""
    ns = start.ndim
    n, R = records.shape[ns], kv.shape[ns]
    i = jnp.arange(n, dtype=jnp.int32)
    target = start[..., None] + i
    target = jnp.where((i < count[..., None]) & (target < R), target, R)  # R: dropped
    put = lambda kv_s, rec_s, tgt_s: kv_s.at[tgt_s].set(rec_s, mode="drop")
    for _ in range(ns):
        put = jax.vmap(put)
    return put(kv, records, target)


def write_sealed(store: RecordStore, records: jax.Array, count: jax.Array) -> RecordStore:
    """Appends `count[s]` new sealed records per stream at ids sealed[s], sealed[s]+1, ...

    Args:
      records: [L, *S, n, P, W] on device.
      count: [*S] int32 in [0, n] (prefill: prompt pages; decode: 0 or 1).
    Writes past the pool's R records are an error in eager code and are reported by
    write_records(checked=True) under jit; model configs size R for the longest context.
    """
    _checks.check_int32("write_sealed", "count", count)  # before the cast below (a cast wraps)
    count = jnp.asarray(count, jnp.int32)
    if store.mode == "hisparse":
        pool = write_records(store.host_pool, records, store.sealed, count)
        return dataclasses.replace(store, host_pool=pool, sealed=store.sealed + count)
    kv = tuple(_write_layer(kv, records[l], store.sealed, count) for l, kv in enumerate(store.device_kv))
    return dataclasses.replace(store, device_kv=kv, sealed=store.sealed + count)


def write_open_page(store: RecordStore, layer: int, page: jax.Array) -> RecordStore:
    """Writes the open page [*S, P, W] of `layer` at record id `sealed` of its device buffer
    ("device", "dense"; a no-op for "hisparse", whose pool gets whole pages when they seal).

    The decode step writes its token through, before the layer reads the buffer: the read then
    depends on the write and XLA updates the buffer in place. (Writing only when a page seals,
    after the reads, would leave the write unordered against them, and XLA copies the whole
    buffer to keep the reads safe.) Ids >= sealed are never attended, so the open page there
    changes nothing until it seals and `sealed` counts it.
    """
    if store.mode == "hisparse":
        return store
    kv = store.device_kv[layer]
    updated = _write_layer(kv, page[..., None, :, :].astype(kv.dtype), store.sealed, jnp.ones_like(store.sealed))
    return dataclasses.replace(store, device_kv=(*store.device_kv[:layer], updated, *store.device_kv[layer + 1 :]))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Located:
    """Where one layer's selected records are.

    Attributes:
      index: [*S, k] int32 rows of the layer's source to read (hot slots, or record ids).
      valid: [*S, k] bool, selected ids that are neither padding nor invalid.
      misses: [*S] int32 records RESOLVE fetched (0 outside "hisparse").
      pending: the copy still in flight (a prefetching store), until `await_located`; else None.
    """

    index: jax.Array
    valid: jax.Array
    misses: jax.Array
    pending: PendingFetch | None = None


def locate(store: RecordStore, layer: int, selection: jax.Array, slot: int | None = None,
           streams: tuple[int, int] | None = None) -> tuple[Located, RecordStore]:
    """Makes one layer's selected records readable: RESOLVE ("hisparse") or nothing ("device").

    Args:
      layer: the layer (a Python int).
      selection: [*S, k] int32 record ids, -1 = padding.
      slot: the prefetch slot of this call (default: the layer; one per resolve of a step).
      streams: (begin, count), RESOLVE's stream range (default: every stream): only those
        streams are resolved; `index` and `misses` of the others are padding's (-1, 0), so
        read only the range's rows.
    """
    if store.mode == "dense":
        raise ValueError('locate: a "dense" store attends to every record in place; nothing is selected')
    R = (store.host_pool.shape[1 + store.sealed.ndim] if store.mode == "hisparse"
         else store.device_kv[layer].shape[store.sealed.ndim])
    valid = (selection >= 0) & (selection < jnp.minimum(store.sealed, R)[..., None])
    begin, count = streams if streams is not None else (0, None)
    if store.mode == "hisparse" and store.prefetch:
        # The layer number keys the copy: one slot per layer, joined before that layer reads.
        result, cache, pending = resolve_prefetch(store.cache, store.host_pool, selection, store.sealed, layer,
                                                  slot=layer if slot is None else slot, implementation=store.implementation,
                                                  fetch=store.fetch, stream_begin=begin, stream_count=count)
        return Located(result.slots, valid, result.misses, pending), dataclasses.replace(store, cache=cache)
    if store.mode == "hisparse":
        result, cache = resolve(store.cache, store.host_pool, selection, store.sealed, layer,
                                implementation=store.implementation, fetch=store.fetch, stream_begin=begin,
                                stream_count=count)
        return Located(result.slots, valid, result.misses), dataclasses.replace(store, cache=cache)
    return Located(selection, valid, jnp.zeros(store.sealed.shape, jnp.int32)), store


def await_located(store: RecordStore, located: Located | None, after) -> tuple[Located | None, RecordStore]:
    """Joins a located layer's copy in flight (a prefetching store) before the layer reads its
    records; anything else is returned as it is.

    Args:
      after: what the copy overlaps: the join runs once `after` is computed (the layer's own
        input, e.g. its open page with this step's token: everything before the layer).
    """
    if located is None or located.pending is None:
        return located, store
    cache, misses = join_prefetch(store.cache, located.pending, after)
    return dataclasses.replace(located, misses=misses, pending=None), dataclasses.replace(store, cache=cache)


def read_in_place(store: RecordStore, layer: int, located: Located | None):
    """What one layer's attention reads, for a kernel that reads records by index where they live
    (hisparse_jax.sparse_attention): no gathered copy, unlike `gather`.

    Args:
      located: where the selection is (`locate`), or None in "dense" mode (every record).
    Returns:
      (source, source_layer, index): "hisparse": the stacked hot buffer [L, *S, B, P, W], passed
      whole with source_layer = layer picking this layer's (XLA then copies no layer out of it);
      "device" and "dense": the layer's device buffer [*S, R, P, W], source_layer None. index
      [*S, k] int32 rows of it in selection order, -1 where the selection is padding or invalid
      ("dense": every record, k = R, -1 from `sealed` on), so a read attends exactly the records
      `gather` returns as valid, in the same order.
    """
    if store.mode == "dense":
        kv = store.device_kv[layer]
        ids = jnp.arange(kv.shape[store.sealed.ndim], dtype=jnp.int32)
        return kv, None, jnp.where(ids < store.sealed[..., None], ids, -1)
    index = jnp.where(located.valid, located.index, -1)
    if store.mode == "hisparse":
        return store.cache.hot, layer, index
    return store.device_kv[layer], None, index


def gather(store: RecordStore, layer: int, located: Located | None):
    """The records one layer attends to, in selection order, and which are valid.

    Args:
      located: where the selection is (`locate`), or None in "dense" mode: every record of the
        layer, read in place (k = R).
    Returns:
      records [*S, k, P, W] (zeros where the selection is padding or invalid; "dense": the layer
      buffer itself), valid [*S, k] bool.
    """
    if store.mode == "dense":
        kv = store.device_kv[layer]
        return kv, jnp.arange(kv.shape[store.sealed.ndim], dtype=jnp.int32) < store.sealed[..., None]
    source = store.cache.hot[layer] if store.mode == "hisparse" else store.device_kv[layer]
    take = lambda src, idx: src[jnp.clip(idx, 0, src.shape[0] - 1)]
    for _ in range(located.index.ndim - 1):
        take = jax.vmap(take)
    rows = take(source, located.index)
    mask = located.valid.reshape(*located.valid.shape, *([1] * (rows.ndim - located.valid.ndim)))
    return jnp.where(mask, rows, jnp.zeros((), rows.dtype)), located.valid

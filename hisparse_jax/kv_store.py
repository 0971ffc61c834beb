"""Where sealed KV records live, behind one interface for the three decode modes.

- "hisparse": authoritative records in the pinned host pool, a hot buffer of B
  slots per stream on device; `gather_selected` runs RESOLVE and reads hot slots.
- "device":   every record in HBM ([L, *S, R, ...]); `gather_selected` reads the
  same records directly. The baseline HiSparse must match bit for bit.
- "dense":    like "device"; models attend to every sealed record instead of a
  selection (selection = all ids in position order).

Only placement differs between modes: `gather_selected` returns the same
records, in selection order, with zeros at padding, whatever the mode.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from .cache import HotCache, alloc_host_pool, init_hot_cache
from .config import CacheConfig
from .pool import write_records
from .resolve import ResolveResult, resolve

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
      device_kv: [L, *S, R, P, W] on device ("device", "dense"), else None.
      mode: static.
      fetch: static; False makes RESOLVE skip copying missed records into the
        hot buffer (benchmarks of the pure resolve cost: what attention reads is
        then stale). Slots, misses and LRU state are what they would be.
    """

    sealed: jax.Array
    host_pool: jax.Array | None
    cache: HotCache | None
    device_kv: jax.Array | None
    mode: str = dataclasses.field(metadata=dict(static=True))
    fetch: bool = dataclasses.field(default=True, metadata=dict(static=True))


def init_store(mode: Mode, config: CacheConfig, sharding=None) -> RecordStore:
    """An empty store: no sealed records."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    # Committed like every array a jitted prefill/decode returns, so the first
    # decode call does not compile a second program for uncommitted inputs.
    device = sharding if sharding is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sealed = jax.device_put(jnp.zeros(config.stream_shape, jnp.int32), device)
    if mode == "hisparse":
        return RecordStore(
            sealed=sealed,
            host_pool=alloc_host_pool(config, sharding),
            cache=init_hot_cache(config, sharding),
            device_kv=None,
            mode=mode,
        )
    kv = jax.device_put(jnp.zeros(config.pool_shape, config.dtype), device)
    return RecordStore(sealed=sealed, host_pool=None, cache=None, device_kv=kv, mode=mode)


def _write_device(kv, records, start, count):
    """kv[l, s, start[s] + i] = records[l, s, i] for i < count[s] (device array)."""
    ns = start.ndim
    n, R = records.shape[1 + ns], kv.shape[1 + ns]
    i = jnp.arange(n, dtype=jnp.int32)
    target = start[..., None] + i
    target = jnp.where((i < count[..., None]) & (target < R), target, R)  # R: dropped

    def per_stream(kv_s, rec_s, tgt_s):
        return kv_s.at[tgt_s].set(rec_s, mode="drop")

    stream_fn = per_stream
    for _ in range(ns):
        stream_fn = jax.vmap(stream_fn)
    return jax.vmap(stream_fn, in_axes=(0, 0, None))(kv, records, target)


def write_sealed(store: RecordStore, records: jax.Array, count: jax.Array) -> RecordStore:
    """Appends `count[s]` new sealed records per stream at ids sealed[s], sealed[s]+1, ...

    Args:
      records: [L, *S, n, P, W] on device.
      count: [*S] int32 in [0, n] (prefill: prompt pages; decode: 0 or 1).
    Writes past the pool's R records are an error in eager code and are
    reported by write_records(checked=True) under jit; callers size R for the
    longest context (model configs check this at construction).
    """
    count = jnp.asarray(count, jnp.int32)
    if store.mode == "hisparse":
        pool = write_records(store.host_pool, records, store.sealed, count)
        return dataclasses.replace(store, host_pool=pool, sealed=store.sealed + count)
    kv = _write_device(store.device_kv, records, store.sealed, count)
    return dataclasses.replace(store, device_kv=kv, sealed=store.sealed + count)


def gather_selected(
    store: RecordStore, layer, selection: jax.Array, *, implementation: str = "auto"
) -> tuple[jax.Array, jax.Array, ResolveResult | None, RecordStore]:
    """The selected records of one layer, in selection order.

    Args:
      layer: int32 scalar (may be traced, e.g. the index of a scan over layers).
      selection: [*S, k] int32 record ids, -1 = padding.

    Returns:
      records: [*S, k, P, W], zeros where selection is padding or invalid.
      valid: [*S, k] bool.
      resolve result (None outside "hisparse").
      the updated store (hot buffers after RESOLVE).
    """
    R = (store.host_pool if store.mode == "hisparse" else store.device_kv).shape[1 + store.sealed.ndim]
    valid = (selection >= 0) & (selection < jnp.minimum(store.sealed, R)[..., None])
    if store.mode == "hisparse":
        result, cache = resolve(
            store.cache, store.host_pool, selection, store.sealed, layer, implementation=implementation,
            fetch=store.fetch,
        )
        source, index = cache.hot[layer], result.slots
        store = dataclasses.replace(store, cache=cache)
    else:
        result = None
        source, index = store.device_kv[layer], selection
    ns = selection.ndim - 1
    take = lambda src, idx: src[jnp.clip(idx, 0, src.shape[0] - 1)]
    for _ in range(ns):
        take = jax.vmap(take)
    rows = take(source, index)
    mask = valid.reshape(*valid.shape, *([1] * (rows.ndim - valid.ndim)))
    records = jnp.where(mask, rows, jnp.zeros((), rows.dtype))
    return records, valid, result, store

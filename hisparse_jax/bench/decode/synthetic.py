"""Decode states holding `context` tokens of synthetic data, built without a prefill.

A dense prefill costs O(T^2) per layer: at 128K tokens and the batch of a capacity wall it would
take far longer than the decode it prepares. Timing a decode needs a state of the right shapes
holding non-zero data (never time on zeros), not the state of one particular prompt. So the
arrays of the state are filled with a counter-based hash of their element index (uniform, unit
variance), in place, by what their declared layout (hisparse_jax.layout) says they hold:

- a RecordStore's records: the host pool ("hisparse") in chunks through the pool-write FFI call
  (no device buffer of the pool's size is ever needed), the per-layer device KV in one jitted
  call; a record gets the same bytes in both, so "hisparse" and "device" states decode to the
  same tokens, bit for bit; `sealed` = context // the store's page (page_size for the KV, a kit
  indexer's RecordKind.page for its own records); hot caches stay empty (the first
  decode steps fill them, as after a real prefill);
- counters: `lengths` = context;
- every other array (open pages, indexer metadata, windows, compressed KV) hashed, in one
  jitted call with the state donated.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from ... import layout
from ...kv_store import RecordStore
from ...pool import write_records_inplace

MiB = 2**20


def _salt(name: str, seed: int) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit integer finalizer (murmur3's fmix32): neighbouring inputs -> unrelated outputs."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def hashed(shape: tuple[int, ...], dtype, salt: int, *, full_shape: tuple[int, ...] | None = None,
           offset_axis: int | None = None, offset=0) -> jax.Array:
    """Uniform values in [-sqrt 3, sqrt 3) (unit variance) from each element's index.

    Element (i_0, ..., i_n) of an array of `full_shape` gets a value that depends
    on (row, i_n, salt), row being the linear index of (i_0, ..., i_{n-1}). A
    block of `shape` starting at `offset` along `offset_axis` (< n; the offset
    may be traced) gets exactly the values it has in the full array.
    """
    full_shape = shape if full_shape is None else full_shape
    row = jnp.zeros(shape[:-1], jnp.uint32)
    for axis in range(len(shape) - 1):
        index = jax.lax.broadcasted_iota(jnp.uint32, shape[:-1], axis)
        if axis == offset_axis:
            index = index + jnp.asarray(offset, jnp.uint32)
        row = row * jnp.uint32(full_shape[axis]) + index
    col = jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
    bits = _mix(_mix(row[..., None] ^ jnp.uint32(salt)) + col * jnp.uint32(0x9E3779B9))
    unit = (bits >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # [0, 1)
    return ((unit * 2.0 - 1.0) * np.sqrt(3.0)).astype(dtype)


def synthetic_state(family: ModuleType, config, batch: int, mode: str, context: int, seed: int = 0,
                    chunk_bytes: int = 512 * MiB):
    """`family.init_state(config, batch, mode)` holding `context` tokens per stream.

    Args:
      context: tokens per stream, in [1, config.max_context - 1] (room to decode).
      chunk_bytes: bytes per pool-write call while filling the host pool.
    """
    if not 1 <= context < config.max_context:
        raise ValueError(
            f"synthetic_state: context={context} must lie in [1, Config.max_context - 1 = "
            f"{config.max_context - 1}] so that decode steps have room"
        )
    state = family.init_state(config, batch, mode)
    stores = [f.name for f in dataclasses.fields(state) if isinstance(getattr(state, f.name), RecordStore)]
    in_store = lambda leaf: leaf.path.split(".", 1)[0] in stores
    others = [leaf for leaf in layout.leaves(state) if not in_store(leaf)]
    plans = tuple(_plan(leaf, context, seed) for leaf in others)
    filled = dict(zip((leaf.path for leaf in others), _fill_device(plans, tuple(leaf.value for leaf in others))))
    state = layout.map_arrays(lambda leaf: filled.get(leaf.path, leaf.value), state)
    # Each store seals whole records of its own page (the KV's page_size, or a kit indexer's
    # record kind: kit.RecordKind.page).
    changes = {name: _fill_store(getattr(state, name), context // _store_page(getattr(state, name)),
                                 _salt(name, seed), chunk_bytes) for name in stores}
    # Committed, like the arrays a jitted decode returns (one compiled program for every call).
    return layout.commit(dataclasses.replace(state, **changes))


def _plan(leaf: layout.Leaf, context: int, seed: int) -> tuple:
    """What one array becomes: ("const", value) for counters, ("hash", salt) for data."""
    if leaf.layout.category == layout.COUNTERS:
        if not leaf.path.endswith("lengths"):
            raise ValueError(f"synthetic_state: no fill rule for the counter {leaf.path}")
        return ("const", context)
    if not jnp.issubdtype(leaf.value.dtype, jnp.floating):
        raise ValueError(
            f"synthetic_state: no fill rule for the integer array {leaf.path}; teach "
            "hisparse_jax.bench.decode.synthetic what it holds"
        )
    return ("hash", _salt(leaf.path, seed))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _fill_device(plans, arrays):
    out = []
    for (kind, value), array in zip(plans, arrays):
        if kind == "const":
            out.append(jnp.full(array.shape, value, array.dtype))
        else:
            out.append(hashed(array.shape, array.dtype, value))
    return tuple(out)


def _store_page(store: RecordStore) -> int:
    """Tokens per record of a store (its records are [..., R, page, W])."""
    return (store.host_pool if store.mode == "hisparse" else store.device_kv[0]).shape[-2]


def _fill_store(store: RecordStore, sealed: int, salt: int, chunk_bytes: int) -> RecordStore:
    """The store holding records [0, sealed) of every stream and layer: record (l, s, r) gets the
    values it has in a hashed [L, *S, R, P, W] array, in the host pool and the device KV alike."""
    sealed_ids = jnp.full(store.sealed.shape, sealed, jnp.int32)
    if store.mode == "hisparse":
        pool = _fill_pool(store.host_pool, sealed, salt, chunk_bytes)
        return dataclasses.replace(store, host_pool=pool, sealed=sealed_ids)
    L = len(store.device_kv)
    shape = (L, *store.device_kv[0].shape)
    kv = tuple(_device_layer(shape, store.device_kv[0].dtype, salt, l) for l in range(L))
    return dataclasses.replace(store, device_kv=kv, sealed=sealed_ids)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _device_layer(full_shape, dtype, salt, layer):
    block = hashed((1, *full_shape[1:]), dtype, salt, full_shape=full_shape, offset_axis=0, offset=layer)
    return block[0]


def _fill_pool(pool: jax.Array, sealed: int, salt: int, chunk_bytes: int) -> jax.Array:
    """Writes records [0, sealed) of every stream and layer of the pool, a chunk of ids at a time."""
    L, *streams, R, P, W = pool.shape
    per_id = L * int(np.prod(streams)) * P * W * pool.dtype.itemsize
    chunk = int(max(1, min(sealed, chunk_bytes // per_id)))
    start_shape = tuple(streams)
    for first in range(0, sealed, chunk):
        records = _pool_chunk(tuple(pool.shape), pool.dtype, salt, chunk, jnp.uint32(first))
        count = jnp.full(start_shape, min(chunk, sealed - first), jnp.int32)
        pool = write_records_inplace(pool, records, jnp.full(start_shape, first, jnp.int32), count)
    return pool


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _pool_chunk(pool_shape, dtype, salt, chunk, first):
    """Records [first, first + chunk) of every stream, [L, *S, chunk, P, W], with the values
    they have in the full pool (and in a device KV of the same shape). One compile for all chunks."""
    L, *streams, R, P, W = pool_shape
    return hashed((L, *streams, chunk, P, W), dtype, salt, full_shape=pool_shape,
                  offset_axis=1 + len(streams), offset=first)


def without_fetch(state):
    """`state` whose RESOLVE calls skip the record copy (no-IO benchmark runs): the KV's, and a kit
    indexer's own records' (state.index_store, whose stale hot slots then steer its selection:
    a timing run, like the KV's stale records)."""
    changes = {name: dataclasses.replace(getattr(state, name), fetch=False)
               for name in ("store", "index_store") if isinstance(getattr(state, name, None), RecordStore)}
    return dataclasses.replace(state, **changes)

"""Decode states holding `context` tokens of synthetic data, built without a prefill.

A dense prefill costs O(T^2) per layer: at 128K tokens and the batch of a
capacity wall it would take far longer than the decode it prepares. Timing a
decode needs a state of the right shapes holding non-zero data (never time on
zeros), not the state of one particular prompt. So every array of the state
is filled with a counter-based hash of its element index (uniform, unit
variance), in place:

- the host pool ("hisparse") in chunks through the pool-write FFI call, so no
  device buffer of the pool's size is ever needed;
- every device array in one jitted call with the state donated;
- lengths = context and sealed = context // page_size; hot caches stay empty
  (the first decode steps fill them, as after a real prefill).

A record gets the same bytes in the host pool and in the device KV, so
"hisparse" and "device" states decode to the same tokens, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from .. import traces
from ..models import common
from ..pool import write_records_inplace

MiB = 2**20

# Leaves of a state that are not filled with hashed values (last path component).
_COUNTERS = ("lengths", "sealed")
_RECORDS = ("host_pool", "device_kv")  # one content: a record's bytes do not depend on the mode
_CACHE = ("hot", "slot_record", "lru")  # hot caches start empty


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path).rsplit(".", 1)[-1].split("[", 1)[0]


def _salt(path, seed: int) -> int:
    """A per-array salt: the records' is shared by host pool and device KV."""
    name = jax.tree_util.keystr(path)
    for records in _RECORDS:
        name = name.replace(records, "records")
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
    sealed = context // config.page_size
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    pool_at = [i for i, (path, _) in enumerate(leaves) if _leaf_name(path) == "host_pool"]
    device_at = [i for i, (path, _) in enumerate(leaves) if _leaf_name(path) not in ("host_pool", *_CACHE)]
    plans = tuple(_plan(path, leaf, context, sealed, seed) for path, leaf in (leaves[i] for i in device_at))
    values = [leaf for _, leaf in leaves]
    filled = _fill_device(plans, tuple(values[i] for i in device_at))
    for i, array in zip(device_at, filled):
        values[i] = array
    for i in pool_at:
        path, pool = leaves[i]
        values[i] = _fill_pool(pool, sealed, _salt(path, seed), chunk_bytes)
    # Committed, like the arrays a jitted decode returns (one compiled program for every call).
    return common.commit(jax.tree_util.tree_unflatten(treedef, values))


def _plan(path, leaf, context: int, sealed: int, seed: int) -> tuple:
    """What one device array becomes: ("const", value) for counters, ("hash", salt) for data."""
    name = _leaf_name(path)
    if name in _COUNTERS:
        return ("const", context if name == "lengths" else sealed)
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
        raise ValueError(
            f"synthetic_state: no fill rule for the integer array {jax.tree_util.keystr(path)}; "
            "teach hisparse_jax.bench.synthetic what it holds"
        )
    return ("hash", _salt(path, seed))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _fill_device(plans, arrays):
    out = []
    for (kind, value), array in zip(plans, arrays):
        if kind == "const":
            out.append(jnp.full(array.shape, value, array.dtype))
        else:
            out.append(hashed(array.shape, array.dtype, value))
    return tuple(out)


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


def with_trace(family: ModuleType, config, state, trace_config: traces.TraceConfig, seed: int = 0):
    """`state` with a TraceState of `family.trace_layout` steering its selection."""
    layers, streams, records = family.trace_layout(config, state.lengths.shape[0])
    trace = traces.init_trace(trace_config, layers, streams, records, seed=seed)
    return dataclasses.replace(state, trace=trace)


def without_fetch(state):
    """`state` whose RESOLVE skips the record copy (no-IO benchmark runs)."""
    return dataclasses.replace(state, store=dataclasses.replace(state.store, fetch=False))

"""Trace-time checks of op operands, with messages a user can act on: RESOLVE's and the pool
write's here in full, and the shape and dtype readers the other ops' checks share."""

from __future__ import annotations

import jax
import numpy as np


def is_host(x) -> bool:
    """True when `x` (an array or tracer) lives in host memory (pinned_host)."""
    return jax.typeof(x).memory_space == jax.memory.Space.Host


def _shape(x):
    return tuple(jax.typeof(x).shape)


def _dtype(x):
    return np.dtype(jax.typeof(x).dtype)


def shape_of(x) -> tuple[int, ...]:
    """The shape of an array, tracer or array-like (np.shape: also a list or a scalar)."""
    return tuple(np.shape(x))


def dtype_of(x) -> np.dtype:
    """The dtype of an array or tracer, or the one numpy gives an array-like."""
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


_INT32 = np.iinfo(np.int32)


def check_int32(op: str, name: str, x) -> None:
    """x must be int32. A value known now (NumPy array or scalar, Python int or list, a concrete
    jax array) is range-checked first: JAX turns an int64 NumPy array into int32 without x64 by
    dropping the high bits, so id 2**32 + 1 would arrive as id 1. A traced value has no value
    yet: its dtype must be int32 (an int64 one under x64 is refused, not cast)."""
    concrete = not isinstance(x, jax.core.Tracer)
    host = np.asarray(x) if not isinstance(x, jax.Array) else None
    if host is not None and host.dtype.kind == "O":
        raise TypeError(f"{op}: {name} must be int32, got Python objects; pass a NumPy or JAX int32 array")
    dtype = host.dtype if host is not None else _dtype(x)
    if concrete and dtype.kind in "iu" and dtype != np.int32:
        values = host if host is not None else np.asarray(jax.device_get(x))
        if values.size:
            low, high = values.min(), values.max()
            if low < _INT32.min or high > _INT32.max:
                bad = int(low) if low < _INT32.min else int(high)
                raise ValueError(
                    f"{op}: {name} holds {bad}, outside int32 [{_INT32.min}, {_INT32.max}]; ids, counts and "
                    "lengths are int32 here, so fix the value rather than cast it (a cast would wrap)"
                )
        if host is not None:
            return  # a host value in range: the op casts it
    if dtype != np.int32:
        raise TypeError(f"{op}: {name} must be int32, got {dtype}; cast it with .astype(jnp.int32) once its values "
                        "are known to fit int32 (a cast wraps the others)")


def check_pool(op: str, host_pool, need_host: bool) -> None:
    if need_host and not is_host(host_pool):
        raise ValueError(
            f"{op}: host_pool must live in pinned_host memory (got memory space "
            f"{jax.typeof(host_pool).memory_space}); allocate it with "
            "hisparse_jax.alloc_host_pool or jax.device_put(pool, "
            "sharding.with_memory_kind('pinned_host')), and keep it out of jnp ops"
        )


def check_record_bytes(op: str, host_pool, stream_rank: int) -> int:
    rec = _shape(host_pool)[2 + stream_rank :]
    nbytes = int(np.prod(rec, dtype=np.int64)) * _dtype(host_pool).itemsize
    if nbytes <= 0 or nbytes % 8:
        raise ValueError(
            f"{op}: a record of host_pool is {nbytes} bytes (shape {rec}, {_dtype(host_pool)}); "
            "it must be a positive multiple of 8: pad record_width"
        )
    return nbytes


def check_resolve(cache, host_pool, selection, sealed, layer, *, need_host: bool) -> None:
    op = "resolve"
    check_int32(op, "selection", selection)
    check_int32(op, "sealed", sealed)
    check_int32(op, "cache.slot_record", cache.slot_record)
    check_int32(op, "cache.lru", cache.lru)
    sel = _shape(selection)
    if len(sel) < 1:
        raise ValueError(f"{op}: selection must be [*streams, k], got a scalar")
    streams, k = sel[:-1], sel[-1]
    ns = len(streams)
    if _shape(sealed) != streams:
        raise ValueError(
            f"{op}: sealed has shape {_shape(sealed)}, expected the stream shape {streams} "
            "of selection [*streams, k]"
        )
    rec_shape, pool = _shape(cache.slot_record), _shape(host_pool)
    if len(pool) < ns + 2 or pool[1 : 1 + ns] != streams:
        raise ValueError(
            f"{op}: host_pool has shape {pool}, expected [L, *streams, R, *record] with "
            f"streams = {streams} (from selection)"
        )
    L = pool[0]
    if rec_shape[:-1] != (L, *streams) or len(rec_shape) != ns + 2:
        raise ValueError(
            f"{op}: cache.slot_record has shape {rec_shape}, expected [L, *streams, B] = "
            f"[{L}, {', '.join(map(str, streams))}, B] to match host_pool {pool}"
        )
    if _shape(cache.lru) != rec_shape:
        raise ValueError(f"{op}: cache.lru has shape {_shape(cache.lru)}, expected {rec_shape}")
    B = rec_shape[-1]
    hot = _shape(cache.hot)
    if hot != (L, *streams, B, *pool[2 + ns :]):
        raise ValueError(
            f"{op}: cache.hot has shape {hot}, expected [L, *streams, B, *record] = "
            f"{(L, *streams, B, *pool[2 + ns:])}"
        )
    if _dtype(cache.hot) != _dtype(host_pool):
        raise TypeError(
            f"{op}: cache.hot is {_dtype(cache.hot)} but host_pool is {_dtype(host_pool)}; "
            "records are copied bit for bit, so both must have one dtype"
        )
    if B < k:
        raise ValueError(
            f"{op}: hot_slots B={B} < top_k k={k}: every selected record needs a slot; "
            "use a cache with hot_slots >= k or select fewer records"
        )
    check_record_bytes(op, host_pool, ns)
    check_pool(op, host_pool, need_host)
    if isinstance(layer, (int, np.integer)):
        if not 0 <= layer < L:
            raise ValueError(f"{op}: layer={layer} is outside [0, {L}) (host_pool has L={L} layers)")
    else:
        check_int32(op, "layer", layer)
        if _shape(layer) != ():
            raise ValueError(f"{op}: layer must be a scalar, got shape {_shape(layer)}")


def check_stream_range(op: str, selection, stream_begin, stream_count) -> tuple[int, int]:
    """(begin, count) of RESOLVE's stream range over the flattened streams of `selection`
    [*S, k] (docs/contract.md "Stream range"): stream_count None means through the last stream.
    Both must be static ints (the launch's grid depends on them); checked as Python ints, before
    any cast, so a huge value is named rather than wrapped."""
    streams = int(np.prod(_shape(selection)[:-1], dtype=np.int64))
    values = {}
    for name, value in (("stream_begin", stream_begin), ("stream_count", stream_count)):
        if name == "stream_count" and value is None:
            value = max(streams - values["stream_begin"], 0)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{op}: {name} must be a Python int (a static stream index, fixed at trace time), "
                            f"got {type(value).__name__}; a traced value cannot size the launch")
        values[name] = int(value)
    begin, count = values["stream_begin"], values["stream_count"]
    if begin < 0:
        raise ValueError(f"{op}: stream_begin={begin} must be >= 0 (the first stream resolved)")
    if count < 0:
        raise ValueError(f"{op}: stream_count={count} must be >= 0 (0 resolves no stream; None: every stream "
                         "from stream_begin on)")
    if begin + count > streams:
        raise ValueError(f"{op}: stream_begin + stream_count = {begin} + {count} exceeds the {streams} streams of "
                         f"selection (flattened stream shape {_shape(selection)[:-1]}); pick a range inside "
                         f"[0, {streams})")
    return begin, count


def check_pool_write(host_pool, records, start, count, *, need_host: bool) -> None:
    op = "write_records"
    check_int32(op, "start", start)
    check_int32(op, "count", count)
    streams = _shape(start)
    ns = len(streams)
    if _shape(count) != streams:
        raise ValueError(f"{op}: count has shape {_shape(count)}, expected the shape {streams} of start")
    pool, rec = _shape(host_pool), _shape(records)
    if len(pool) < ns + 2 or pool[1 : 1 + ns] != streams:
        raise ValueError(
            f"{op}: host_pool has shape {pool}, expected [L, *streams, R, *record] with "
            f"streams = {streams} (from start)"
        )
    if len(rec) != len(pool) or rec[0] != pool[0] or rec[1 : 1 + ns] != streams or rec[2 + ns :] != pool[2 + ns :]:
        raise ValueError(
            f"{op}: records has shape {rec}, expected [L, *streams, n, *record] = "
            f"[{pool[0]}, {', '.join(map(str, streams))}, n, {', '.join(map(str, pool[2 + ns:]))}]"
        )
    if _dtype(records) != _dtype(host_pool):
        raise TypeError(f"{op}: records is {_dtype(records)} but host_pool is {_dtype(host_pool)}")
    if is_host(records):
        raise ValueError(f"{op}: records must be on device (they come from the model), not in host memory")
    check_record_bytes(op, host_pool, ns)
    check_pool(op, host_pool, need_host)

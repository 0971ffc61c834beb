"""Writes into the pinned host pool: prefill and pages sealed during decode, in place."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from . import _bits, _checks, _dispatch, targets


def rows_outside_pool(host_pool_records: int, start, count, rows: int):
    """[*streams] int32: rows of a write that would land outside [0, R) or beyond `rows`."""
    _checks.check_int32("rows_outside_pool", "start", start)  # before the casts below
    _checks.check_int32("rows_outside_pool", "count", count)
    count = jnp.asarray(count, jnp.int32)
    start = jnp.asarray(start, jnp.int32)
    asked = jnp.maximum(count, 0)
    usable = jnp.minimum(asked, rows)
    i = jnp.arange(rows, dtype=jnp.int32)
    target = start[..., None] + i
    landed = (i < usable[..., None]) & (target >= 0) & (target < host_pool_records)
    return asked - jnp.sum(landed, axis=-1, dtype=jnp.int32)


def write_records(
    host_pool: jax.Array,
    records: jax.Array,
    start: jax.Array,
    count: jax.Array | None = None,
    *,
    implementation: str = "auto",
    checked: bool = False,
) -> jax.Array:
    """host_pool[l, s, start[s] + i] = records[l, s, i] for i < count[s], every layer l.

    Args:
      host_pool: [L, *S, R, *rec] pinned_host pool (donate it to write in place).
      records: [L, *S, n, *rec] on device: n records per stream and layer.
      start: [*S] int32 first record id to write per stream.
      count: [*S] int32 records to write per stream (default n); 0 skips a stream.
      implementation: "ffi", "reference" or "auto", as for resolve.
      checked: emit a checkify check that every row landed inside the pool.

    Rows that would land outside [0, R) are not written; with checked=True that
    is an error, and when start/count are concrete it is a ValueError at once.

    Returns the updated pool, still in pinned_host memory. Inside your own jit,
    donate the pool and it is written in place (no copy): the result is typed as
    host memory, so XLA keeps it there.
    """
    _checks.check_int32("write_records", "start", start)  # before the cast below (a cast wraps)
    if count is not None:
        _checks.check_int32("write_records", "count", count)
    start = jnp.asarray(start, jnp.int32) if not isinstance(start, jax.Array) else start
    n = records.shape[start.ndim + 1]
    if count is None:
        count = jnp.full(start.shape, n, jnp.int32)
    impl = _dispatch.choose_implementation("write_records", implementation, targets.POOL_WRITE)
    _checks.check_pool_write(host_pool, records, start, count, need_host=impl == "ffi")
    R = host_pool.shape[1 + start.ndim]
    if not isinstance(start, jax.core.Tracer) and not isinstance(count, jax.core.Tracer):
        _raise_if_outside("write_records", R, start, count, n)
    if checked:
        outside = rows_outside_pool(R, start, count, n)
        checkify.check(
            jnp.all(outside == 0),
            "write_records: {n} rows would land outside the pool or past the records given",
            n=jnp.sum(outside),
        )
    if impl == "reference":
        return pool_write_reference(host_pool, records, start, count)
    _dispatch.require_handler("write_records", targets.POOL_WRITE)
    call = jax.ffi.ffi_call(
        targets.POOL_WRITE, jax.typeof(host_pool), input_output_aliases={0: 0}
    )
    return call(host_pool, records, start, count)


def pool_write_reference(host_pool, records, start, count):
    """host_pool[l, s, start[s] + i] = records[l, s, i] for i < count[s], in pure JAX.

    Rows landing outside [0, R) are not written. Works on a device copy of the
    pool and moves the result back to host memory.
    """
    stream_shape = start.shape
    ns = len(stream_shape)
    L, R = host_pool.shape[0], host_pool.shape[1 + ns]
    n = records.shape[1 + ns]
    rec = host_pool.shape[2 + ns :]
    S = 1
    for d in stream_shape:
        S *= d
    pool = _bits.as_bits(jax.device_put(host_pool, jax.memory.Space.Device)).reshape(L, S, R, *rec)
    rows = _bits.as_bits(records).reshape(L, S, n, *rec)
    i = jnp.arange(n)
    target = start.reshape(S, 1) + i  # [S, n]
    keep = (i < jnp.clip(count.reshape(S, 1), 0, n)) & (target >= 0) & (target < R)
    target = jnp.where(keep, target, R)  # R is dropped
    pool = jax.vmap(lambda p, r: jax.vmap(lambda pp, rr, tt: pp.at[tt].set(rr, mode="drop"))(p, r, target))(
        pool, rows
    )
    pool = _bits.from_bits(pool.reshape(host_pool.shape), host_pool.dtype)
    return jax.device_put(pool, jax.memory.Space.Host)


def _raise_if_outside(op: str, R: int, start, count, n: int) -> None:
    outside = jax.device_get(rows_outside_pool(R, start, count, n))
    if outside.any():
        raise ValueError(
            f"{op}: {int(outside.sum())} rows would land outside the pool [0, R={R}) or past the "
            f"n={n} records given (start={jax.device_get(start)}, count={jax.device_get(count)}); "
            "grow pool_records or fix start/count"
        )


@functools.lru_cache(maxsize=None)
def _donating_writer(out_sharding):
    """write_records jitted with the pool donated and its output kept on `out_sharding`
    (pinned_host): one compiled program per sharding, shapes and implementation."""
    return jax.jit(
        write_records,
        donate_argnums=0,
        static_argnames=("implementation", "checked"),
        out_shardings=out_sharding,
    )


def write_records_inplace(host_pool, records, start, count=None, *, implementation="auto"):
    """Eager form of write_records: jitted with the pool donated and kept pinned.

    The pool passed in is consumed (donated); use the returned array. Rows that
    would land outside the pool are a ValueError before anything runs.
    """
    _checks.check_int32("write_records_inplace", "start", start)  # before the casts below
    if count is not None:
        _checks.check_int32("write_records_inplace", "count", count)
    start = jnp.asarray(start, jnp.int32)
    n = records.shape[start.ndim + 1]
    count = jnp.full(start.shape, n, jnp.int32) if count is None else jnp.asarray(count, jnp.int32)
    _raise_if_outside("write_records_inplace", host_pool.shape[1 + start.ndim], start, count, n)
    writer = _donating_writer(host_pool.sharding)
    return writer(host_pool, records, start, count, implementation=implementation)

"""Writes into the pinned host pool (prefill and decode appends): every
implementation against the loop oracle byte for byte; the pool stays in
pinned_host memory; rows outside [0, R) are refused."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import checkify

import hisparse_jax as hs
import oracle
from helpers import (
    RECORD_DTYPES,
    assert_bytes_equal,
    config,
    finite_records,
    jitted_write,
    random_records,
    read_pinned,
    to_device,
    to_pinned_host,
)

CFG = config(L=2, streams=(3,), R=10, B=4, k=3, width=4, dtype=ml_dtypes.bfloat16)


def record_block(cfg, n, rng):
    """[L, *S, n, *rec] random records on device."""
    return random_records(rng, (cfg.num_layers, *cfg.stream_shape, n, *cfg.record_shape), cfg.dtype)


def assert_pool_equal(got, want, cfg):
    assert got.sharding.memory_kind == "pinned_host", f"pool left pinned_host: {got.sharding}"
    assert_bytes_equal(read_pinned(got), want, 2 + len(cfg.stream_shape), "host_pool")


@pytest.mark.parametrize("dtype", list(RECORD_DTYPES.values()), ids=list(RECORD_DTYPES))
def test_prefill_eager(implementation, dtype):
    """Many rows per stream, different starts and counts (0 included); the
    input pool is not donated, so it must come out unchanged."""
    cfg = config(L=2, streams=(2, 2), R=12, B=4, k=3, width=16 // np.dtype(dtype).itemsize, dtype=dtype)
    rng = np.random.default_rng(0)
    pool = random_records(rng, cfg.pool_shape, cfg.dtype)
    records = record_block(cfg, 6, rng)
    start = np.array([[0, 3], [6, 11]], np.int32)
    count = np.array([[6, 0], [6, 1]], np.int32)
    host_pool = to_pinned_host(pool)
    out = hs.write_records(host_pool, to_device(records), start, count, implementation=implementation)
    assert_pool_equal(out, oracle.pool_write(pool, records, start, count), cfg)
    assert_pool_equal(host_pool, pool, cfg)


def test_prefill_default_count_writes_every_row(implementation):
    rng = np.random.default_rng(1)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    records = record_block(CFG, 4, rng)
    start = np.array([0, 6, 3], np.int32)
    out = hs.write_records(
        to_pinned_host(pool), to_device(records), start.tolist(), implementation=implementation
    )
    assert_pool_equal(out, oracle.pool_write(pool, records, start, np.full(3, 4)), CFG)


def test_write_records_inplace_donates(implementation):
    rng = np.random.default_rng(2)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    records = record_block(CFG, 5, rng)
    start, count = np.array([5, 0, 2], np.int32), np.array([5, 3, 0], np.int32)
    host_pool = to_pinned_host(pool)
    out = hs.write_records_inplace(host_pool, to_device(records), start, count, implementation=implementation)
    assert host_pool.is_deleted(), "write_records_inplace must consume (donate) the pool"
    assert_pool_equal(out, oracle.pool_write(pool, records, start, count), CFG)


def test_jitted_donated_write(implementation):
    rng = np.random.default_rng(3)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    write = jitted_write(implementation)
    host_pool = to_pinned_host(pool)
    for step in range(3):  # the same executable, pool carried from call to call
        records = record_block(CFG, 2, rng)
        start, count = rng.integers(0, 9, size=3).astype(np.int32), rng.integers(0, 3, size=3).astype(
            np.int32
        )
        new_pool = write(host_pool, to_device(records), start, count)
        assert host_pool.is_deleted()
        pool = oracle.pool_write(pool, records, start, count)
        assert_pool_equal(new_pool, pool, CFG)
        host_pool = new_pool


@functools.cache
def decode_append(implementation):
    """lax.scan over decode steps appending count[t, s] in {0, 1} rows per stream."""

    def run(host_pool, records, counts, position):
        def step(carry, xs):
            pool, pos = carry
            rows, count = xs
            pool = hs.write_records(pool, rows, pos, count, implementation=implementation)
            return (pool, pos + count), None

        (host_pool, position), _ = lax.scan(step, (host_pool, position), (records, counts))
        return host_pool, position

    return jax.jit(run, donate_argnums=0, out_shardings=(hs.pinned_host_sharding(), None))


def test_decode_append_in_scan(implementation):
    rng = np.random.default_rng(4)
    T = 6
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    # [T, L, S, 1, *rec]; finite, since they ride through the scan's xs (see finite_records)
    records = finite_records(rng, (T, CFG.num_layers, *CFG.stream_shape, 1, *CFG.record_shape), CFG.dtype)
    counts = rng.integers(0, 2, size=(T, 3)).astype(np.int32)
    position = np.array([0, 3, 9], np.int32)  # the last stream writes once at R-1 at most
    counts[:, 2] = 0
    counts[1, 2] = 1
    host_pool = to_pinned_host(pool)
    out, end = decode_append(implementation)(host_pool, to_device(records), counts, position)
    assert host_pool.is_deleted()
    want, pos = pool, position.copy()
    for t in range(T):
        want = oracle.pool_write(want, records[t], pos, counts[t])
        pos += counts[t]
    np.testing.assert_array_equal(end, pos)
    assert_pool_equal(out, want, CFG)


@pytest.mark.parametrize(
    "start, count, what",
    [
        pytest.param([8, 0, 0], [3, 1, 1], "past R", id="past_R"),
        pytest.param([0, -1, 0], [1, 2, 1], "negative start", id="negative_start"),
        pytest.param([0, 0, 0], [1, 5, 1], "more rows than given", id="count_above_n"),
    ],
)
@pytest.mark.parametrize("inplace", [False, True], ids=["write_records", "write_records_inplace"])
def test_rows_outside_pool_raise_eagerly(implementation, start, count, what, inplace):
    rng = np.random.default_rng(5)
    host_pool = to_pinned_host(random_records(rng, CFG.pool_shape, CFG.dtype))
    records = to_device(record_block(CFG, 3, rng))
    write = hs.write_records_inplace if inplace else hs.write_records
    with pytest.raises(
        ValueError, match=r"rows would land outside the pool \[0, R=10\) or past the n=3 records"
    ):
        write(
            host_pool,
            records,
            np.array(start, np.int32),
            np.array(count, np.int32),
            implementation=implementation,
        )
    assert not host_pool.is_deleted(), "a refused write must not consume the pool"


@functools.cache
def checked_write(implementation):
    def write(host_pool, records, start, count):
        return hs.write_records(host_pool, records, start, count, implementation=implementation, checked=True)

    return checkify.checkify(jax.jit(write))


def test_checked_write_under_jit(implementation):
    rng = np.random.default_rng(6)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    records = record_block(CFG, 2, rng)
    write = checked_write(implementation)

    start, count = np.array([8, 0, 3], np.int32), np.array([2, 0, 1], np.int32)  # ends exactly at R
    err, out = write(to_pinned_host(pool), to_device(records), start, count)
    err.throw()  # no error
    assert_pool_equal(out, oracle.pool_write(pool, records, start, count), CFG)

    start = np.array([9, 0, -1], np.int32)  # 1 row past R, 1 row before 0
    err, out = write(to_pinned_host(pool), to_device(records), start, count)
    with pytest.raises(checkify.JaxRuntimeError, match="write_records: 2 rows would land outside the pool"):
        err.throw()


def test_unchecked_write_under_jit_drops_outside_rows(implementation):
    """Inside jit nothing can raise: rows outside [0, R) are dropped, the rest land."""
    rng = np.random.default_rng(7)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    records = record_block(CFG, 3, rng)
    start, count = np.array([8, -2, 0], np.int32), np.array([3, 3, 9], np.int32)
    out = jitted_write(implementation)(to_pinned_host(pool), to_device(records), start, count)
    want = oracle.pool_write(pool, records, start, count)
    assert_pool_equal(out, want, CFG)
    assert_bytes_equal(want[:, 0, 8:], records[:, 0, :2], 2, "rows 8, 9 of stream 0")


def test_rows_outside_pool():
    start = jnp.array([0, 8, -1, 2], jnp.int32)
    count = jnp.array([3, 3, 2, -4], jnp.int32)
    np.testing.assert_array_equal(hs.rows_outside_pool(10, start, count, rows=3), [0, 1, 1, 0])
    np.testing.assert_array_equal(
        hs.rows_outside_pool(10, start, jnp.full(4, 5, jnp.int32), rows=3), [2, 3, 3, 2]
    )


def test_alloc_host_pool_is_zeroed_pinned_host():
    pool = hs.alloc_host_pool(CFG)
    assert pool.sharding.memory_kind == "pinned_host"
    assert pool.shape == CFG.pool_shape and pool.dtype == CFG.dtype
    assert not np.asarray(jax.device_get(pool)).view(np.uint16).any()

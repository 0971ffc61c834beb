"""The cache state in use: a pytree that rides through jit and nested scans
(decode steps x layers, traced layer index) with the cache and the pool
donated; stream resets; a decode loop that appends to the pool and resolves in
one compiled program. Every per-call output is checked against the oracle."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hisparse_jax as hs
import oracle
from helpers import (
    INT_FIELDS,
    Mix,
    State,
    assert_array_identical,
    assert_bytes_equal,
    check_invariants,
    config,
    draw_selection,
    empty_state,
    finite_records,
    jitted_resolve,
    random_records,
    random_state,
    read_pinned,
    run_oracle,
    to_device,
    to_pinned_host,
)

CFG = config(L=3, streams=(2, 2), R=20, B=6, k=4, width=4, dtype=ml_dtypes.bfloat16)


def test_hot_cache_is_a_pytree():
    cache = hs.init_hot_cache(CFG)
    leaves, tree = jax.tree.flatten(cache)
    assert [x.shape for x in leaves] == [CFG.hot_shape, CFG.slot_shape, CFG.slot_shape]
    again = jax.tree.unflatten(tree, leaves)
    assert isinstance(again, hs.HotCache) and again.lru is cache.lru
    doubled = jax.jit(lambda c: jax.tree.map(lambda x: x, c))(cache)
    assert isinstance(doubled, hs.HotCache)
    np.testing.assert_array_equal(doubled.lru, cache.lru, strict=True)


def oracle_decode(state: State, pool, selections, sealed):
    """The oracle over [T, L] calls; returns per-call results [T][L] and the final state."""
    results = []
    for t in range(selections.shape[0]):
        row = []
        for layer in range(selections.shape[1]):
            out = run_oracle(state, pool, selections[t, layer], sealed[t], layer)
            check_invariants(
                state, State.of_oracle(out), pool, selections[t, layer], sealed[t], layer, out.slots
            )
            state = State.of_oracle(out)
            row.append(out)
        results.append(row)
    return results, state


def draw_decode(cfg, rng, pool, state, T, mix=Mix()):
    """Selections [T, L, *S, k] and sealed [T, *S] with locality, drawn against the oracle's state."""
    L, S = cfg.num_layers, cfg.num_streams
    recent = [[] for _ in range(S)]
    sealed = np.full(cfg.stream_shape, cfg.pool_records // 2, np.int32)
    all_sel, all_sealed = [], []
    for t in range(T):
        sels = []
        for layer in range(L):
            sel = draw_selection(rng, cfg, state.slot_record, recent, sealed, mix, layer)
            state = State.of_oracle(run_oracle(state, pool, sel, sealed, layer))
            sels.append(sel)
        for s, row in enumerate(sels[-1].reshape(S, -1)):
            recent[s] = (recent[s] + [int(x) for x in row if x >= 0])[-8:]
        all_sel.append(np.stack(sels))
        all_sealed.append(sealed)
        sealed = np.minimum(sealed + rng.integers(0, 2, size=sealed.shape), cfg.pool_records).astype(np.int32)
    return np.stack(all_sel), np.stack(all_sealed)


@functools.cache
def nested_decode(implementation):
    """lax.scan over decode steps of lax.scan over layers (traced layer index), cache donated."""

    def decode(cache, host_pool, selections, sealed):
        num_layers = selections.shape[1]

        def step(cache, xs):
            sel_t, sealed_t = xs

            def layer(cache, ys):
                index, sel = ys
                result, cache = hs.resolve(
                    cache, host_pool, sel, sealed_t, index, implementation=implementation
                )
                return cache, result

            return lax.scan(layer, cache, (jnp.arange(num_layers, dtype=jnp.int32), sel_t))

        return lax.scan(step, cache, (selections, sealed))

    return jax.jit(decode, donate_argnums=0)


@pytest.mark.parametrize("start", ["empty", "random"])
def test_nested_scans_match_oracle(implementation, start):
    rng = np.random.default_rng(0 if start == "empty" else 1)
    T = 5
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    state = empty_state(CFG) if start == "empty" else random_state(CFG, rng, pool)
    selections, sealed = draw_decode(CFG, rng, pool, state, T)
    cache = state.to_cache()
    host_pool = to_pinned_host(pool)

    final, results = nested_decode(implementation)(cache, host_pool, selections, sealed)
    assert all(x.is_deleted() for x in jax.tree.leaves(cache)), "the donated cache must be consumed"
    assert not host_pool.is_deleted() and host_pool.sharding.memory_kind == "pinned_host"

    want, want_state = oracle_decode(state, pool, selections, sealed)
    results = jax.device_get(results)
    for t in range(T):
        for layer in range(CFG.num_layers):
            for name in INT_FIELDS:
                assert_array_identical(
                    getattr(results, name)[t, layer],
                    getattr(want[t][layer], name),
                    f"step {t} layer {layer} {name}",
                )
    got = State.of(final)
    assert_array_identical(got.slot_record, want_state.slot_record, "slot_record")
    assert_array_identical(got.lru, want_state.lru, "lru")
    assert_bytes_equal(got.hot, want_state.hot, 4, "hot")
    assert sum(int(want[t][l].misses.sum()) for t in range(T) for l in range(CFG.num_layers)) > 0


def test_reset_streams():
    rng = np.random.default_rng(2)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    state = random_state(CFG, rng, pool)
    mask = np.array([[True, False], [False, True]])
    for reset in (hs.reset_streams, jax.jit(hs.reset_streams)):
        got = State.of(reset(state.to_cache(), jnp.asarray(mask)))
        rec, lru = state.slot_record.copy(), state.lru.copy()
        rec[:, mask] = -1
        lru[:, mask] = np.arange(CFG.hot_slots)
        assert_array_identical(got.slot_record, rec, "slot_record")
        assert_array_identical(got.lru, lru, "lru")
        assert_bytes_equal(got.hot, state.hot, 4, "hot (left as it was)")


def test_reset_stream_then_resolve_misses_everything(implementation):
    """After a reset the stream's old records are gone: re-selecting them misses."""
    rng = np.random.default_rng(3)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    state = random_state(CFG, rng, pool)
    mask = np.array([[True, False], [False, False]])
    cache = hs.reset_streams(state.to_cache(), mask)
    reset = State.of(cache)
    held = [int(r) for r in state.slot_record[1, 0, 0] if r >= 0][: CFG.top_k]
    selection = np.full((2, 2, CFG.top_k), -1, np.int32)
    selection[0, 0, : len(held)] = held
    sealed = np.full((2, 2), CFG.pool_records, np.int32)
    result, cache = jitted_resolve(implementation)(
        cache, to_pinned_host(pool), selection, sealed, np.int32(1)
    )
    want = run_oracle(reset, pool, selection, sealed, 1)
    assert int(result.misses[0, 0]) == len(held) == int(want.misses[0, 0])
    assert_array_identical(np.asarray(result.slots), want.slots, "slots")


def test_reset_streams_shape_error():
    with pytest.raises(
        ValueError,
        match=r"reset_streams: streams has shape \(4,\), expected the stream shape \(2, 2\) of the cache",
    ):
        hs.reset_streams(hs.init_hot_cache(CFG), jnp.ones((4,), bool))


# --------------------------------------------------------------------------- decode loop: append + resolve

DECODE = config(L=2, streams=(3,), R=16, B=5, k=4, width=2)


@functools.cache
def decode_loop(implementation):
    """Each step appends one record per stream and layer to the pool (count 0/1),
    then resolves every layer with sealed = records written so far; cache and
    pool donated, both carried through the scan."""

    def run(cache, host_pool, written, new_records, counts, selections):
        def step(carry, xs):
            cache, pool, written = carry
            rows, count, sel_t = xs
            pool = hs.write_records(pool, rows, written, count, implementation=implementation)
            written = written + count

            def layer(cache, ys):
                index, sel = ys
                result, cache = hs.resolve(cache, pool, sel, written, index, implementation=implementation)
                return cache, result.slots

            cache, slots = lax.scan(layer, cache, (jnp.arange(DECODE.num_layers, dtype=jnp.int32), sel_t))
            return (cache, pool, written), slots

        (cache, host_pool, written), slots = lax.scan(
            step, (cache, host_pool, written), (new_records, counts, selections)
        )
        return cache, host_pool, written, slots

    out_shardings = (None, hs.pinned_host_sharding(), None, None)
    return jax.jit(run, donate_argnums=(0, 1), out_shardings=out_shardings)


def test_decode_loop_appends_and_resolves(implementation):
    rng = np.random.default_rng(4)
    T, L, S = 6, DECODE.num_layers, DECODE.num_streams
    pool = random_records(rng, DECODE.pool_shape, DECODE.dtype)
    written = np.array([4, 0, 15], np.int32)  # the last stream fills the pool's last row
    new_records = finite_records(rng, (T, L, S, 1, *DECODE.record_shape), DECODE.dtype)
    counts = rng.integers(0, 2, size=(T, S)).astype(np.int32)
    counts[:, 2] = [1, 0, 0, 0, 0, 0]
    selections = rng.integers(-1, 8, size=(T, L, S, DECODE.top_k)).astype(np.int32)
    selections[2:, :, :, 0] = selections[1, :, :, 0]  # keep re-selecting some ids: hits

    cache, host_pool = empty_state(DECODE).to_cache(), to_pinned_host(pool)
    cache_out, pool_out, written_out, slots = decode_loop(implementation)(
        cache, host_pool, written, to_device(new_records), counts, selections
    )
    assert host_pool.is_deleted() and all(x.is_deleted() for x in jax.tree.leaves(cache))
    assert pool_out.sharding.memory_kind == "pinned_host"

    state, want_pool, want_written = empty_state(DECODE), pool, written.copy()
    for t in range(T):
        want_pool = oracle.pool_write(want_pool, new_records[t], want_written, counts[t])
        want_written = want_written + counts[t]
        for layer in range(L):
            out = run_oracle(state, want_pool, selections[t, layer], want_written, layer)
            assert_array_identical(np.asarray(slots[t, layer]), out.slots, f"step {t} layer {layer} slots")
            state = State.of_oracle(out)
    np.testing.assert_array_equal(written_out, want_written)
    assert_bytes_equal(read_pinned(pool_out), want_pool, 3, "host_pool")
    got = State.of(cache_out)
    assert_array_identical(got.slot_record, state.slot_record, "slot_record")
    assert_array_identical(got.lru, state.lru, "lru")
    assert_bytes_equal(got.hot, state.hot, 3, "hot")

"""RESOLVE over a stream range (docs/contract.md "Stream range"): the range call equals the
whole-batch call whose selection is -1 outside the range, bit for bit, on every rung (oracle,
JAX reference, C++ or CUDA handler, its prefetch variant); streams outside the range are never
looked at; bad ranges are one-line errors. The overlap groups (hisparse_jax/kit/overlap.py) rely
on it: tests/models/test_overlap_decode.py checks their decode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hisparse_jax as hs
import oracle
from helpers import (
    IMPLEMENTATIONS,
    INT_FIELDS,
    Mix,
    State,
    assert_matches_oracle,
    config,
    draw_selection,
    fetch_outputs,
    random_records,
    random_state,
    run_oracle,
    to_pinned_host,
)

# Two stream dims, so the range runs over the flattened axis (stream 4 = [1, 1]).
CFG = config(L=2, streams=(2, 3), R=20, B=7, k=5, width=4, page_size=2)
S = CFG.num_streams


@functools.cache
def ranged(implementation: str, begin: int, count: int | None, prefetch: bool = False):
    """resolve (or resolve_prefetch + join) of the streams [begin, begin + count), jitted."""

    def call(cache, pool, selection, sealed, layer):
        range_ = dict(implementation=implementation, stream_begin=begin, stream_count=count)
        if not prefetch:
            return hs.resolve(cache, pool, selection, sealed, layer, **range_)
        result, cache, pending = hs.resolve_prefetch(cache, pool, selection, sealed, layer, slot=0, **range_)
        cache, _ = hs.join_prefetch(cache, pending, result.slots)
        return result, cache

    return jax.jit(call)


@functools.cache
def whole(implementation: str):
    return jax.jit(functools.partial(hs.resolve, implementation=implementation))


def setup(seed: int):
    """A random well-formed state, its pool, and a selection with hits, misses, repeats,
    padding and invalid ids in every stream."""
    rng = np.random.default_rng(seed)
    pool = random_records(rng, CFG.pool_shape, CFG.dtype)
    state = random_state(CFG, rng, pool)
    sealed = rng.integers(CFG.pool_records // 2, CFG.pool_records + 3, size=CFG.stream_shape).astype(np.int32)
    selection = draw_selection(rng, CFG, state.slot_record, [[] for _ in range(S)], sealed, Mix(), layer=1)
    return state, pool, selection, sealed


def padded(selection, begin: int, count: int) -> np.ndarray:
    flat = np.array(selection).reshape(S, -1)
    flat[:begin] = -1
    flat[begin + count:] = -1
    return flat.reshape(selection.shape)


def run(fn, state: State, pool, selection, sealed, layer):
    return fn(state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed), jnp.int32(layer))


def break_stream(state: State, layer: int, stream: int) -> State:
    """The state with one stream's lru row no permutation (a value past B): malformed."""
    lru = state.lru.copy()
    lru.reshape(CFG.num_layers, S, -1)[layer, stream, 0] = CFG.hot_slots
    return State(state.hot.copy(), state.slot_record.copy(), lru)


# (begin, count): a middle range, the last stream only, an overlap group, an empty range.
RANGES = [(1, 3), (S - 1, 1), (3, 3), (2, 0)]


@pytest.mark.parametrize("begin, count", RANGES)
def test_oracle_range_is_the_padded_call(begin, count):
    state, pool, selection, sealed = setup(0)
    want = run_oracle(state, pool, padded(selection, begin, count), sealed, 1)
    got = oracle.resolve(state.hot, state.slot_record, state.lru, pool, selection, sealed, 1,
                         stream_begin=begin, stream_count=count)
    for name in (*INT_FIELDS, "slot_record", "lru"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name, strict=True)
    assert oracle.as_bytes(got.hot, 3).tobytes() == oracle.as_bytes(want.hot, 3).tobytes()
    assert want.misses.sum() > 0 or count == 0  # the range's streams fetched something


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_range_is_the_padded_call(implementation):
    """Every range of RANGES on one random state: the oracle's range call (itself the padded
    call, above), with zero tolerance."""
    state, pool, selection, sealed = setup(1)
    for begin, count in RANGES:
        result, cache = run(ranged(implementation, begin, count), state, pool, selection, sealed, 1)
        want = run_oracle(state, pool, padded(selection, begin, count), sealed, 1)
        assert_matches_oracle(result, cache, want, where=f"{implementation} [{begin}, +{count})")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_groups_carried_over_calls_equal_whole_batch_calls(implementation):
    """Overlap groups' use: per call, group 0 = streams [0, 3) then group 1 = [3, 6) with the
    state carried (and the prefetch variant for group 1), against the whole-batch call: the
    same state and, row for row, the same results after every call."""
    state, pool, selection, sealed = setup(2)
    rng = np.random.default_rng(3)
    mine, theirs = state, state
    for call in range(3):
        layer = call % 2
        first, cache = run(ranged(implementation, 0, 3), mine, pool, selection, sealed, layer)
        second, cache = run(ranged(implementation, 3, None, prefetch=True), State.of(cache), pool, selection, sealed,
                            layer)
        want, want_cache = run(whole(implementation), theirs, pool, selection, sealed, layer)
        (a, _), (b, mine), (w, theirs) = (fetch_outputs(first, cache), fetch_outputs(second, cache),
                                           fetch_outputs(want, want_cache))
        for name in INT_FIELDS:
            rows = lambda x: x.reshape(S, -1)
            np.testing.assert_array_equal(rows(a[name])[:3], rows(w[name])[:3], err_msg=f"call {call} {name}")
            np.testing.assert_array_equal(rows(b[name])[3:], rows(w[name])[3:], err_msg=f"call {call} {name}")
        for name in ("slot_record", "lru"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name), err_msg=f"call {call} {name}")
        assert oracle.as_bytes(mine.hot, 3).tobytes() == oracle.as_bytes(theirs.hot, 3).tobytes(), f"call {call} hot"
        selection = draw_selection(rng, CFG, theirs.slot_record, [[] for _ in range(S)], sealed, Mix(), layer=1 - layer)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_corner_cases(implementation):
    state, pool, selection, sealed = setup(4)
    # The full range is the call without one, bit for bit (a malformed stream reported alike).
    broken = break_stream(state, 1, 4)
    full, full_cache = fetch_outputs(*run(ranged(implementation, 0, S), broken, pool, selection, sealed, 1))
    default, default_cache = fetch_outputs(*run(whole(implementation), broken, pool, selection, sealed, 1))
    assert full["malformed"].reshape(S).tolist() == [0, 0, 0, 0, 1, 0]
    for name in INT_FIELDS:
        np.testing.assert_array_equal(full[name], default[name], err_msg=name, strict=True)
    for a, b in zip((full_cache.hot, full_cache.slot_record, full_cache.lru),
                    (default_cache.hot, default_cache.slot_record, default_cache.lru)):
        assert a.tobytes() == b.tobytes()

    # Malformed state outside the range is never looked at (nor touched); inside it is reported.
    for begin, count, reported in ((0, 4, 0), (4, 2, 1)):
        result, cache = run(ranged(implementation, begin, count), broken, pool, selection, sealed, 1)
        want = run_oracle(broken, pool, padded(selection, begin, count), sealed, 1)
        want.malformed.reshape(S)[4] = reported  # the padded call sees the broken row; the range call not
        assert_matches_oracle(result, cache, want, where=f"{implementation} [{begin}, +{count})")

    # An empty range touches nothing, whatever the state; its results are padding's.
    bad_everywhere = State(state.hot, np.full_like(state.slot_record, -7), state.lru)
    ints, after = fetch_outputs(*run(ranged(implementation, 2, 0), bad_everywhere, pool, selection, sealed, 1))
    assert (ints["slots"] == -1).all() and (ints["miss_records"] == -1).all() and (ints["miss_slots"] == -1).all()
    assert not ints["misses"].any() and not ints["invalid"].any() and not ints["malformed"].any()
    assert after.slot_record.tobytes() == bad_everywhere.slot_record.tobytes()
    assert after.lru.tobytes() == state.lru.tobytes() and after.hot.tobytes() == state.hot.tobytes()

    # A traced layer outside [0, L) counts invalid ids in the range's streams only.
    ints, after = fetch_outputs(*run(ranged(implementation, S - 1, 1), state, pool, selection, sealed, CFG.num_layers))
    want = (np.asarray(selection).reshape(S, -1) != -1).sum(-1)
    assert ints["invalid"].reshape(S).tolist() == [0] * (S - 1) + [int(want[-1])]
    assert after.lru.tobytes() == state.lru.tobytes()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(stream_begin=-1), ValueError, r"resolve: stream_begin=-1 must be >= 0 \(the first stream resolved\)"),
        (dict(stream_count=-2), ValueError, r"resolve: stream_count=-2 must be >= 0 \(0 resolves no stream"),
        (dict(stream_begin=4, stream_count=3), ValueError,
         r"resolve: stream_begin \+ stream_count = 4 \+ 3 exceeds the 6 streams of selection \(flattened stream "
         r"shape \(2, 3\)\); pick a range inside \[0, 6\)"),
        (dict(stream_begin=7), ValueError, r"stream_begin \+ stream_count = 7 \+ 0 exceeds the 6 streams"),
        (dict(stream_count=2**70), ValueError, r"stream_begin \+ stream_count = 0 \+ 1180591620717411303424 exceeds"),
        (dict(stream_begin=1.0), TypeError, r"resolve: stream_begin must be a Python int \(a static stream index"),
        (dict(stream_count=True), TypeError, r"resolve: stream_count must be a Python int"),
        (dict(stream_begin=jnp.int32(1)), TypeError, r"resolve: stream_begin must be a Python int"),
    ],
    ids=["begin_negative", "count_negative", "past_the_end", "begin_past_the_end", "huge", "float", "bool", "array"],
)
def test_bad_ranges_are_named(kwargs, error, message):
    state, pool, selection, sealed = setup(5)
    args = (state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed), 1)
    with pytest.raises(error, match=message):
        hs.resolve(*args, implementation="reference", **kwargs)
    with pytest.raises(error, match=message.replace("resolve:", "resolve_reference:")):
        hs.resolve_reference(state.hot, state.slot_record, state.lru, to_pinned_host(pool), selection, sealed, 1,
                             **kwargs)

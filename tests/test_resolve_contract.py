"""RESOLVE (docs/contract.md) on named corner cases: every implementation
against the loop oracle with zero tolerance, plus the invariants, plus the
specific outcome each case is about."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import hisparse_jax as hs
import oracle
from helpers import (
    RECORD_DTYPES,
    State,
    assert_matches_oracle,
    check_invariants,
    config,
    empty_state,
    jitted_resolve,
    random_records,
    random_state,
    run_oracle,
    to_pinned_host,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def make_pool(cfg, seed=0) -> np.ndarray:
    return random_records(np.random.default_rng(seed), cfg.pool_shape, cfg.dtype)


def state_with(cfg, pool, slot_record, lru, layer=0) -> State:
    """A state whose `layer` holds the given per-stream slot_record/lru (others empty),
    with hot bytes consistent with the pool."""
    state = empty_state(cfg)
    S, B = cfg.num_streams, cfg.hot_slots
    rec = state.slot_record.reshape(cfg.num_layers, S, B)
    order = state.lru.reshape(cfg.num_layers, S, B)
    hot = state.hot.reshape(cfg.num_layers, S, B, *cfg.record_shape)
    flat_pool = pool.reshape(cfg.num_layers, S, cfg.pool_records, *cfg.record_shape)
    rec[layer] = np.asarray(slot_record, np.int32).reshape(S, B)
    order[layer] = np.asarray(lru, np.int32).reshape(S, B)
    for s, b in zip(*np.nonzero(rec[layer] >= 0)):
        hot[layer, s, b] = flat_pool[layer, s, rec[layer, s, b]]
    return state


def run_case(implementation, state: State, pool, selection, sealed, layer, *, fetch=True, mode="jit"):
    """Runs one call, checks it against the oracle and the invariants; returns the oracle's answer."""
    selection = np.asarray(selection, np.int32)
    sealed = np.asarray(sealed, np.int32)
    args = (state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed))
    if mode == "eager":
        result, cache = hs.resolve(*args, layer, implementation=implementation, fetch=fetch)
    else:
        result, cache = jitted_resolve(implementation, fetch)(*args, jnp.int32(layer))
    want = run_oracle(state, pool, selection, sealed, layer, fetch=fetch)
    assert_matches_oracle(result, cache, want, where=implementation)
    check_invariants(
        state, State.of(cache), pool, selection, sealed, layer, result.slots, hot_consistent=fetch
    )
    return want


# --------------------------------------------------------------------------- the oracle itself


def test_oracle_worked_example():
    """The rules applied by hand to one stream, so the oracle is checked too."""
    out = oracle.resolve_stream(
        selection=[5, 9, 5, -1, 8],
        sealed=10,
        slot_record=[7, -1, 3, 5, -1],
        lru=[2, 0, 3, 4, 1],
        pool_records=16,
    )
    # H = (5, 9, 8); slot 3 holds 5 (hit); misses 9, 8 take evictable [2, 0, 4, 1] in order.
    assert out.misses == 2 and out.invalid == 0
    assert out.miss_records == [9, 8, -1, -1, -1]
    assert out.miss_slots == [2, 0, -1, -1, -1]
    assert out.slot_record == [8, -1, 9, 5, -1]
    assert out.lru == [4, 1, 2, 0, 3]  # not taken + filled (miss order) + hits
    assert out.slots == [3, 2, 3, -1, 0]


# Most cases share two shapes so the reference compiles once per shape.
SHAPE_A = dict(L=1, streams=(2,), R=16, B=6, k=6)
SHAPE_B = dict(L=3, streams=(2,), R=16, B=4, k=4)  # B == k
PAD = [-1] * 6
IDENTITY = list(range(6))


def test_worked_example(implementation):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[7, -1, 3, 5, -1, -1], PAD], [[2, 0, 3, 4, 1, 5], IDENTITY])
    want = run_case(implementation, state, pool, [[5, 9, 5, -1, 8, -1], PAD], [10, 10], 0)
    np.testing.assert_array_equal(want.slots[0], [3, 2, 3, -1, 0, -1])
    np.testing.assert_array_equal(want.lru[0, 0], [4, 1, 5, 2, 0, 3])


# --------------------------------------------------------------------------- named corner cases


def test_first_call_on_empty_cache(implementation):
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    want = run_case(implementation, empty_state(cfg), pool, [[4, 1, 7, 1], [0, 0, 11, -1]], [12, 12], 1)
    np.testing.assert_array_equal(want.misses, [3, 2])
    np.testing.assert_array_equal(want.slots, [[0, 1, 2, 1], [0, 0, 1, -1]])  # empty slots in lru order


def test_all_hits(implementation):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[3, 1, -1, 8, 2, -1], IDENTITY], [[4, 3, 2, 1, 0, 5], IDENTITY])
    want = run_case(implementation, state, pool, [[8, 3, 2, -1, 8, 3], [4, 0, 2, 5, 1, 3]], [16, 16], 0)
    np.testing.assert_array_equal(want.misses, [0, 0])
    np.testing.assert_array_equal(want.slots, [[3, 0, 4, -1, 3, 0], [4, 0, 2, 5, 1, 3]])
    np.testing.assert_array_equal(want.slot_record, state.slot_record)
    np.testing.assert_array_equal(want.lru[0, 0], [2, 1, 5, 4, 3, 0])  # evictables first, hits last


def test_all_misses(implementation):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [IDENTITY, PAD], [[5, 4, 3, 2, 1, 0], IDENTITY])
    want = run_case(
        implementation, state, pool, [[10, 11, 12, 13, -1, -1], [6, 7, 8, 9, 10, 11]], [16, 16], 0
    )
    np.testing.assert_array_equal(want.misses, [4, 6])
    np.testing.assert_array_equal(want.miss_slots[0], [5, 4, 3, 2, -1, -1])  # least recently used first
    np.testing.assert_array_equal(want.lru[0, 0], [1, 0, 5, 4, 3, 2])


def test_B_equals_k(implementation):
    """Every slot can be replaced in one call: no room for mistakes in rule 3."""
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[0, 1, 2, 3], [0, 1, 2, 3]], [[1, 3, 0, 2], [0, 1, 2, 3]], layer=2)
    want = run_case(implementation, state, pool, [[9, 8, 7, 6], [3, 12, 0, 13]], [16, 16], 2)
    np.testing.assert_array_equal(want.misses, [4, 2])
    np.testing.assert_array_equal(want.slots, [[1, 3, 0, 2], [3, 1, 0, 2]])
    np.testing.assert_array_equal(want.lru[2, 1], [1, 2, 0, 3])  # filled (1, 2), then hits (0, 3)


def test_padding_only(implementation):
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(1), pool)
    want = run_case(implementation, state, pool, np.full((2, 4), -1), [5, 0], 1)
    np.testing.assert_array_equal(want.slots, -1)
    np.testing.assert_array_equal(want.misses, 0)
    np.testing.assert_array_equal(want.invalid, 0)
    np.testing.assert_array_equal(want.lru, state.lru)  # no hits, no misses: order kept


def test_duplicate_ids(implementation):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[-1, 4, -1, -1, -1, -1], PAD], [IDENTITY, IDENTITY])
    want = run_case(implementation, state, pool, [[4, 7, 4, 7, 7, 4], [3, 3, 3, 3, 3, 3]], [16, 16], 0)
    np.testing.assert_array_equal(want.misses, [1, 1])
    np.testing.assert_array_equal(want.slots, [[1, 0, 1, 0, 0, 1], [0] * 6])
    np.testing.assert_array_equal(want.miss_records, [[7] + PAD[1:], [3] + PAD[1:]])


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param([9, 10, 15], id="not_sealed_yet"),
        pytest.param([16, 17, INT32_MAX], id="at_or_past_R"),
        pytest.param([-2, -7, INT32_MIN], id="negative_not_minus_one"),
    ],
)
def test_invalid_ids_are_padding(implementation, bad):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[2, -1, 9, -1, -1, -1], PAD], [IDENTITY, IDENTITY])
    sel = [[2, bad[0], -1, bad[1], 3, bad[2]], PAD]
    want = run_case(implementation, state, pool, sel, [9, 9], 0)
    assert want.invalid[0] == 3 and want.misses[0] == 1
    np.testing.assert_array_equal(want.slots[0], [0, -1, -1, -1, 1, -1])


def test_resident_id_no_longer_sealed_is_invalid(implementation):
    """An id cached earlier but >= sealed now is invalid; its slot is evictable."""
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = state_with(cfg, pool, [[8, 1, 2, 10, 11, 12], PAD], [IDENTITY, IDENTITY])
    want = run_case(implementation, state, pool, [[8, 5, 1, -1, -1, -1], PAD], [6, 6], 0)
    assert want.invalid[0] == 1
    np.testing.assert_array_equal(want.slots[0], [-1, 0, 1, -1, -1, -1])  # 5 evicted the stale 8


@pytest.mark.parametrize("sealed", [0, -1, INT32_MIN], ids=["zero", "minus_one", "int32_min"])
def test_sealed_not_positive(implementation, sealed):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(2), pool)
    sel = [[0, 1, -1, -1, -1, -1], [5, -1, 7, -1, -1, -1]]
    want = run_case(implementation, state, pool, sel, [sealed, 16], 0)
    np.testing.assert_array_equal(want.invalid, [2, 0])
    np.testing.assert_array_equal(want.slots[0], -1)


@pytest.mark.parametrize("sealed", [17, 100, INT32_MAX], ids=["R_plus_1", "far", "int32_max"])
def test_sealed_past_R(implementation, sealed):
    cfg = config(**SHAPE_A)
    pool = make_pool(cfg)
    want = run_case(implementation, empty_state(cfg), pool, [[15, 16, 0, 100, -1, -1], PAD], [sealed, 0], 0)
    assert want.invalid[0] == 2  # ids >= R stay invalid whatever sealed says
    assert want.misses[0] == 2


def test_page_size_above_one(implementation):
    cfg = config(L=2, streams=(2,), R=10, B=4, k=3, width=3, page_size=4)  # 48-byte records
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(3), pool)
    run_case(implementation, state, pool, [[1, 9, 4], [0, 0, 6]], [10, 7], 1)


def test_several_stream_dims(implementation):
    cfg = config(L=2, streams=(2, 3), R=10, B=4, k=3)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(4), pool)
    rng = np.random.default_rng(5)
    sel = rng.integers(-1, 10, size=(2, 3, 3))
    sealed = rng.integers(0, 11, size=(2, 3))
    run_case(implementation, state, pool, sel, sealed, 1)


@pytest.mark.parametrize("dtype", list(RECORD_DTYPES.values()), ids=list(RECORD_DTYPES))
def test_record_dtypes(implementation, dtype):
    """Random bytes as records: NaN payloads and signed zeros must survive the copy."""
    cfg = config(L=2, streams=(3,), R=12, B=5, k=4, width=16 // np.dtype(dtype).itemsize, dtype=dtype)
    pool = make_pool(cfg, seed=6)
    state = random_state(cfg, np.random.default_rng(7), pool)
    run_case(implementation, state, pool, [[0, 11, 3, 3], [5, -1, 6, 7], [10, 9, 8, 1]], [12, 12, 12], 1)


def test_layer_traced_inside_jit(implementation):
    """The same call on each layer through one compiled program: only that layer changes."""
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(8), pool)
    for layer in range(cfg.num_layers):
        run_case(implementation, state, pool, [[1, 2, 3, 2], [4, 4, 11, -1]], [12, 12], layer)


@pytest.mark.parametrize("layer", [-1, 3, 1000, INT32_MIN], ids=["minus_one", "L", "far", "int32_min"])
def test_layer_out_of_range_resolves_nothing(implementation, layer):
    """A traced layer outside [0, L): every non-padding id invalid, slots -1, state untouched."""
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(9), pool)
    want = run_case(implementation, state, pool, [[1, -1, 3, -1], [40, -5, 2, -1]], [12, 12], layer)
    np.testing.assert_array_equal(want.invalid, [2, 3])
    np.testing.assert_array_equal(want.slots, -1)
    np.testing.assert_array_equal(want.misses, 0)
    np.testing.assert_array_equal(want.miss_records, -1)
    np.testing.assert_array_equal(want.miss_slots, -1)
    np.testing.assert_array_equal(want.slot_record, state.slot_record)
    np.testing.assert_array_equal(want.lru, state.lru)


def test_fetch_false_updates_metadata_not_hot(implementation):
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(10), pool)
    want = run_case(implementation, state, pool, [[1, 2, 3, 4], [9, 10, 11, -1]], [12, 12], 0, fetch=False)
    assert want.misses.sum() > 0
    assert not np.array_equal(want.slot_record, state.slot_record)
    assert oracle.as_bytes(want.hot, 3).tobytes() == oracle.as_bytes(state.hot, 3).tobytes()


def test_eager_python_int_layer(implementation):
    """Outside jit, with a Python int layer: the same answer as the compiled call."""
    cfg = config(**SHAPE_B)
    pool = make_pool(cfg)
    state = random_state(cfg, np.random.default_rng(11), pool)
    run_case(implementation, state, pool, [[1, 2, 1, 5], [0, -1, 11, 3]], [12, 12], 1, mode="eager")


def test_init_hot_cache_is_the_initial_state():
    cfg = config(L=2, streams=(2, 3), R=12, B=5, k=3)
    cache = hs.init_hot_cache(cfg)
    got, want = State.of(cache), empty_state(cfg)
    np.testing.assert_array_equal(got.slot_record, want.slot_record, strict=True)
    np.testing.assert_array_equal(got.lru, want.lru, strict=True)
    assert got.hot.shape == cfg.hot_shape and got.hot.dtype == cfg.dtype
    assert (cache.num_layers, cache.hot_slots, cache.stream_shape) == (2, 5, (2, 3))

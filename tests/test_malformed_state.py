"""RESOLVE on malformed states and on k = 0 (ffi/resolve.h, "Malformed state").

A stream (of the layer resolved) whose lru row is not a permutation of [0, B),
or whose slot_record row holds a value outside [-1, R) or one record id >= 0 in
two slots, resolves nothing: its rows stay as they were, its slots and miss
plan are -1, misses 0, invalid is counted by rule 0, and `malformed` is 1.
Every other stream resolves exactly as it would alone. Each case runs every
implementation (the oracle's rules written out here, the JAX reference, and the
FFI handler of the current backend: C++ on CPU, CUDA on GPU under both launch
plans) with zero tolerance on every output, on the state and on hot bytes, and
compares every other stream's and layer's rows byte for byte: no write lands
outside the malformed stream's rows, and nothing of them changes.
"""

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
    State,
    assert_array_identical,
    assert_bytes_equal,
    assert_matches_oracle,
    config,
    fetch_outputs,
    jitted_resolve,
    random_records,
    random_state,
    run_oracle,
    to_device,
    to_pinned_host,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT_FIELDS = ("slots", "miss_records", "miss_slots", "misses", "invalid", "malformed")

# The CUDA handler has two launch plans; both must follow the rule. Elsewhere
# the plan is ignored, so one run suffices.
LAUNCHES = ("fused", "split") if jax.default_backend() == "gpu" else ("auto",)
RUNS = [
    pytest.param(impl, launch, id=impl if len(LAUNCHES) == 1 or impl != "ffi" else f"ffi-{launch}")
    for impl in IMPLEMENTATIONS
    for launch in (LAUNCHES if impl == "ffi" else ("auto",))
]

# L = 2, four streams, 6 slots, k = 4; the stream broken is stream 1 of layer 1.
CFG = config(L=2, streams=(4,), R=24, B=6, k=4)
BROKEN, LAYER = 1, 1


# --------------------------------------------------------------------------- faults


# The faults that write one out-of-range value at one position of a row:
# fault -> (the row broken, the value given B and R).
ONE_VALUE_FAULTS = {
    "lru_1<<30": ("lru", lambda B, R: 1 << 30),
    "lru_int32_max": ("lru", lambda B, R: INT32_MAX),
    "lru_minus_one": ("lru", lambda B, R: -1),
    "lru_int32_min": ("lru", lambda B, R: INT32_MIN),
    "lru_holds_B": ("lru", lambda B, R: B),
    "record_minus_two": ("rec", lambda B, R: -2),
    "record_int32_min": ("rec", lambda B, R: INT32_MIN),
    "record_R": ("rec", lambda B, R: R),
    "record_int32_max": ("rec", lambda B, R: INT32_MAX),
}


def break_row(fault: str, rec: np.ndarray, lru: np.ndarray, R: int) -> int | None:
    """Breaks one stream's rows in place (rec, lru: [B] int32 views). Returns the
    record held twice for the record_twice faults (to select it or not), else None."""
    B = len(lru)
    i = 2 % B  # the position or slot changed
    if fault in ONE_VALUE_FAULTS:
        row, value = ONE_VALUE_FAULTS[fault]
        {"lru": lru, "rec": rec}[row][i] = value(B, R)
    elif fault == "lru_repeats_a_slot":  # needs B >= 2
        lru[i] = lru[(i + 1) % B]
    elif fault.startswith("record_twice"):  # needs B >= 2
        record = int(rec[rec >= 0][0]) if (rec >= 0).any() else 5
        rec[0] = rec[B - 1] = record
        return record
    else:
        raise ValueError(fault)
    return None


FAULTS = [
    "lru_1<<30",
    "lru_int32_max",
    "lru_minus_one",
    "lru_int32_min",
    "lru_holds_B",
    "lru_repeats_a_slot",
    "record_minus_two",
    "record_int32_min",
    "record_R",
    "record_int32_max",
    "record_twice_selected",
    "record_twice_not_selected",
]


def pool_of(cfg, seed=0) -> np.ndarray:
    return random_records(np.random.default_rng(seed), cfg.pool_shape, cfg.dtype)


def rows(x: np.ndarray, cfg) -> np.ndarray:
    """[L, *S, B, ...] -> [L, S, B, ...] (a view of one flat stream axis)."""
    return x.reshape(cfg.num_layers, cfg.num_streams, *x.shape[1 + len(cfg.stream_shape) :])


def broken_state(cfg, pool, faults: dict[int, str], layer: int, seed=1):
    """A random well-formed state, and a copy whose `layer` rows of each stream in
    `faults` are broken. Returns (good, bad, records held twice per stream)."""
    good = random_state(cfg, np.random.default_rng(seed), pool)
    bad = State(good.hot.copy(), good.slot_record.copy(), good.lru.copy())
    rec, lru = rows(bad.slot_record, cfg), rows(bad.lru, cfg)
    twice = {}
    for stream, fault in faults.items():
        twice[stream] = break_row(fault, rec[layer, stream], lru[layer, stream], cfg.pool_records)
    return good, bad, twice


def selection_for(cfg, state: State, layer: int, twice: dict, faults: dict, seed=2) -> np.ndarray:
    """[*S, k]: hits, misses, padding and an invalid id per stream; the record held
    twice is selected for record_twice_selected and kept out otherwise."""
    rng = np.random.default_rng(seed)
    S, k, R = cfg.num_streams, cfg.top_k, cfg.pool_records
    rec = rows(state.slot_record, cfg)[layer]
    sel = np.full((S, k), -1, np.int32)
    for s in range(S):
        held = [int(r) for r in rec[s] if 0 <= r < R]
        picks = [held[0] if held else 0, int(rng.integers(0, R)), R + 3]  # hit, maybe miss, invalid
        sel[s, : len(picks)] = picks
        if twice.get(s) is not None:
            if faults[s] == "record_twice_selected":
                sel[s, 1] = twice[s]
            else:
                sel[s][sel[s] == twice[s]] = -1
    return sel.reshape(*cfg.stream_shape, k)


def call_once(implementation, launch, state: State, pool, selection, sealed, layer):
    """One jitted call (not donated); returns (ResolveResult, HotCache)."""
    call = jitted_resolve(implementation, True, False, launch)
    return call(
        state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed), jnp.int32(layer)
    )


def resolve_with(implementation, launch, state: State, pool, selection, sealed, layer):
    """call_once's outputs as (int outputs dict, new State) of NumPy arrays."""
    return fetch_outputs(*call_once(implementation, launch, state, pool, selection, sealed, layer))


def rule0_invalid(selection, sealed, R) -> np.ndarray:
    """[*S]: ids other than -1 outside [0, min(sealed, R))."""
    selection, sealed = np.asarray(selection), np.asarray(sealed)
    limit = np.clip(np.minimum(sealed, R), 0, None)[..., None]
    return ((selection != -1) & ((selection < 0) | (selection >= limit))).sum(-1).astype(np.int32)


def assert_resolved_nothing(ints, got: State, before: State, cfg, stream, layer, selection, sealed):
    """The malformed-state rule for one flat stream, and every row of it untouched."""
    flat = {name: v.reshape(cfg.num_streams, -1) for name, v in ints.items()}
    for name in ("slots", "miss_records", "miss_slots"):
        assert (flat[name][stream] == -1).all(), f"{name} of malformed stream {stream}: {flat[name][stream]}"
    assert flat["misses"][stream, 0] == 0
    assert flat["malformed"][stream, 0] == 1
    want_invalid = rule0_invalid(selection, sealed, cfg.pool_records).reshape(-1)[stream]
    assert flat["invalid"][stream, 0] == want_invalid
    for name in ("slot_record", "lru"):
        assert_array_identical(
            rows(getattr(got, name), cfg)[layer, stream],
            rows(getattr(before, name), cfg)[layer, stream],
            f"{name} row of malformed stream {stream}",
        )
    assert_bytes_equal(rows(got.hot, cfg)[layer, stream], rows(before.hot, cfg)[layer, stream], 1, "hot")


def assert_streams_equal(a_ints, a: State, b_ints, b: State, cfg, streams, what):
    """Every output, state row and hot byte of `streams` (flat indices), all layers."""
    for name, v in a_ints.items():
        assert_array_identical(
            v.reshape(cfg.num_streams, -1)[streams],
            b_ints[name].reshape(cfg.num_streams, -1)[streams],
            f"{what}: {name}",
        )
    for name in ("slot_record", "lru"):
        assert_array_identical(
            rows(getattr(a, name), cfg)[:, streams], rows(getattr(b, name), cfg)[:, streams], f"{what}: {name}"
        )
    assert_bytes_equal(rows(a.hot, cfg)[:, streams], rows(b.hot, cfg)[:, streams], 3, f"{what}: hot")


# --------------------------------------------------------------------------- the oracle itself


def test_oracle_malformed_rule_by_hand():
    """The oracle's check and its answer, written out by hand for one stream."""
    assert not oracle.is_malformed([7, -1, 3], [2, 0, 1], 8)
    assert oracle.is_malformed([7, -1, 3], [2, 0, 3], 8)  # lru holds B
    assert oracle.is_malformed([7, -1, 3], [2, 2, 1], 8)  # slot 2 twice, slot 0 missing
    assert oracle.is_malformed([7, -2, 3], [2, 0, 1], 8)  # record below -1
    assert oracle.is_malformed([8, -1, 3], [2, 0, 1], 8)  # record past R
    assert oracle.is_malformed([3, -1, 3], [2, 0, 1], 8)  # record 3 in two slots
    assert not oracle.is_malformed([-1, -1, -1], [2, 0, 1], 8)  # empty slots repeat -1: fine
    out = oracle.resolve_stream([3, 9, -1, 5], sealed=6, slot_record=[3, -1, 3], lru=[2, 0, 1], pool_records=8)
    assert out.malformed and out.misses == 0 and out.invalid == 1  # 9 >= sealed
    assert out.slots == out.miss_records == out.miss_slots == [-1] * 4
    assert out.slot_record == [3, -1, 3] and out.lru == [2, 0, 1]


# --------------------------------------------------------------------------- one malformed stream


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("implementation, launch", RUNS)
def test_malformed_stream_resolves_nothing(implementation, launch, fault):
    """Stream 1 of layer 1 broken: it resolves nothing, untouched; streams 0, 2, 3
    and layer 0 come out exactly as from the unbroken state."""
    pool = pool_of(CFG)
    good, bad, twice = broken_state(CFG, pool, {BROKEN: fault}, LAYER)
    assert oracle.is_malformed(
        rows(bad.slot_record, CFG)[LAYER, BROKEN], rows(bad.lru, CFG)[LAYER, BROKEN], CFG.pool_records
    )
    selection = selection_for(CFG, bad, LAYER, twice, {BROKEN: fault})
    sealed = np.full(CFG.stream_shape, CFG.pool_records, np.int32)
    sealed[2] = 10  # rule 0 still counts on a healthy stream beside

    # The oracle: the rule by hand, and the other streams as from the unbroken state.
    want = run_oracle(bad, pool, selection, sealed, LAYER)
    want_ints = {name: getattr(want, name) for name in INT_FIELDS}
    assert_resolved_nothing(want_ints, State.of_oracle(want), bad, CFG, BROKEN, LAYER, selection, sealed)
    healthy = [0, 2, 3]
    unbroken = run_oracle(good, pool, selection, sealed, LAYER)
    unbroken_ints = {name: getattr(unbroken, name) for name in INT_FIELDS}
    assert_streams_equal(
        want_ints, State.of_oracle(want), unbroken_ints, State.of_oracle(unbroken), CFG, healthy, "oracle"
    )
    assert want.misses.sum() > 0, "the healthy streams should miss somewhere"
    if fault == "record_twice_selected":
        assert twice[BROKEN] in selection[BROKEN]

    # The implementation: the oracle's bits, and the same comparisons on its own outputs.
    result, cache = call_once(implementation, launch, bad, pool, selection, sealed, LAYER)
    got = assert_matches_oracle(result, cache, want, where=f"{implementation}/{launch} {fault}")
    ints, _ = fetch_outputs(result, cache)
    assert_resolved_nothing(ints, got, bad, CFG, BROKEN, LAYER, selection, sealed)
    ref_ints, ref_state = resolve_with(implementation, launch, good, pool, selection, sealed, LAYER)
    assert_streams_equal(ints, got, ref_ints, ref_state, CFG, healthy, f"{implementation} healthy streams")


@pytest.mark.parametrize("implementation, launch", RUNS)
def test_malformed_stream_in_another_layer_is_not_checked(implementation, launch):
    """Only the layer resolved is checked: a broken row of layer 0 does not stop
    layer 1 from resolving, and stays as it was."""
    pool = pool_of(CFG)
    _, bad, twice = broken_state(CFG, pool, {BROKEN: "lru_1<<30"}, layer=0)
    selection = selection_for(CFG, bad, LAYER, twice, {})
    sealed = np.full(CFG.stream_shape, CFG.pool_records, np.int32)
    want = run_oracle(bad, pool, selection, sealed, LAYER)
    np.testing.assert_array_equal(want.malformed, 0)
    result, cache = call_once(implementation, launch, bad, pool, selection, sealed, LAYER)
    got = assert_matches_oracle(result, cache, want, where=implementation)
    assert_array_identical(rows(got.lru, CFG)[0], rows(bad.lru, CFG)[0], "layer 0 lru")


# --------------------------------------------------------------------------- several at once


MIXED = {1: "lru_1<<30", 2: "record_twice_selected", 4: "lru_minus_one", 5: "record_R"}
MIXED_CFG = config(L=2, streams=(2, 3), R=20, B=5, k=3, width=4, page_size=2, dtype=np.float16)


@pytest.mark.parametrize("implementation, launch", RUNS)
def test_malformed_and_healthy_streams_in_one_call(implementation, launch):
    """Four broken streams (two stream dims) beside two healthy ones: the broken
    ones resolve nothing, each healthy one exactly as in a call of its own."""
    cfg = MIXED_CFG
    pool = pool_of(cfg, seed=3)
    _, bad, twice = broken_state(cfg, pool, MIXED, LAYER, seed=4)
    selection = selection_for(cfg, bad, LAYER, twice, MIXED, seed=5)
    sealed = np.full(cfg.stream_shape, cfg.pool_records, np.int32)
    want = run_oracle(bad, pool, selection, sealed, LAYER)
    np.testing.assert_array_equal(want.malformed.reshape(-1), [0, 1, 1, 0, 1, 1])

    result, cache = call_once(implementation, launch, bad, pool, selection, sealed, LAYER)
    got = assert_matches_oracle(result, cache, want, where=implementation)
    ints, _ = fetch_outputs(result, cache)
    for stream in MIXED:
        assert_resolved_nothing(ints, got, bad, cfg, stream, LAYER, selection, sealed)

    # Each healthy stream alone: a one-stream cache cut out of the same arrays.
    alone_cfg = config(L=2, streams=(1,), R=20, B=5, k=3, width=4, page_size=2, dtype=np.float16)
    flat_sel, flat_sealed = selection.reshape(cfg.num_streams, -1), sealed.reshape(-1)
    for stream in (0, 3):
        one = slice(stream, stream + 1)

        def cut(x):
            return rows(x, cfg)[:, one].copy()

        alone = State(cut(bad.hot), cut(bad.slot_record), cut(bad.lru))
        alone_ints, alone_state = resolve_with(
            implementation, launch, alone, cut(pool), flat_sel[one], flat_sealed[one], LAYER
        )
        for name, v in alone_ints.items():
            assert_array_identical(
                ints[name].reshape(cfg.num_streams, -1)[stream], v.reshape(-1), f"stream {stream} alone: {name}"
            )
        for name in ("slot_record", "lru"):
            assert_array_identical(
                rows(getattr(got, name), cfg)[:, stream],
                rows(getattr(alone_state, name), alone_cfg)[:, 0],
                f"stream {stream} alone: {name}",
            )
        assert_bytes_equal(rows(got.hot, cfg)[:, stream], rows(alone_state.hot, alone_cfg)[:, 0], 2, "hot")


@pytest.mark.parametrize("implementation, launch", RUNS)
def test_eager_call_with_python_int_layer(implementation, launch):
    """Outside jit: the same bits as the oracle."""
    cfg = MIXED_CFG
    pool = pool_of(cfg, seed=6)
    _, bad, twice = broken_state(cfg, pool, MIXED, 0, seed=7)
    selection = selection_for(cfg, bad, 0, twice, MIXED, seed=8)
    sealed = np.full(cfg.stream_shape, cfg.pool_records, np.int32)
    result, cache = hs.resolve(
        bad.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed), 0,
        implementation=implementation, launch=launch,
    )
    assert_matches_oracle(result, cache, run_oracle(bad, pool, selection, sealed, 0), where=implementation)


# --------------------------------------------------------------------------- under scan, state carried


@functools.cache
def scanned_resolve(implementation: str, launch: str):
    """resolve over a scan of (layer, selection, sealed) steps, the cache carried
    and donated; the layer is a traced scan input."""

    def run(cache, pool, layers, selections, sealeds):
        def step(cache, xs):
            layer, selection, sealed = xs
            result, cache = hs.resolve(
                cache, pool, selection, sealed, layer, implementation=implementation, launch=launch
            )
            return cache, result

        return jax.lax.scan(step, cache, (layers, selections, sealeds))

    return jax.jit(run, donate_argnums=0)


@pytest.mark.parametrize("implementation, launch", RUNS)
def test_inside_scan_with_a_traced_layer(implementation, launch):
    """Eight steps over both layers, streams broken in one layer only: each step
    matches the oracle run step by step; broken rows never change; a stream that
    reset_streams empties resolves again."""
    cfg = CFG
    pool = pool_of(cfg, seed=9)
    faults = {1: "lru_repeats_a_slot", 3: "record_twice_not_selected"}
    _, state, _ = broken_state(cfg, pool, faults, layer=1, seed=10)
    rng = np.random.default_rng(11)
    layers = np.array([1, 0, 1, 1, 0, 5, 1, 0], np.int32)  # 5: out of range
    shape = (len(layers), *cfg.stream_shape, cfg.top_k)
    selections = rng.integers(-1, cfg.pool_records + 2, size=shape).astype(np.int32)
    sealeds = np.full((len(layers), *cfg.stream_shape), cfg.pool_records, np.int32)

    want_steps, oracle_state = [], state
    for t, layer in enumerate(layers):
        out = run_oracle(oracle_state, pool, selections[t], sealeds[t], int(layer))
        want_steps.append(out)
        oracle_state = State.of_oracle(out)
    cache, results = scanned_resolve(implementation, launch)(
        state.to_cache(), to_pinned_host(pool), jnp.asarray(layers), jnp.asarray(selections), jnp.asarray(sealeds)
    )
    results, final = jax.device_get(results), State.of(cache)
    for t, want in enumerate(want_steps):
        for name in ("slots", "miss_records", "miss_slots", "misses", "invalid", "malformed"):
            assert_array_identical(getattr(results, name)[t], getattr(want, name), f"step {t} {name}")
    want_flags = [[0, 1, 0, 1] if layer == 1 else [0, 0, 0, 0] for layer in layers]
    np.testing.assert_array_equal(np.asarray(results.malformed), want_flags)
    for name in ("slot_record", "lru"):
        assert_array_identical(getattr(final, name), getattr(oracle_state, name), f"final {name}")
        for stream in faults:  # broken rows: as they came in, after every step
            assert_array_identical(
                rows(getattr(final, name), cfg)[1, stream], rows(getattr(state, name), cfg)[1, stream], name
            )
    assert_bytes_equal(final.hot, oracle_state.hot, 3, "final hot")

    # reset_streams is the way back: the streams resolve again.
    repaired = hs.reset_streams(final.to_cache(), jnp.array([False, True, False, True]))
    cache, results = scanned_resolve(implementation, launch)(
        repaired, to_pinned_host(pool), jnp.asarray(layers[:2]), jnp.asarray(selections[:2]), jnp.asarray(sealeds[:2])
    )
    np.testing.assert_array_equal(np.asarray(results.malformed), 0)


# --------------------------------------------------------------------------- random faults, long sequences


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param(config(L=2, streams=(5,), R=30, B=8, k=5), id="f32_5streams"),
        pytest.param(config(L=1, streams=(3,), R=6, B=1, k=1), id="B1"),
        pytest.param(config(L=3, streams=(2, 2), R=40, B=12, k=12, width=8, dtype=np.uint8), id="B_eq_k_u8"),
    ],
)
@pytest.mark.parametrize("implementation, launch", RUNS)
def test_random_faults_over_a_sequence(implementation, launch, cfg):
    """Twelve donated calls; before each, some rows break (any fault) and some are
    emptied as reset_streams would: every call matches the oracle bit for bit."""
    rng = np.random.default_rng(12)
    pool = random_records(rng, cfg.pool_shape, cfg.dtype)
    state = random_state(cfg, rng, pool)
    call = jitted_resolve(implementation, True, True, launch)
    host_pool = to_pinned_host(pool)
    needs_two_slots = ("lru_repeats_a_slot", "record_twice_selected", "record_twice_not_selected")
    faults = [f for f in FAULTS if cfg.hot_slots > 1 or f not in needs_two_slots]
    seen = np.zeros(2, int)  # malformed, healthy streams resolved
    for step in range(12):
        rec, lru = rows(state.slot_record, cfg), rows(state.lru, cfg)
        for layer in range(cfg.num_layers):
            for stream in range(cfg.num_streams):
                roll = rng.random()
                if roll < 0.25:
                    fault = faults[rng.integers(len(faults))]
                    break_row(fault, rec[layer, stream], lru[layer, stream], cfg.pool_records)
                elif roll < 0.4:
                    rec[layer, stream], lru[layer, stream] = -1, np.arange(cfg.hot_slots)
        layer = int(rng.integers(0, cfg.num_layers))
        selection = rng.integers(-1, cfg.pool_records + 2, size=(*cfg.stream_shape, cfg.top_k)).astype(np.int32)
        sealed = rng.integers(0, cfg.pool_records + 2, size=cfg.stream_shape).astype(np.int32)
        result, cache = call(state.to_cache(), host_pool, jnp.asarray(selection), jnp.asarray(sealed), jnp.int32(layer))
        want = run_oracle(state, pool, selection, sealed, layer)
        got = assert_matches_oracle(result, cache, want, where=f"{implementation} step {step}")
        state = State(got.hot.copy(), got.slot_record.copy(), got.lru.copy())  # writable, to break
        seen += [want.malformed.sum(), want.malformed.size - want.malformed.sum()]
    assert seen.min() > 0, f"the sequence should mix malformed and healthy streams, saw {seen}"


# --------------------------------------------------------------------------- k = 0


K0_CFG = config(L=2, streams=(2, 2), R=10, B=4, k=1)


def k0_operands(seed=13, broken: dict | None = None, layer=0):
    pool = pool_of(K0_CFG, seed)
    good, bad, _ = broken_state(K0_CFG, pool, broken or {}, layer, seed=seed + 1)
    selection = np.zeros((*K0_CFG.stream_shape, 0), np.int32)
    sealed = np.full(K0_CFG.stream_shape, K0_CFG.pool_records, np.int32)
    return pool, bad, selection, sealed


@pytest.mark.parametrize("layer", [0, 1, 2, -1], ids=["layer0", "layer1", "L", "minus_one"])
@pytest.mark.parametrize("implementation, launch", RUNS)
def test_k0_is_an_empty_call(implementation, launch, layer):
    """An empty selection: [*S, 0] outputs, misses 0, invalid 0, state untouched;
    malformed reported as usual (stream 3 of layer 1 is broken; 0 for a layer
    outside [0, L))."""
    pool, state, selection, sealed = k0_operands(broken={3: "lru_holds_B"}, layer=1)
    want = run_oracle(state, pool, selection, sealed, layer)
    assert want.slots.shape == (2, 2, 0)
    np.testing.assert_array_equal(want.malformed, [[0, 0], [0, 1]] if layer == 1 else 0)
    ints, got = resolve_with(implementation, launch, state, pool, selection, sealed, layer)
    for name, v in ints.items():
        assert_array_identical(v, getattr(want, name), name)
    np.testing.assert_array_equal(ints["misses"], 0)
    np.testing.assert_array_equal(ints["invalid"], 0)
    for name in ("slot_record", "lru"):
        assert_array_identical(getattr(got, name), getattr(state, name), name)
    assert_bytes_equal(got.hot, state.hot, 3, "hot")


@pytest.mark.parametrize("implementation, launch", RUNS)
def test_k0_eager_and_in_scan(implementation, launch):
    pool, state, selection, sealed = k0_operands(seed=20)
    result, cache = hs.resolve(
        state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed), 1,
        implementation=implementation, launch=launch,
    )
    assert_matches_oracle(result, cache, run_oracle(state, pool, selection, sealed, 1), where="eager")
    layers = jnp.array([0, 1, 0], jnp.int32)
    cache, results = scanned_resolve(implementation, launch)(
        state.to_cache(), to_pinned_host(pool), layers, jnp.broadcast_to(jnp.asarray(selection), (3, 2, 2, 0)),
        jnp.broadcast_to(jnp.asarray(sealed), (3, 2, 2)),
    )
    assert results.slots.shape == (3, 2, 2, 0)
    np.testing.assert_array_equal(results.misses, 0)
    np.testing.assert_array_equal(State.of(cache).lru, state.lru)


def test_k0_checked_mode_passes(implementation):
    """checked=True on an empty selection of a well-formed cache raises nothing."""
    from jax.experimental import checkify

    pool, state, selection, sealed = k0_operands(seed=30)

    def f(cache, pool, selection, sealed):
        return hs.resolve(cache, pool, selection, sealed, 0, implementation=implementation, checked=True)

    err, (result, _) = checkify.checkify(jax.jit(f))(
        state.to_cache(), to_pinned_host(pool), jnp.asarray(selection), jnp.asarray(sealed)
    )
    err.throw()
    np.testing.assert_array_equal(result.malformed, 0)


def test_k0_with_the_device_pool_reference():
    """The reference reads a device pool too (no pinned_host needed) at k = 0."""
    pool, state, selection, sealed = k0_operands(seed=40)
    result, cache = jitted_resolve("reference")(
        state.to_cache(), to_device(pool), jnp.asarray(selection), jnp.asarray(sealed), jnp.int32(0)
    )
    assert_matches_oracle(result, cache, run_oracle(state, pool, selection, sealed, 0), where="reference")

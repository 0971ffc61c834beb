"""hisparse_jax.selection.policies: every policy against a plain per-id simulation, LRU against
RESOLVE itself, Belady against an exhaustive search, and the overlaps on hand-made traces."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hisparse_jax as hs
from hisparse_jax.selection import policies as cp
from hisparse_jax.selection import synthetic
from helpers import config, examples, to_pinned_host

# --------------------------------------------------------------------------- the plain simulation


def plain_misses(ids: np.ndarray, capacity: int, policy: str, seed: int = 0) -> np.ndarray:
    """Each policy's rule applied id by id with lists and dicts (docs/policies.md)."""
    steps, rows, _ = ids.shape
    draws = np.random.default_rng(seed)
    out = np.zeros((steps, rows), np.int64)
    caches = [dict(record=[-1] * capacity, lru=list(range(capacity)), inserted=[None] * capacity,
                   uses=[0] * capacity, bit=[False] * capacity, hand=0) for _ in range(rows)]
    insertions = 0
    for t in range(steps):
        keys = draws.random((rows, capacity)) if policy == "random" else None  # one key per slot and step
        for r, c in enumerate(caches):
            picks = [int(x) for x in ids[t, r] if x >= 0]
            holder = {record: slot for slot, record in enumerate(c["record"]) if record >= 0}
            hits = [holder[x] for x in picks if x in holder]
            misses = [x for x in picks if x not in holder]
            evictable = [s for s in range(capacity) if s not in hits]
            empty = lambda s: c["record"][s] < 0

            if policy in ("lru", "fifo", "random", "lfu", "belady"):
                if policy == "lru":  # rule 3: evictable slots in lru order
                    ordered = [s for s in c["lru"] if s not in hits]
                else:
                    def priority(s):
                        if empty(s):
                            return (0, s)
                        if policy == "fifo":
                            return (1, c["inserted"][s])
                        if policy == "random":
                            return (1, keys[r, s])
                        if policy == "lfu":
                            return (1, c["uses"][s], c["lru"].index(s))
                        later = [u for u in range(t + 1, steps) if c["record"][s] in ids[u, r]]
                        return (1, -(later[0] if later else float("inf")), s)

                    ordered = sorted(evictable, key=priority)
                victims = ordered[: len(misses)]
            else:  # clock
                for s in hits:
                    c["bit"][s] = True
                busy, victims = set(hits), []
                for _ in misses:
                    free = [s for s in range(capacity) if empty(s) and s not in busy]
                    if free:
                        s = free[0]
                    else:
                        while True:
                            s, c["hand"] = c["hand"], (c["hand"] + 1) % capacity
                            if s in busy:
                                continue
                            if c["bit"][s]:
                                c["bit"][s] = False
                                continue
                            break
                    victims.append(s)
                    busy.add(s)

            for s in hits:
                c["uses"][s] += 1
            for x, s in zip(misses, victims):
                c["record"][s] = x
                c["inserted"][s] = insertions
                insertions += 1
                c["uses"][s] = 1
                c["bit"][s] = True
            # rule 4: not taken, then filled (miss order), then hits (old order)
            c["lru"] = ([s for s in c["lru"] if s not in hits and s not in victims] + victims
                        + [s for s in c["lru"] if s in hits])
            assert all(c["record"].count(x) == 1 for x in picks)  # every pick resident afterwards
            out[t, r] = len(misses)
    return out


def optimal_misses(ids: np.ndarray, capacity: int) -> int:
    """The fewest misses any eviction choices give (all of them enumerated), summed over rows."""
    total = 0
    for r in range(ids.shape[1]):
        wanted = [frozenset(int(x) for x in ids[t, r] if x >= 0) for t in range(ids.shape[0])]

        @functools.cache
        def best(t: int, resident: frozenset) -> int:
            if t == len(wanted):
                return 0
            missed = len(wanted[t] - resident)
            after = resident | wanted[t]
            excess = len(after) - capacity
            if excess <= 0:  # empty slots first: nothing is evicted while one is left
                return missed + best(t + 1, after)
            return missed + min(best(t + 1, after - set(out))
                                for out in itertools.combinations(sorted(resident - wanted[t]), excess))

        total += best(0, frozenset())
    return total


def random_trace(rng: np.random.Generator, steps: int, rows: int, k: int, records: int, *, full: float = 0.7,
                 ascending: bool = True) -> np.ndarray:
    """[steps, rows, k] rows of distinct ids (mostly k of them), -1 padding at the end."""
    ids = np.full((steps, rows, k), -1, np.int32)
    for t in range(steps):
        for r in range(rows):
            n = k if rng.random() < full else int(rng.integers(0, k + 1))
            picked = rng.choice(records, size=n, replace=False)
            ids[t, r, :n] = np.sort(picked) if ascending else picked
    return ids


@st.composite
def small_traces(draw, max_k: int = 4):
    k = draw(st.integers(1, max_k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = random_trace(rng, draw(st.integers(1, 10)), draw(st.integers(1, 3)), k, draw(st.integers(k, k + 6)),
                       ascending=draw(st.booleans()))
    return ids, k + draw(st.integers(0, 4))


# --------------------------------------------------------------------------- every policy, plainly


@pytest.mark.parametrize("policy", cp.POLICIES)
@settings(max_examples=examples(60))
@given(case=small_traces(), seed=st.integers(0, 3))
def test_policy_matches_plain_simulation(policy, case, seed):
    ids, capacity = case
    np.testing.assert_array_equal(cp.simulate(ids, capacity, policy, seed=seed),
                                  plain_misses(ids, capacity, policy, seed=seed))


@pytest.mark.parametrize("policy", cp.POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_policy_matches_plain_simulation_on_longer_traces(policy, seed):
    rng = np.random.default_rng(seed)
    ids = random_trace(rng, 40, 3, 6, 14, ascending=seed != 1)
    for capacity in (6, 8, 11):
        np.testing.assert_array_equal(cp.simulate(ids, capacity, policy, seed=seed),
                                      plain_misses(ids, capacity, policy, seed=seed))


def _rows(*rows, k=None):
    """A [steps, 1, k] trace from lists of ids (padded with -1 to k)."""
    k = k or max(len(r) for r in rows)
    return np.array([[list(r) + [-1] * (k - len(r))] for r in rows], np.int32)


CORNERS = {
    # name: (ids, B, expected misses per step of the one stream, or None: only the plain check)
    "B == k": (_rows([0, 1, 2], [1, 2, 3], [0, 3, 4], [0, 1, 2]), 3, None),
    "repeated selection": (_rows(*[[2, 5, 7]] * 6), 3, [3, 0, 0, 0, 0, 0]),
    "disjoint selections": (_rows([0, 1], [2, 3], [4, 5], [6, 7]), 4, [2, 2, 2, 2]),
    "padding rows": (_rows([], [3, 1], [], [], [1, 3], k=2), 2, [0, 2, 0, 0, 0]),
    "fewer ids than k": (_rows([4], [4, 6], [6], [1, 4, 6], [8], k=3), 3, [1, 1, 0, 1, 1]),
    "all resident from the start": (_rows([0, 1], [1], [0], [0, 1], k=2), 4, [2, 0, 0, 0]),
}


@pytest.mark.parametrize("policy", cp.POLICIES)
@pytest.mark.parametrize("name", CORNERS)
def test_corner_cases(policy, name):
    ids, capacity, expected = CORNERS[name]
    got = cp.simulate(ids, capacity, policy)
    np.testing.assert_array_equal(got, plain_misses(ids, capacity, policy))
    if expected is not None:
        np.testing.assert_array_equal(got[:, 0], expected)


def test_b_equals_k_is_the_same_for_every_policy():
    """With B = k and full rows every slot holds an id of the current step: any policy misses alike."""
    ids = random_trace(np.random.default_rng(5), 30, 2, 5, 9, full=1.0)
    results = [cp.simulate(ids, 5, p) for p in cp.POLICIES]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_lru_promotes_hits_above_fills():
    """Rule 4: records used at the same step leave the hits above the records just fetched."""
    # B = 3. Step 1 hits record 1 and fetches record 2, so the order is [0] + [2] + [1]; records
    # 3 and 4 then evict 0 and 2, and 1 is still resident at the end.
    ids = _rows([0, 1], [1, 2], [3], [4], [1])
    np.testing.assert_array_equal(cp.simulate(ids, 3, "lru")[:, 0], [2, 1, 1, 1, 0])
    ids[-1, 0, 0] = 2
    np.testing.assert_array_equal(cp.simulate(ids, 3, "lru")[:, 0], [2, 1, 1, 1, 1])


# --------------------------------------------------------------------------- LRU is RESOLVE


def resolve_misses(ids: np.ndarray, capacity: int, implementation: str) -> np.ndarray:
    """The misses RESOLVE reports replaying ids [steps, layers, streams, k]: [steps, layers, streams]."""
    _, layers, streams, k = ids.shape
    records = int(ids.max()) + 1
    cfg = config(L=layers, streams=(streams,), R=records, B=capacity, k=k)
    pool = to_pinned_host(np.zeros(cfg.pool_shape, cfg.dtype))
    sealed = jnp.full((streams,), records, jnp.int32)

    @jax.jit
    def run(cache, pool, ids):
        def step(cache, selection):
            misses = []
            for layer in range(layers):
                result, cache = hs.resolve(cache, pool, selection[layer], sealed, layer,
                                           implementation=implementation, fetch=False)
                misses.append(result.misses)
            return cache, jnp.stack(misses)

        return jax.lax.scan(step, cache, ids)[1]

    return np.asarray(run(hs.init_hot_cache(cfg), pool, jnp.asarray(ids)))


def test_lru_equals_resolve_on_random_traces(implementation):
    rng = np.random.default_rng(11)
    ids = np.stack([random_trace(rng, 40, 3, 6, 20, full=0.8) for _ in range(2)], axis=1)  # 2 layers
    for capacity in (6, 9):
        want = resolve_misses(ids, capacity, implementation)
        for layer in range(ids.shape[1]):
            np.testing.assert_array_equal(cp.simulate(ids[:, layer], capacity, "lru"), want[:, layer])


def test_lru_equals_resolve_on_a_synthetic_trace(implementation):
    trace = synthetic.TraceConfig.calibration("glm-5.1", sink_tokens=1, local_tokens=2)
    ids = np.asarray(synthetic.selections(trace, 2, (2,), 64, 8, jnp.full((2,), 30, jnp.int32), 40, seed=3))
    want = resolve_misses(ids, 12, implementation)
    assert 0 < want[1:].sum() < want[0].sum() * 39  # some locality, some misses
    for layer in range(2):
        np.testing.assert_array_equal(cp.simulate(ids[:, layer], 12, "lru"), want[:, layer])


# --------------------------------------------------------------------------- Belady


@settings(max_examples=examples(80))
@given(case=small_traces(max_k=3))
def test_belady_equals_exhaustive_optimum(case):
    ids, capacity = case
    ids = ids[:6]  # keeps the enumeration small
    assert cp.simulate(ids, capacity, "belady").sum() == optimal_misses(ids, capacity)


@pytest.mark.parametrize("seed", range(4))
def test_belady_is_never_worse_than_any_policy(seed):
    rng = np.random.default_rng(100 + seed)
    ids = random_trace(rng, 60, 4, 8, 24)
    for capacity in (8, 10, 12, 16, 24):
        best = cp.simulate(ids, capacity, "belady").sum(axis=0)
        for policy in cp.POLICIES:
            for draw in range(2 if policy == "random" else 1):
                assert np.all(best <= cp.simulate(ids, capacity, policy, seed=draw).sum(axis=0)), (policy, capacity)


# --------------------------------------------------------------------------- replay and overlaps


def test_replay_counts_from_warm_per_layer():
    rng = np.random.default_rng(7)
    ids = np.stack([random_trace(rng, 20, 2, 4, 10) for _ in range(3)], axis=1)  # [20, 3, 2, 4]
    report = cp.replay(ids, ratios=(1, 2), policies=("lru", "belady"), warm=5)
    assert report["capacities"] == [4, 8] and report["layers"] == 3 and report["streams"] == 2
    counted = ids[5:] >= 0
    assert report["selected"] == counted.sum()
    assert report["selected_per_layer"] == counted.sum(axis=(0, 2, 3)).tolist()
    for policy in ("lru", "belady"):
        for i, capacity in enumerate((4, 8)):
            per_layer = [cp.simulate(ids[:, l], capacity, policy)[5:].sum() for l in range(3)]
            assert report["misses"][policy][i] == sum(per_layer)
            assert report["miss_rate"][policy][i] == pytest.approx(sum(per_layer) / counted.sum())
            assert report["layer_miss_rate"][policy][i] == pytest.approx(
                [m / s for m, s in zip(per_layer, counted.sum(axis=(0, 2, 3)))])


def test_replay_takes_synthetic_stream_dims():
    ids = np.zeros((3, 2, 2, 3, 1), np.int32)  # [steps, layers, *S = (2, 3), k = 1]
    report = cp.replay(ids, ratios=(1,), policies=("fifo",))
    assert report["streams"] == 6 and report["misses"]["fifo"] == [12]  # step 0 only: 2 * 6 streams


def test_step_overlap_by_hand():
    # one layer, two streams; stream 1 has an empty row at step 1 (left out)
    ids = np.array([
        [[[0, 1, 2, 3], [5, 6, -1, -1]]],
        [[[2, 3, 4, 5], [-1, -1, -1, -1]]],  # stream 0: 2 of 4 were there
        [[[2, 3, 4, 5], [5, 7, -1, -1]]],  # stream 0: 4 of 4; stream 1: 0 of 2 (the step before was empty)
        [[[9, -1, -1, -1], [5, 6, 7, -1]]],  # stream 0: 0 of 1; stream 1: 2 of 3
    ], np.int32)
    np.testing.assert_allclose(cp.step_overlap(ids), [(0.5 + 1 + 0 + 0 + 2 / 3) / 5])


def test_layer_overlap_by_hand():
    ids = np.array([
        [[[0, 1, 2, 3]], [[1, 2, 3, 4]], [[7, 8, -1, -1]]],
        [[[0, 1, 2, 3]], [[0, 1, 2, 3]], [[0, 8, -1, -1]]],
    ], np.int32)  # [2 steps, 3 layers, 1 stream, k = 4]
    np.testing.assert_allclose(cp.layer_overlap(ids), [(0.75 + 1) / 2, (0 + 0.5) / 2])
    np.testing.assert_allclose(cp.step_overlap(ids), [1, 0.75, 0.5])
    assert cp.layer_overlap(ids[:, :1]).shape == (0,)
    assert np.isnan(cp.step_overlap(ids[:1])).all()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("call, needle", [
    (lambda: cp.simulate(np.zeros((2, 1, 3), np.int32), 2, "lru"), "capacity must be an int >= k = 3"),
    (lambda: cp.simulate(np.zeros((2, 1, 3), np.int32), 3, "mru"), "unknown policy 'mru'"),
    (lambda: cp.simulate(np.zeros((2, 3), np.int32), 3, "lru"), "[steps, streams, k]"),
    (lambda: cp.simulate(np.zeros((2, 1, 3)), 3, "lru"), "integer array"),
    (lambda: cp.simulate(np.full((2, 1, 3), -2), 3, "lru"), "-1 (padding)"),
    (lambda: cp.simulate(np.array([[[1, 1, 2]]]), 3, "lru"), "step 0, stream 0 names a record twice"),
    (lambda: cp.simulate(np.array([[[1, 2]], [[2, 2]]]), 3, "fifo"), "step 1, stream 0 names a record twice"),
    (lambda: cp.replay(np.zeros((2, 1, 1, 3), np.int32), ratios=(0.5,)), "ratios: 0.5 gives B = 2 below k = 3"),
    (lambda: cp.replay(np.zeros((2, 1, 1, 3), np.int32), warm=2), "warm must be an int in [0, steps = 2)"),
    (lambda: cp.replay(np.zeros((2, 1, 1, 3), np.int32), policies=("lru", "opt")), "unknown ['opt']"),
    (lambda: cp.replay(np.zeros((2, 1, 3), np.int32)), "[steps, layers, *streams, k]"),
])
def test_bad_input_is_a_one_line_value_error(call, needle):
    with pytest.raises(ValueError) as err:
        call()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_random_is_seeded():
    ids = random_trace(np.random.default_rng(3), 50, 2, 6, 18)
    a, b = cp.simulate(ids, 9, "random", seed=1), cp.simulate(ids, 9, "random", seed=1)
    np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, cp.simulate(ids, 9, "random", seed=s)) for s in range(2, 6))


@pytest.mark.parametrize("policy", cp.POLICIES)
def test_large_ids_cost_no_table_of_their_size(policy):
    """Ids far apart (2**28 would size a 1.2 GiB map) give the misses of the same trace with its
    ids renumbered in order, and the overlaps too."""
    rng = np.random.default_rng(5)
    small = np.stack([np.stack([np.sort(rng.choice(40, 6, replace=False)) for _ in range(3)]) for _ in range(12)])
    small[2, 1, 4:] = -1
    large = np.where(small >= 0, small * (2**28 // 40) + 7, -1)
    assert np.array_equal(cp.simulate(large, 9, policy, seed=3), cp.simulate(small, 9, policy, seed=3))
    assert np.allclose(cp.step_overlap(large[:, None]), cp.step_overlap(small[:, None]), equal_nan=True)

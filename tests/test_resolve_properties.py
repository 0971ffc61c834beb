"""RESOLVE over random call SEQUENCES, state carried from call to call: every
implementation against the loop oracle with zero tolerance after every call,
plus the invariants. Shapes come from a small catalog so each compiles once per
implementation; hypothesis draws the sequences (and, in one test, the shapes)."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (
    IMPLEMENTATIONS,
    CATALOG,
    Mix,
    assert_matches_oracle,
    check_invariants,
    config,
    examples,
    empty_state,
    jitted_resolve,
    random_records,
    run_oracle,
    run_sequence,
    to_pinned_host,
)

# --------------------------------------------------------------------------- seeded bulk runs

SEQUENCES_PER_CASE = examples(40)


@pytest.mark.parametrize("shape", list(CATALOG), ids=list(CATALOG))
def test_random_sequences(implementation, shape):
    """SEQUENCES_PER_CASE sequences of 1-12 calls per catalog shape, default locality."""
    cfg = CATALOG[shape]
    rng = np.random.default_rng(zlib.crc32(f"{shape}/{implementation}".encode()))
    misses = 0
    for _ in range(SEQUENCES_PER_CASE):
        misses += run_sequence(
            implementation, cfg, rng, steps=int(rng.integers(1, 13)), random_start=bool(rng.random() < 0.3)
        )
    assert misses > 0


@pytest.mark.parametrize(
    "mix",
    [
        pytest.param(
            Mix(padding=0, recent=10, resident=10, fresh=0.5, duplicate=0, invalid=0), id="mostly_hits"
        ),
        pytest.param(
            Mix(padding=0, recent=0, resident=0, fresh=1, duplicate=0, invalid=0), id="mostly_misses"
        ),
        pytest.param(
            Mix(padding=1, recent=1, resident=1, fresh=1, duplicate=4, invalid=0), id="many_duplicates"
        ),
        pytest.param(
            Mix(padding=2, recent=1, resident=1, fresh=1, duplicate=1, invalid=3), id="many_invalid"
        ),
    ],
)
def test_sequences_by_locality(implementation, mix):
    cfg = CATALOG["f32_3streams"]
    rng = np.random.default_rng(7)
    for _ in range(25):
        run_sequence(implementation, cfg, rng, steps=8, mix=mix, random_start=True)


def test_sequences_without_fetch(implementation):
    """fetch=False: metadata follows the contract, hot is never written."""
    cfg = CATALOG["bf16_2x3"]
    rng = np.random.default_rng(8)
    for _ in range(25):
        run_sequence(implementation, cfg, rng, steps=6, fetch=False, random_start=True)


@pytest.mark.skipif("ffi" not in IMPLEMENTATIONS, reason="no FFI handler for this backend")
@pytest.mark.parametrize("launch", ["auto", "fused", "split"])
@pytest.mark.parametrize("shape", ["f32_3streams", "many_streams"])
def test_launch_plans(launch, shape):
    """Every CUDA launch plan obeys the contract (the CPU handler ignores the plan).
    64 streams with B >> k gives the split plan many misses to spread."""
    cfg = CATALOG.get(shape) or config(
        L=2, streams=(8, 8), R=24, B=10, k=6, width=4, dtype=ml_dtypes.bfloat16
    )
    rng = np.random.default_rng(9)
    for _ in range(6):
        run_sequence("ffi", cfg, rng, steps=6, launch=launch, random_start=True)


# --------------------------------------------------------------------------- hypothesis


@settings(max_examples=examples(120))
@given(
    shape=st.sampled_from(list(CATALOG)),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 16),
    weights=st.tuples(*[st.floats(0, 4) for _ in range(6)]).filter(lambda w: sum(w) > 0.1),
    fetch=st.booleans(),
    random_start=st.booleans(),
)
def test_hypothesis_sequences(implementation, shape, seed, steps, weights, fetch, random_start):
    run_sequence(
        implementation,
        CATALOG[shape],
        np.random.default_rng(seed),
        steps=steps,
        mix=Mix(*weights),
        fetch=fetch,
        random_start=random_start,
    )


# A tiny shape where hypothesis writes every id itself, so a failure shrinks
# to a minimal sequence of selections.
TINY = config(L=2, streams=(2,), R=6, B=4, k=3)
ids = st.one_of(st.integers(-1, 7), st.sampled_from([-2, -(2**31), 2**31 - 1]))
calls = st.tuples(
    st.lists(st.lists(ids, min_size=3, max_size=3), min_size=2, max_size=2),  # selection [2, 3]
    st.lists(st.integers(-1, 7), min_size=2, max_size=2),  # sealed [2]
    st.integers(-1, 2),  # layer (-1 and 2 are out of range)
)


@settings(max_examples=examples(200))
@given(sequence=st.lists(calls, min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_hypothesis_explicit_selections(implementation, sequence, seed):
    pool = random_records(np.random.default_rng(seed), TINY.pool_shape, TINY.dtype)
    host_pool = to_pinned_host(pool)
    state = empty_state(TINY)
    cache = state.to_cache()
    call = jitted_resolve(implementation, True, donate=True)
    for step, (selection, sealed, layer) in enumerate(sequence):
        selection, sealed = np.asarray(selection, np.int32), np.asarray(sealed, np.int32)
        result, cache = call(cache, host_pool, selection, sealed, np.int32(layer))
        want = run_oracle(state, pool, selection, sealed, layer)
        new_state = assert_matches_oracle(result, cache, want, where=f"step {step}")
        check_invariants(state, new_state, pool, selection, sealed, layer, result.slots)
        state = new_state


DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16, np.uint8, np.int8]


@st.composite
def configs(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    page_size = draw(st.sampled_from([1, 2, 3]))
    k = draw(st.integers(1, 6))
    unit = 8 // np.gcd(8, page_size * dtype.itemsize)  # smallest width with records of 8n bytes
    return config(
        L=draw(st.integers(1, 3)),
        streams=tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))),
        R=draw(st.integers(1, 24)),
        B=k + draw(st.integers(0, 4)),
        k=k,
        width=unit * draw(st.integers(1, 2)),
        page_size=page_size,
        dtype=dtype,
    )


@settings(max_examples=examples(6))
@given(cfg=configs(), seed=st.integers(0, 2**32 - 1))
def test_hypothesis_configs(implementation, cfg, seed):
    """Shapes drawn by hypothesis (each compiles once: keep the count low)."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        run_sequence(implementation, cfg, rng, steps=5, random_start=bool(rng.random() < 0.5))

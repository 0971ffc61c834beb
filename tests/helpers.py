"""Shared helpers of the core test suite: configs, random states and selections,
cached jitted calls, zero-tolerance comparisons with the oracle, invariants."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import ml_dtypes
import numpy as np

import hisparse_jax as hs

import oracle

# --------------------------------------------------------------------------- implementations


def gpu_attention_may_differ(family: str) -> bool:
    """True on a GPU for the families whose attention is XLA's (NSA, Quest): XLA may compile the
    dense read of the store and the gather of every record (operands of other shapes and
    producers) to GEMM kernels that sum in other orders. On an H200 their tiny setups differ by
    1-3 ulp from the first decode step, with Triton GEMMs and with cuBLAS alike, so their
    dense == every-record checks run on CPU only (docs/testing.md). DSA decodes with its own
    batch-invariant attention kernel on CUDA; HiSparse == full-KV needs nothing (both gather)."""
    return family != "dsa" and jax.default_backend() == "gpu"


def examples(n: int) -> int:
    """Hypothesis example counts, scaled by HISPARSE_TEST_SCALE (default 1) for
    longer soak runs: HISPARSE_TEST_SCALE=10 pytest tests."""
    return max(1, int(n * float(os.environ.get("HISPARSE_TEST_SCALE", "1"))))


def implementations() -> tuple[str, ...]:
    """The implementations that run on the default backend: always the JAX
    reference, and the FFI handler (C++ on CPU, CUDA on GPU) when registered."""
    return ("reference", "ffi") if hs.has_ffi() else ("reference",)


IMPLEMENTATIONS = implementations()

# Every record dtype the cache supports; fp8 records travel as uint8 bytes.
RECORD_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "uint8_fp8_bytes": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
}


def config(L=2, streams=(2,), R=12, B=4, k=3, width=None, page_size=1, dtype=np.float32):
    """A CacheConfig with keyword names that read well in tests; width defaults
    to the smallest one whose record is 8 bytes."""
    dtype = np.dtype(dtype)
    if width is None:
        width = max(1, 8 // (page_size * dtype.itemsize))
    return hs.CacheConfig(
        num_layers=L,
        stream_shape=streams,
        pool_records=R,
        hot_slots=B,
        top_k=k,
        record_width=width,
        page_size=page_size,
        dtype=dtype,
    )


# A small catalog of shapes the sequence tests share, so each one compiles once
# per implementation. Together they cover B == k, B >> k, several stream dims,
# page_size > 1, and every record dtype.
CATALOG = {
    "B_eq_k": config(L=1, streams=(1,), R=8, B=4, k=4),
    "f32_3streams": config(L=2, streams=(3,), R=24, B=6, k=4),
    "bf16_2x3": config(L=3, streams=(2, 3), R=16, B=5, k=3, dtype=ml_dtypes.bfloat16),
    "fp8bytes_B_gg_k": config(L=2, streams=(2,), R=12, B=8, k=3, width=8, dtype=np.uint8),
    "f16_page2": config(L=2, streams=(2,), R=10, B=4, k=3, width=4, page_size=2, dtype=np.float16),
    "int8_k7": config(L=1, streams=(4,), R=20, B=7, k=7, width=8, dtype=np.int8),
    "f32_2x2_page4": config(L=2, streams=(2, 2), R=32, B=12, k=8, width=2, page_size=4),
    "e4m3_page2": config(
        L=2, streams=(3,), R=9, B=5, k=2, width=8, page_size=2, dtype=ml_dtypes.float8_e4m3fn
    ),
}


# --------------------------------------------------------------------------- arrays


def random_records(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random raw bytes viewed as `dtype`: NaN payloads, infs, subnormals and
    negative zeros included, so any copy that is not bit-exact shows up."""
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=(*shape[:-1], shape[-1] * dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype)


def finite_records(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random finite values of `dtype`. For records that go through XLA ops in
    the test's own plumbing (scan xs): XLA:CPU computes bf16 slices in f32 and
    quiets NaN payloads there, which is not what is under test."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def to_pinned_host(x: np.ndarray) -> jax.Array:
    return jax.device_put(x, hs.pinned_host_sharding())


def to_device(x) -> jax.Array:
    return jax.device_put(x, jax.devices()[0])


def read_pinned(x: jax.Array) -> np.ndarray:
    """The contents of a pinned_host array, read through a device copy: on GPU,
    np.asarray(x) keeps a zero-copy view cached on x, and XLA then refuses to
    donate x ("Donation requested for buffer with external reference")."""
    return np.asarray(jax.device_get(jax.device_put(x, x.sharding.with_memory_kind("device"))))


@dataclasses.dataclass
class State:
    """A cache state as NumPy arrays: hot [L,*S,B,*rec], slot_record and lru [L,*S,B]."""

    hot: np.ndarray
    slot_record: np.ndarray
    lru: np.ndarray

    def to_cache(self) -> hs.HotCache:
        return hs.HotCache(
            hot=to_device(self.hot),
            slot_record=to_device(self.slot_record),
            lru=to_device(self.lru),
        )

    @classmethod
    def of(cls, cache: hs.HotCache) -> "State":
        return cls(*(np.asarray(jax.device_get(x)) for x in (cache.hot, cache.slot_record, cache.lru)))

    @classmethod
    def of_oracle(cls, out: oracle.Resolved) -> "State":
        return cls(out.hot, out.slot_record, out.lru)


def empty_state(cfg: hs.CacheConfig) -> State:
    """The initial state of docs/contract.md (hot zeroed, like init_hot_cache)."""
    return State(
        hot=np.zeros(cfg.hot_shape, cfg.dtype),
        slot_record=np.full(cfg.slot_shape, -1, np.int32),
        lru=np.broadcast_to(np.arange(cfg.hot_slots, dtype=np.int32), cfg.slot_shape).copy(),
    )


def random_state(cfg: hs.CacheConfig, rng: np.random.Generator, pool: np.ndarray) -> State:
    """A reachable-looking state: every stream holds a random number of distinct
    ids in random slots with consistent hot bytes; empty slots hold garbage; lru
    is a random permutation."""
    L, S, B, R = cfg.num_layers, cfg.num_streams, cfg.hot_slots, cfg.pool_records
    hot = random_records(rng, (L, S, B, *cfg.record_shape), cfg.dtype)
    slot_record = np.full((L, S, B), -1, np.int32)
    lru = np.empty((L, S, B), np.int32)
    flat_pool = pool.reshape(L, S, R, *cfg.record_shape)
    for l in range(L):
        for s in range(S):
            held = rng.integers(0, min(B, R) + 1)
            slots = rng.choice(B, size=held, replace=False)
            records = rng.choice(R, size=held, replace=False)
            slot_record[l, s, slots] = records
            hot[l, s, slots] = flat_pool[l, s, records]
            lru[l, s] = rng.permutation(B)
    shape = (L, *cfg.stream_shape)
    return State(
        hot=hot.reshape(cfg.hot_shape),
        slot_record=slot_record.reshape(*shape, B),
        lru=lru.reshape(*shape, B),
    )


# --------------------------------------------------------------------------- selections


@dataclasses.dataclass(frozen=True)
class Mix:
    """Relative weights of what fills each selection position."""

    padding: float = 1.0  # -1
    recent: float = 4.0  # an id selected in one of the last few calls (hits)
    resident: float = 2.0  # an id some slot holds now (hits, old ones included)
    fresh: float = 3.0  # any id in [0, min(sealed, R)) (mostly misses)
    duplicate: float = 1.0  # an id already placed earlier in this selection
    invalid: float = 0.5  # >= sealed, >= R, or negative other than -1

    def probabilities(self) -> np.ndarray:
        w = np.array(dataclasses.astuple(self), float)
        return w / w.sum()


def invalid_id(rng: np.random.Generator, sealed: int, R: int) -> int:
    choice = rng.integers(0, 4)
    if choice == 0:
        return int(rng.integers(-(2**31), -1))  # negative other than -1
    if choice == 1:
        return int(rng.integers(max(sealed, 0), max(sealed, 0) + 3))  # not sealed yet (maybe < R)
    if choice == 2:
        return int(rng.integers(R, R + 4))  # past the pool
    return int(rng.choice([-2, 2**31 - 1, R]))


def draw_selection(rng, cfg, slot_record, recent, sealed, mix: Mix, layer: int) -> np.ndarray:
    """[*S, k] int32 selection with controlled locality.

    Args:
      slot_record: [L, *S, B] current state (resident ids).
      recent: per flat stream, ids selected in the last few calls.
      sealed: [*S] sealed records.
    """
    S, k, R = cfg.num_streams, cfg.top_k, cfg.pool_records
    flat_sealed = np.asarray(sealed).reshape(S)
    rec = np.asarray(slot_record).reshape(cfg.num_layers, S, -1)
    kinds = rng.choice(6, size=(S, k), p=mix.probabilities())
    picks = rng.random((S, k))  # uniform draws turned into an index of whatever list applies
    sel = np.full((S, k), -1, np.int32)
    for s in range(S):
        limit = max(0, min(int(flat_sealed[s]), R))
        resident = rec[min(max(layer, 0), cfg.num_layers - 1), s]
        resident = resident[resident >= 0]
        for j in range(k):
            kind, u = kinds[s, j], picks[s, j]
            if kind == 1 and recent[s]:
                sel[s, j] = recent[s][int(u * len(recent[s]))]
            elif kind == 2 and len(resident):
                sel[s, j] = resident[int(u * len(resident))]
            elif kind == 3 and limit > 0:
                sel[s, j] = int(u * limit)
            elif kind == 4 and j > 0:
                sel[s, j] = sel[s, int(u * j)]
            elif kind == 5:
                sel[s, j] = invalid_id(rng, int(flat_sealed[s]), R)
            # else: padding
    return sel.reshape(*cfg.stream_shape, k)


def next_sealed(rng, cfg, sealed: np.ndarray) -> np.ndarray:
    """Decode-like growth of the sealed count, with occasional resets and
    out-of-range values (<= 0, > R)."""
    roll = rng.random()
    if roll < 0.05:
        return rng.integers(-3, 1, size=sealed.shape).astype(np.int32)
    if roll < 0.10:
        return rng.integers(cfg.pool_records, cfg.pool_records + 5, size=sealed.shape).astype(np.int32)
    return (sealed + rng.integers(0, 3, size=sealed.shape)).astype(np.int32)


# --------------------------------------------------------------------------- jitted calls


@functools.cache
def jitted_resolve(implementation: str, fetch: bool = True, donate: bool = False, launch: str = "auto"):
    """resolve(cache, pool, selection, sealed, layer) jitted once per option set;
    jax caches the executable per shape, so sequences of one shape compile once."""

    def call(cache, pool, selection, sealed, layer):
        return hs.resolve(
            cache, pool, selection, sealed, layer, implementation=implementation, fetch=fetch, launch=launch
        )

    return jax.jit(call, donate_argnums=(0,) if donate else ())


@functools.cache
def jitted_write(implementation: str):
    def call(pool, records, start, count):
        return hs.write_records(pool, records, start, count, implementation=implementation)

    return jax.jit(call, donate_argnums=0, out_shardings=hs.pinned_host_sharding())


# --------------------------------------------------------------------------- comparisons

INT_FIELDS = ("slots", "miss_records", "miss_slots", "misses", "invalid", "malformed")


def assert_bytes_equal(got, want, lead: int, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = oracle.as_bytes(got, lead), oracle.as_bytes(want, lead)
    if not np.array_equal(g, w):
        bad = np.argwhere((g != w).any(axis=-1))
        raise AssertionError(
            f"{what}: bytes differ at record indices {bad[:8].tolist()} ({len(bad)} records)"
        )


def fetch_outputs(result: hs.ResolveResult, cache: hs.HotCache) -> tuple[dict, State]:
    """One device_get for everything a call returned."""
    result, cache = jax.device_get((result, cache))
    ints = {name: np.asarray(getattr(result, name)) for name in INT_FIELDS}
    return ints, State(np.asarray(cache.hot), np.asarray(cache.slot_record), np.asarray(cache.lru))


def assert_array_identical(got, want, what: str) -> None:
    """Same dtype, same shape, same values (the fast path of np.testing's strict check)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        np.testing.assert_array_equal(got, want, err_msg=what, strict=True)


def check_inside_lax_scan(op, layers, assert_close, alone=None) -> None:
    """Calls `op` once per layer inside one jitted lax.scan over the layers' stacked
    inputs (an input that is None in the layers stays None), as a model's layer loop
    calls a kernel; each layer's output must pass `assert_close(got, *inputs)` and,
    given `alone` (the same op called outside any scan), match its bits: the
    kernel's bits do not depend on where it is called from."""
    stacked = [None if x is None else np.stack([layer[i] for layer in layers]) for i, x in enumerate(layers[0])]

    @jax.jit
    def run(*xs):
        def step(carry, x):
            return carry, op(*x)

        return jax.lax.scan(step, 0, xs)[1]

    out = np.asarray(run(*stacked))
    for layer, got in zip(layers, out):
        assert_close(got, *layer)
        if alone is not None:
            np.testing.assert_array_equal(got.view(np.uint32), np.asarray(alone(*layer)).view(np.uint32))


def assert_matches_oracle(
    result: hs.ResolveResult, cache: hs.HotCache, want: oracle.Resolved, where=""
) -> State:
    """Zero tolerance: every integer output, the new metadata and every hot byte.
    Returns the implementation's new state as NumPy arrays."""
    ints, got = fetch_outputs(result, cache)
    for name in INT_FIELDS:
        assert_array_identical(ints[name], getattr(want, name), f"{where} {name}")
    assert_array_identical(got.slot_record, want.slot_record, f"{where} slot_record")
    assert_array_identical(got.lru, want.lru, f"{where} lru")
    assert_bytes_equal(got.hot, want.hot, want.slot_record.ndim, f"{where} hot")
    return got


def run_oracle(state: State, pool: np.ndarray, selection, sealed, layer, fetch=True) -> oracle.Resolved:
    return oracle.resolve(
        state.hot, state.slot_record, state.lru, pool, selection, sealed, layer, fetch=fetch
    )


# --------------------------------------------------------------------------- invariants


def check_invariants(
    before: State,
    after: State,
    pool: np.ndarray,
    selection,
    sealed,
    layer,
    slots,
    *,
    hot_consistent: bool = True,
) -> None:
    """The properties every call keeps, checked on an implementation's own output.

    hot_consistent: the state started with hot[slot] == pool[slot_record[slot]]
      for every filled slot and every call fetched, so it must still hold.
    """
    L = before.slot_record.shape[0]
    streams = np.asarray(selection).shape[:-1]
    S, B = int(np.prod(streams, dtype=np.int64)), before.slot_record.shape[-1]
    R = pool.shape[1 + len(streams)]
    rec0 = before.slot_record.reshape(L, S, B)
    rec1 = after.slot_record.reshape(L, S, B)
    lru1 = after.lru.reshape(L, S, B)
    sel = np.asarray(selection).reshape(S, -1)
    slots = np.asarray(slots).reshape(S, -1)
    limit = np.clip(np.minimum(np.asarray(sealed).reshape(S), R), 0, None)
    layer_ok = 0 <= layer < L

    # slot_record holds distinct ids: sorted, no two equal ids >= 0 side by side.
    held = np.sort(rec1, axis=-1)
    repeats = (held[..., 1:] == held[..., :-1]) & (held[..., 1:] >= 0)
    assert (
        not repeats.any()
    ), f"slot_record repeats an id at [layer, stream] {np.argwhere(repeats.any(-1)).tolist()}"
    bad_lru = (np.sort(lru1, axis=-1) != np.arange(B)).any(-1)
    assert not bad_lru.any(), f"lru is not a permutation at [layer, stream] {np.argwhere(bad_lru).tolist()}"
    others = np.arange(L) != layer
    assert np.array_equal(rec1[others], rec0[others]), f"a call on layer {layer} changed another layer"
    assert np.array_equal(
        lru1[others], before.lru.reshape(L, S, B)[others]
    ), f"a call on layer {layer} moved another layer's lru"

    if hot_consistent:
        filled = rec1 >= 0
        hot = oracle.as_bytes(after.hot, after.slot_record.ndim).reshape(L, S, B, -1)
        pb = oracle.as_bytes(pool, after.slot_record.ndim).reshape(L, S, R, -1)
        l, s, b = np.nonzero(filled)
        stale = (hot[l, s, b] != pb[l, s, rec1[l, s, b]]).any(-1)
        assert (
            not stale.any()
        ), f"hot != host_pool[slot_record] at [layer, stream, slot] {np.stack([l, s, b], 1)[stale][:8].tolist()}"

    valid = layer_ok & (sel >= 0) & (sel < limit[:, None])
    assert (
        slots[~valid] == -1
    ).all(), f"padding/invalid ids got a slot: {np.argwhere(~valid & (slots != -1)).tolist()}"
    if not layer_ok:
        return
    s_idx, j_idx = np.nonzero(valid)
    got_slot = slots[s_idx, j_idx]
    assert ((got_slot >= 0) & (got_slot < B)).all(), f"slot out of [0, B): {got_slot.tolist()}"
    holds = rec1[layer, s_idx, got_slot] == sel[s_idx, j_idx]
    assert (
        holds.all()
    ), f"slots[j] does not hold selection[j] at [stream, j] {np.stack([s_idx, j_idx], 1)[~holds].tolist()}"
    # A hit (resident before the call) keeps its slot: never evicted by its own call.
    old = rec0[layer, s_idx] == sel[s_idx, j_idx][:, None]  # [n, B]
    was_hit = old.any(-1)
    moved = was_hit & (old.argmax(-1) != got_slot)
    assert not moved.any(), f"hits moved at [stream, j] {np.stack([s_idx, j_idx], 1)[moved].tolist()}"


# --------------------------------------------------------------------------- call sequences


def run_sequence(
    implementation: str,
    cfg: hs.CacheConfig,
    rng: np.random.Generator,
    *,
    steps: int,
    mix: Mix = Mix(),
    fetch: bool = True,
    random_start: bool = False,
    out_of_range_layers: float = 0.05,
    launch: str = "auto",
) -> int:
    """`steps` calls on one cache, the implementation's own state carried from
    call to call (donated), each call checked against the oracle and the
    invariants. Returns the number of misses seen (to check the mix did something)."""
    pool = random_records(rng, cfg.pool_shape, cfg.dtype)
    state = random_state(cfg, rng, pool) if random_start else empty_state(cfg)
    call = jitted_resolve(implementation, fetch, donate=True, launch=launch)
    cache, host_pool = state.to_cache(), to_pinned_host(pool)
    sealed = rng.integers(0, cfg.pool_records + 1, size=cfg.stream_shape).astype(np.int32)
    recent = [[] for _ in range(cfg.num_streams)]
    total_misses = 0
    for step in range(steps):
        if rng.random() < out_of_range_layers:
            layer = int(rng.choice([-1, cfg.num_layers, 2**31 - 1]))
        else:
            layer = int(rng.integers(0, cfg.num_layers))
        selection = draw_selection(rng, cfg, state.slot_record, recent, sealed, mix, layer)
        result, cache = call(cache, host_pool, selection, sealed, np.int32(layer))
        want = run_oracle(state, pool, selection, sealed, layer, fetch=fetch)
        where = f"{implementation} step {step} layer {layer} selection {selection.tolist()} sealed {sealed.tolist()}"
        new_state = assert_matches_oracle(result, cache, want, where=where)
        check_invariants(state, new_state, pool, selection, sealed, layer, result.slots, hot_consistent=fetch)
        state = new_state
        total_misses += int(want.misses.sum())
        for s, row in enumerate(selection.reshape(cfg.num_streams, -1)):
            recent[s] = (recent[s] + [int(x) for x in row if x >= 0])[-3 * cfg.top_k :]
        sealed = next_sealed(rng, cfg, sealed)
    return total_misses


def load_script(name: str):
    """benchmarks/NAME.py loaded as a module (the scripts are not a package), for tests that call
    its functions and main() directly."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""The prefetch (hisparse_jax.prefetch, ffi/prefetch.h): RESOLVE with its copy off the compute
stream gives RESOLVE's bits, and its program keeps the pool in place.

- resolve_prefetch + join_prefetch == resolve, zero tolerance, over sequences of random
  selections (hits, misses, duplicates, padding, invalid ids) and layers, in every
  implementation (the C++ handler on CPU, CUDA on GPU, the JAX reference), fetch on and off;
- on a GPU, with a long computation between the resolves and the joins and enough misses that
  the copies take a while: the joins wait for them;
- the compiled program: one resolve_prefetch and one join per layer, the pool an S(5) parameter
  that reaches them uncopied, no copy of the hot buffer;
- bad arguments are refused with the argument's name.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from helpers import IMPLEMENTATIONS, Mix, draw_selection, random_state, to_pinned_host
from test_compiled_program import CFG, Hlo, assert_pool_passed_without_copy

import hisparse_jax as hs
from hisparse_jax import targets

LAYERS = 3


def _programs(implementation: str, fetch: bool):
    """(plain, prefetch): resolve every layer in turn / resolve every layer with prefetch, then
    join each after a little computation that stands for the layers in between."""

    def plain(cache, pool, selections, sealed, x):
        results = []
        for layer in range(LAYERS):
            result, cache = hs.resolve(cache, pool, selections[layer], sealed, layer,
                                       implementation=implementation, fetch=fetch)
            results.append(result)
        return results, cache

    def prefetch(cache, pool, selections, sealed, x):
        results, pending = [], []
        for layer in range(LAYERS):
            result, cache, p = hs.resolve_prefetch(cache, pool, selections[layer], sealed, layer, slot=layer,
                                                   implementation=implementation, fetch=fetch)
            results.append(result)
            pending.append(p)
        for layer in range(LAYERS):
            x = jnp.tanh(x @ x)  # the compute the copy overlaps
            cache, misses = hs.join_prefetch(cache, pending[layer], x)
            results[layer] = dataclasses.replace(results[layer], misses=misses)
        return results, cache

    return jax.jit(plain, donate_argnums=0), jax.jit(prefetch, donate_argnums=0)


def _assert_same(a, b, what):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        x, y = np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y))
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}{jax.tree_util.keystr(path)}"
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"{what}{jax.tree_util.keystr(path)} differs"


@pytest.mark.parametrize("fetch", [True, False], ids=["fetch", "no-fetch"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_prefetch_gives_resolves_bits(implementation, fetch):
    cfg = hs.CacheConfig(num_layers=LAYERS, stream_shape=(2, 2), pool_records=24, hot_slots=6, top_k=4,
                         record_width=6, dtype=np.float32)
    rng = np.random.default_rng(7)
    pool_np = rng.standard_normal(cfg.pool_shape).astype(np.float32)
    pool = to_pinned_host(pool_np)
    state = random_state(cfg, rng, pool_np)
    plain, prefetch = _programs(implementation, fetch)
    a, b = state.to_cache(), state.to_cache()
    sealed_np = np.full(cfg.stream_shape, 20, np.int32)
    recent = [[] for _ in range(cfg.num_streams)]
    x = jnp.eye(8, dtype=jnp.float32) * 0.5
    for step in range(12):
        slot_record = np.asarray(jax.device_get(a.slot_record))
        selections = np.stack([draw_selection(rng, cfg, slot_record, recent, sealed_np, Mix(), layer)
                               for layer in range(LAYERS)])
        sealed = jnp.asarray(sealed_np)
        want, a = plain(a, pool, jnp.asarray(selections), sealed, x)
        got, b = prefetch(b, pool, jnp.asarray(selections), sealed, x)
        _assert_same(got, want, f"step {step} results")
        _assert_same(b, a, f"step {step} cache")
        sealed_np = np.minimum(sealed_np + rng.integers(0, 2, sealed_np.shape), cfg.pool_records).astype(np.int32)
        recent = [list(selections[-1].reshape(cfg.num_streams, -1)[s]) for s in range(cfg.num_streams)]


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the copy runs on a stream of its own on CUDA only")
def test_joins_wait_for_long_copies_on_gpu():
    """Deployment-like shapes (1152 B records, k = 2048, a cold cache: every id misses) and a long
    computation before each join: a join that did not wait would let the reads see stale slots."""
    L, S, k, B, R = 4, 8, 2048, 4096, 8192
    cfg = hs.CacheConfig(num_layers=L, stream_shape=(S,), pool_records=R, hot_slots=B, top_k=k, record_width=288,
                         dtype=np.float32)
    rng = np.random.default_rng(3)
    pool = to_pinned_host(rng.standard_normal(cfg.pool_shape).astype(np.float32))
    sealed = jnp.full((S,), R, jnp.int32)

    def body(cache, pool, selections, x, prefetch):
        pending, rows = [], []
        for layer in range(L):
            if prefetch:
                result, cache, p = hs.resolve_prefetch(cache, pool, selections[layer], sealed, layer, slot=layer)
            else:
                result, cache = hs.resolve(cache, pool, selections[layer], sealed, layer)
                p = None
            pending.append((result, p))
        for layer, (result, p) in enumerate(pending):
            for _ in range(8):
                x = jnp.tanh(x @ x)
            if p is not None:
                cache, _ = hs.join_prefetch(cache, p, x)
            rows.append(jnp.take_along_axis(cache.hot[layer], jnp.maximum(result.slots, 0)[..., None, None], axis=1))
        return rows, x, cache

    plain = jax.jit(lambda c, p, s, x: body(c, p, s, x, False), donate_argnums=0)
    prefetch = jax.jit(lambda c, p, s, x: body(c, p, s, x, True), donate_argnums=0)
    a, b = hs.init_hot_cache(cfg), hs.init_hot_cache(cfg)
    x = jnp.asarray(rng.standard_normal((2048, 2048)) * 0.02, jnp.float32)
    for step in range(3):
        selections = jnp.asarray(np.stack([np.stack([rng.choice(R, k, replace=False) for _ in range(S)])
                                           for _ in range(L)]).astype(np.int32))
        want = plain(a, pool, selections, x)
        got = prefetch(b, pool, selections, x)
        a, b = want[2], got[2]
        _assert_same(got, want, f"step {step}")


def test_prefetch_program_keeps_the_pool_and_hot_buffer_in_place():
    if "ffi" not in IMPLEMENTATIONS:
        pytest.skip("no FFI handler on this backend")
    cfg = CFG  # its pool shape is unique among the operands
    assert cfg.num_layers == LAYERS
    pool = to_pinned_host(np.zeros(cfg.pool_shape, np.float32))
    _, prefetch = _programs("ffi", True)
    selections = jnp.zeros((LAYERS, *cfg.stream_shape, cfg.top_k), jnp.int32)
    compiled = prefetch.lower(hs.init_hot_cache(cfg), pool, selections, jnp.full(cfg.stream_shape, 16, jnp.int32),
                              jnp.eye(8, dtype=jnp.float32)).compile()
    hlo = Hlo(compiled.as_text())
    assert hlo.executions(targets.RESOLVE_PREFETCH) == LAYERS
    assert hlo.executions(targets.PREFETCH_JOIN) == LAYERS
    assert hlo.executions(targets.RESOLVE) == 0
    assert_pool_passed_without_copy(hlo, parameter=3)  # after hot, slot_record, lru
    hot = f"f32[{','.join(map(str, cfg.hot_shape))}]"
    copies = [line for line in compiled.as_text().splitlines()
              if f"= {hot}" in line and any(f" {op}(" in line for op in ("copy", "fusion", "slice", "dynamic-slice"))]
    assert not copies, "the hot buffer is copied between a resolve and its join:\n" + "\n".join(copies)


def test_bad_arguments_are_refused():
    cfg = hs.CacheConfig(num_layers=1, stream_shape=(1,), pool_records=8, hot_slots=4, top_k=2, record_width=2,
                         dtype=np.float32)
    cache, pool = hs.init_hot_cache(cfg), to_pinned_host(np.zeros(cfg.pool_shape, np.float32))
    sel, sealed = jnp.zeros((1, 2), jnp.int32), jnp.full((1,), 8, jnp.int32)
    for slot in (-1, True, 1.0, None, 2**31, 2**63):
        with pytest.raises(ValueError, match=r"slot must be a Python int in \[0, 2\^31\)"):
            hs.resolve_prefetch(cache, pool, sel, sealed, 0, slot=slot)
    with pytest.raises(TypeError, match="pending must be resolve_prefetch's PendingFetch"):
        hs.join_prefetch(cache, object(), jnp.ones(1))
    if "ffi" in IMPLEMENTATIONS:
        _, cache, pending = hs.resolve_prefetch(cache, pool, sel, sealed, 0, slot=0, implementation="ffi")
        with pytest.raises(ValueError, match="after must hold at least one array"):
            hs.join_prefetch(cache, pending, ())


def test_a_join_refuses_a_pending_copy_of_another_cache():
    """A PendingFetch joined into a cache whose hot buffer is not the one its copy writes: refused
    by shape and dtype on every platform, and by the buffer itself in the CUDA join, which so also
    refuses a join outside the resolve's jitted program (each call would get its own copy)."""
    def config(records_width):
        return hs.CacheConfig(num_layers=2, stream_shape=(2,), pool_records=16, hot_slots=4, top_k=2,
                              record_width=records_width, dtype=np.float32)
    cfg = config(4)
    host = np.arange(np.prod(cfg.pool_shape), dtype=np.float32).reshape(cfg.pool_shape)
    pool = to_pinned_host(host)
    sel, sealed = jnp.asarray([[1, 3], [2, 5]], jnp.int32), jnp.full((2,), 16, jnp.int32)

    def program(implementation, into_other):
        def run(mine, other, pool):
            result, mine, pending = hs.resolve_prefetch(mine, pool, sel, sealed, 1, slot=7,
                                                        implementation=implementation)
            joined, _ = hs.join_prefetch(other if into_other else mine, pending, jnp.ones(1))
            # Every donated cache comes back whole, so each donation has an output to take over
            # (a dropped slot map or LRU would be an unusable donation, which JAX warns about).
            return (result.slots, joined) + ((mine,) if into_other else ())
        return jax.jit(run, donate_argnums=(0, 1) if into_other else (0,))

    for implementation in IMPLEMENTATIONS:
        _, _, pending = hs.resolve_prefetch(hs.init_hot_cache(cfg), pool, sel, sealed, 1, slot=7,
                                            implementation=implementation)
        with pytest.raises(ValueError, match="join a PendingFetch into the cache its resolve_prefetch returned"):
            hs.join_prefetch(hs.init_hot_cache(config(2)), pending, jnp.ones(1))
        slots, joined = program(implementation, False)(hs.init_hot_cache(cfg), hs.init_hot_cache(cfg), pool)
        slots, hot = np.asarray(slots), np.asarray(joined.hot)
        for stream in range(2):  # its own cache, in one program: the records are there
            assert np.array_equal(hot[1, stream, slots[stream]], host[1, stream, np.asarray(sel)[stream]])
        if implementation == "ffi" and jax.default_backend() == "gpu":
            with pytest.raises(Exception, match="writes another hot buffer than this join's"):
                jax.block_until_ready(program("ffi", True)(hs.init_hot_cache(cfg), hs.init_hot_cache(cfg), pool))
            _, mine, pending = hs.resolve_prefetch(hs.init_hot_cache(cfg), pool, sel, sealed, 1, slot=7,
                                                   implementation="ffi")
            with pytest.raises(Exception, match="in the same jitted program"):  # eager: a copy of the buffer
                jax.block_until_ready(hs.join_prefetch(mine, pending, jnp.ones(1)))


def _two_layer_setup():
    cfg = hs.CacheConfig(num_layers=2, stream_shape=(2,), pool_records=16, hot_slots=4, top_k=2, record_width=4,
                         dtype=np.float32)
    pool = to_pinned_host(np.arange(np.prod(cfg.pool_shape), dtype=np.float32).reshape(cfg.pool_shape))
    return cfg, pool, jnp.full((2,), 16, jnp.int32)


def _selection(*ids):
    return jnp.asarray([ids, ids], jnp.int32)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_join_refuses_another_cache_of_the_same_shape_or_a_layer_resolved_again(implementation):
    """Eager values are concrete, so the join checks that this cache's slot map holds the pending
    copy's records where the copy wrote them: another cache of the same shape and dtype (which
    the static check cannot tell apart), or this one after the layer was resolved again, is
    refused; its own cache, after other layers were resolved, is not."""
    cfg, pool, sealed = _two_layer_setup()
    _, mine, pending = hs.resolve_prefetch(hs.init_hot_cache(cfg), pool, _selection(1, 3), sealed, 1, slot=1,
                                           implementation=implementation)
    _, mine = hs.resolve(mine, pool, _selection(2, 9), sealed, 0, implementation="reference")  # another layer
    if not pending.in_flight:  # an in-flight copy is joined in its resolve's program only (the CUDA join)
        _, misses = hs.join_prefetch(mine, pending, jnp.ones(1), layer=1)
        assert np.array_equal(np.asarray(misses), [2, 2])
    with pytest.raises(ValueError, match="belongs to another cache, or the layer was resolved again"):
        hs.join_prefetch(hs.init_hot_cache(cfg), pending, jnp.ones(1))
    again = mine
    for ids in ((5, 7), (9, 11)):  # four new records through four slots: 1 and 3 are evicted
        _, again = hs.resolve(again, pool, _selection(*ids), sealed, 1, implementation="reference")
    with pytest.raises(ValueError, match="belongs to another cache, or the layer was resolved again"):
        hs.join_prefetch(again, pending, jnp.ones(1))


def test_a_join_for_another_layer_is_refused():
    cfg, pool, sealed = _two_layer_setup()
    _, cache, pending = hs.resolve_prefetch(hs.init_hot_cache(cfg), pool, _selection(1, 3), sealed, 1, slot=1,
                                            implementation="reference")
    assert pending.layer_index == 1
    with pytest.raises(ValueError, match="the pending copy is layer 1's, joined for layer 0"):
        hs.join_prefetch(cache, pending, jnp.ones(1), layer=0)

    def program(cache, pool):  # traced: the layer is still a Python int, so the check is static
        _, cache, pending = hs.resolve_prefetch(cache, pool, _selection(1, 3), sealed, 1, slot=1,
                                                implementation="reference")
        return hs.join_prefetch(cache, pending, jnp.ones(1), layer=0)[0].hot
    with pytest.raises(ValueError, match="the pending copy is layer 1's, joined for layer 0"):
        jax.jit(program)(hs.init_hot_cache(cfg), pool)


def test_checked_joins_check_the_slot_map_inside_a_program():
    """Traced values are unknown at trace time: with checked=True the join checks the slot map in
    the program (a checkify check); its own cache passes, another one fails."""
    cfg, pool, sealed = _two_layer_setup()

    def program(mine, other, pool, into_other):
        _, mine, pending = hs.resolve_prefetch(mine, pool, _selection(1, 3), sealed, 1, slot=1,
                                               implementation="reference")
        return hs.join_prefetch(other if into_other else mine, pending, jnp.ones(1), checked=True)[0].hot

    for into_other in (False, True):
        run = jax.jit(checkify.checkify(functools.partial(program, into_other=into_other)))
        err, _ = run(hs.init_hot_cache(cfg), hs.init_hot_cache(cfg), pool)
        assert (err.get() is not None) == into_other, err.get()

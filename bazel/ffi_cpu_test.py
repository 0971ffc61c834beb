"""Bazel's check of libhisparse_cpu.so: load it with ctypes, register its six CPU
handlers under target names of their own, and compare each against the pure-JAX
reference with zero tolerance: RESOLVE, the pool write, TOP-K, RESOLVE's prefetch
variant with its join, and the MoE routing.

The package imported here is the source tree (no compiled extension), so the
only handlers in play are the ones this file registers.

Usage: ffi_cpu_test.py PATH/TO/libhisparse_cpu.so
"""

from __future__ import annotations

import ctypes
import functools
import sys
import unittest

import jax
import jax.numpy as jnp
import numpy as np

import hisparse_jax as hj
from hisparse_jax.pool import pool_write_reference
from hisparse_jax.moe_route import route_experts_reference
from hisparse_jax.topk import select_topk_reference

RESOLVE = "bazel_hisparse_resolve"
POOL_WRITE = "bazel_hisparse_pool_write"
TOPK = "bazel_hisparse_topk"
RESOLVE_PREFETCH = "bazel_hisparse_resolve_prefetch"
PREFETCH_JOIN = "bazel_hisparse_prefetch_join"
MOE_ROUTE = "bazel_hisparse_moe_route"

# [L, *streams, R, page_size, width] = 32-byte records, 2 x 3 streams.
CONFIG = hj.CacheConfig(
    num_layers=2, stream_shape=(2, 3), pool_records=40, hot_slots=8, top_k=6,
    record_width=4, page_size=2,
)

_LIB = None  # keeps the handlers' library loaded for the life of the process


def register(path: str) -> None:
    global _LIB
    _LIB = ctypes.cdll.LoadLibrary(path)
    jax.ffi.register_ffi_target(
        RESOLVE, jax.ffi.pycapsule(_LIB.HisparseResolveCpu), platform="cpu"
    )
    jax.ffi.register_ffi_target(
        POOL_WRITE, jax.ffi.pycapsule(_LIB.HisparsePoolWriteCpu), platform="cpu"
    )
    for target, symbol in ((TOPK, _LIB.HisparseTopkCpu),
                           (RESOLVE_PREFETCH, _LIB.HisparseResolvePrefetchCpu),
                           (PREFETCH_JOIN, _LIB.HisparsePrefetchJoinCpu),
                           (MOE_ROUTE, _LIB.HisparseMoeRouteCpu)):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")


def _resolve_call(target, hot, slot_record, lru, host_pool, selection, sealed, layer, **attributes):
    per_pick = jax.ShapeDtypeStruct(selection.shape, jnp.int32)
    per_stream = jax.ShapeDtypeStruct(selection.shape[:-1], jnp.int32)
    call = jax.ffi.ffi_call(
        target,
        (per_pick, per_pick, per_pick, per_stream, per_stream, per_stream,
         jax.typeof(hot), jax.typeof(slot_record), jax.typeof(lru)),
        input_output_aliases={4: 6, 5: 7, 6: 8},
    )
    return call(host_pool, selection, sealed, layer, hot, slot_record, lru,
                fetch=True, launch=np.int32(0), stream_begin=0,
                stream_count=int(np.prod(selection.shape[:-1])), **attributes)


@jax.jit
def resolve_ffi(hot, slot_record, lru, host_pool, selection, sealed, layer):
    """Same operands and results as hisparse_jax.resolve_reference."""
    return _resolve_call(RESOLVE, hot, slot_record, lru, host_pool, selection, sealed, layer)


@jax.jit
def resolve_prefetch_ffi(hot, slot_record, lru, host_pool, selection, sealed, layer):
    """RESOLVE's prefetch variant (slot 3), then its join: on the CPU the copy happens in the
    resolve and the join passes hot and misses through; same results as resolve_reference."""
    out = _resolve_call(RESOLVE_PREFETCH, hot, slot_record, lru, host_pool, selection, sealed, layer,
                        prefetch_slot=np.int64(3))
    join = jax.ffi.ffi_call(PREFETCH_JOIN, (jax.typeof(out[6]), jax.typeof(out[3])),
                            input_output_aliases={0: 0, 1: 1})
    hot, misses = join(out[6], out[3], out[1], out[2], layer, out[0], prefetch_slot=np.int64(3))
    return (*out[:3], misses, *out[4:6], hot, *out[7:])


@functools.partial(jax.jit, static_argnames="k")
def topk_ffi(scores, sealed, *, k):
    words = 2 * 4 * ((scores.shape[-1] + 127) // 128)
    call = jax.ffi.ffi_call(TOPK, (jax.ShapeDtypeStruct((*scores.shape[:-1], k), jnp.int32),
                                   jax.ShapeDtypeStruct((*scores.shape[:-1], words), jnp.uint32)))
    return call(scores, sealed, k=np.int64(k))[0]


@functools.partial(jax.jit, static_argnames=("k", "experts", "scaling"))
def moe_route_ffi(scores, *, k, experts, scaling):
    T = scores.shape[0]
    call = jax.ffi.ffi_call(MOE_ROUTE, (jax.ShapeDtypeStruct((T, k), jnp.int32), jax.ShapeDtypeStruct((T, k), jnp.float32),
                                        jax.ShapeDtypeStruct((T * k,), jnp.int32), jax.ShapeDtypeStruct((T * k,), jnp.int32),
                                        jax.ShapeDtypeStruct((experts,), jnp.int32)))
    return call(scores, k=np.int64(k), experts=np.int64(experts), scaling=np.float32(scaling))


resolve_reference = jax.jit(hj.resolve_reference)

NAMES = ("slots", "miss_records", "miss_slots", "misses", "invalid", "malformed", "hot",
         "slot_record", "lru")


class FfiCpuTest(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(0)

    def host_pool(self):
        rows = self.rng.standard_normal(CONFIG.pool_shape).astype(np.float32)
        return jax.device_put(rows, hj.pinned_host_sharding())

    def test_resolve_sequence_matches_reference(self):
        pool = self.host_pool()
        cache = hj.init_hot_cache(CONFIG)
        ffi_state = ref_state = (cache.hot, cache.slot_record, cache.lru)
        S, k, R = CONFIG.stream_shape, CONFIG.top_k, CONFIG.pool_records
        # Layer L (out of range) must leave the state untouched.
        layers = [0, 1, 1, 0, CONFIG.num_layers, 1, 0, 1]
        for step, layer in enumerate(layers):
            # Ids in [-1, R + 4): padding, duplicates, ids past `sealed` and past R.
            selection = self.rng.integers(-1, R + 4, size=(*S, k), dtype=np.int32)
            selection[..., -1] = selection[..., 0]
            sealed = self.rng.integers(R // 2, R + 3, size=S, dtype=np.int32)
            args = (pool, jnp.asarray(selection), jnp.asarray(sealed), jnp.int32(layer))
            got = resolve_ffi(*ffi_state, *args)
            want = resolve_reference(*ref_state, *args)
            for name, g, w in zip(NAMES, got, want):
                np.testing.assert_array_equal(
                    np.asarray(g), np.asarray(w), err_msg=f"step {step} (layer {layer}): {name}"
                )
            ffi_state, ref_state = got[6:], want[6:]
        self.assertGreater(int(np.asarray(ffi_state[1]).max()), -1, "nothing was ever resident")

    def test_malformed_streams_match_reference(self):
        """Streams whose rows break the state's invariants resolve nothing, the same in
        the library and the reference; the others resolve as usual."""
        pool = self.host_pool()
        cache = hj.init_hot_cache(CONFIG)
        S, k, R = CONFIG.stream_shape, CONFIG.top_k, CONFIG.pool_records
        lru = np.array(cache.lru)
        slot_record = np.array(cache.slot_record)
        lru[1, 0, 0, 2] = 1 << 30          # layer 1, stream (0, 0): lru out of range
        lru[1, 0, 1, 3] = -1               # stream (0, 1): lru negative
        slot_record[1, 1, 0, :2] = 5       # stream (1, 0): record 5 in two slots
        slot_record[1, 1, 1, 0] = R        # stream (1, 1): record past the pool
        state = (cache.hot, jnp.asarray(slot_record), jnp.asarray(lru))
        selection = self.rng.integers(-1, R, size=(*S, k), dtype=np.int32)
        args = (pool, jnp.asarray(selection), jnp.full(S, R, jnp.int32), jnp.int32(1))
        got = resolve_ffi(*state, *args)
        want = resolve_reference(*state, *args)
        for name, g, w in zip(NAMES, got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
        np.testing.assert_array_equal(np.asarray(got[5]), [[1, 1, 0], [1, 1, 0]])
        # Malformed streams (the first two of each row): nothing resolved, rows untouched.
        self.assertTrue((np.asarray(got[0])[:, :2] == -1).all())
        np.testing.assert_array_equal(np.asarray(got[7])[:, :, :2], slot_record[:, :, :2])
        np.testing.assert_array_equal(np.asarray(got[8])[:, :, :2], lru[:, :, :2])

    def test_resolve_prefetch_and_join_match_reference(self):
        pool = self.host_pool()
        cache = hj.init_hot_cache(CONFIG)
        ffi_state = ref_state = (cache.hot, cache.slot_record, cache.lru)
        S, k, R = CONFIG.stream_shape, CONFIG.top_k, CONFIG.pool_records
        for step, layer in enumerate([1, 0, 1, 1]):
            selection = self.rng.integers(-1, R, size=(*S, k), dtype=np.int32)
            args = (pool, jnp.asarray(selection), jnp.full(S, R, jnp.int32), jnp.int32(layer))
            got = resolve_prefetch_ffi(*ffi_state, *args)
            want = resolve_reference(*ref_state, *args)
            for name, g, w in zip(NAMES, got, want):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"step {step}: {name}")
            ffi_state, ref_state = got[6:], want[6:]

    def test_topk_matches_reference(self):
        """Ties, -0.0 and +0.0, infinities, NaN and sealed counts below, inside and above R."""
        scores = self.rng.standard_normal((4, 3, 37)).astype(np.float32)
        scores[0, 0, :10] = 1.0
        scores[1, 1, :6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, 0.0]
        sealed = np.array([[37, 0, 12], [5, 40, 37], [-3, 37, 1], [36, 37, 37]], np.int32)
        for k in (1, 5, 37):
            got = topk_ffi(jnp.asarray(scores), jnp.asarray(sealed), k=k)
            want = select_topk_reference(jnp.asarray(scores), jnp.asarray(sealed), k)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"k = {k}")

    def test_moe_route_matches_reference(self):
        """Ties, -0.0 and +0.0, infinities and NaNs; more local experts than scores and fewer."""
        scores = self.rng.standard_normal((9, 24)).astype(np.float32)
        scores[0, :10] = 0.5
        scores[1, :6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, 0.0]
        for k, experts in ((1, 3), (8, 4), (24, 40)):
            got = moe_route_ffi(jnp.asarray(scores), k=k, experts=experts, scaling=2.5)
            want = route_experts_reference(jnp.asarray(scores), k, experts, 2.5)
            for name, g, w in zip(want._fields, got, want):
                np.testing.assert_array_equal(np.asarray(g).view(np.uint32), np.asarray(w).view(np.uint32),
                                              err_msg=f"k = {k}, E = {experts}: {name}")

    def test_pool_write_matches_reference(self):
        pool = self.host_pool()
        n = 5
        records = jnp.asarray(self.rng.standard_normal(
            (CONFIG.num_layers, *CONFIG.stream_shape, n, *CONFIG.record_shape)
        ).astype(np.float32))
        # The last stream's rows run past R: those must be dropped.
        start = np.array([[0, 7, 30], [12, 3, CONFIG.pool_records - 2]], np.int32)
        count = np.array([[5, 0, 5], [2, 5, 5]], np.int32)
        write = jax.ffi.ffi_call(POOL_WRITE, jax.typeof(pool), input_output_aliases={0: 0})
        got = jax.jit(write)(pool, records, jnp.asarray(start), jnp.asarray(count))
        want = pool_write_reference(pool, records, jnp.asarray(start), jnp.asarray(count))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    register(sys.argv.pop(1))
    unittest.main()

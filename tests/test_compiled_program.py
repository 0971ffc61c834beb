"""The compiled program, not only its values: one custom call per layer per
step inside the scans, the pool in host memory (S(5)) handed to the handlers
with no copy, donated state aliased and consumed, no recompilation; the FFI
target names (the ABI) and their registration."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hisparse_jax as hs
from hisparse_jax import targets
from hisparse_jax.hlo import Module as Hlo  # the optimized HLO module text, split into computations
from helpers import IMPLEMENTATIONS, config, empty_state, random_records, to_pinned_host

needs_ffi = pytest.mark.skipif("ffi" not in IMPLEMENTATIONS, reason="no FFI handler for this backend")

CFG = config(L=3, streams=(2,), R=16, B=5, k=4, width=2)  # pool f32[3,2,16,1,2], unique among operands
T = 7  # decode steps


POOL_SHAPE = f"f32[{','.join(map(str, CFG.pool_shape))}]"


def assert_pool_passed_without_copy(hlo: Hlo, parameter: int) -> None:
    params, _ = hlo.entry_layout()
    assert (
        params[parameter].startswith(POOL_SHAPE) and ":S(5)" in params[parameter]
    ), f"host pool parameter {parameter} is not in host memory space S(5): {params[parameter]}"
    # The pool only travels: parameter -> loop tuples -> custom calls (the pool
    # write returns it in place). Any other producer of its shape is a copy.
    producers, consumers = hlo.ops_producing(POOL_SHAPE), hlo.ops_consuming(POOL_SHAPE)
    assert "parameter" in producers and "custom-call" in consumers, "the pool was not found in the program"
    assert producers <= {
        "parameter",
        "get-tuple-element",
        "custom-call",
    }, f"the host pool is copied or moved: produced by {producers}"
    assert consumers <= {"tuple", "while", "custom-call"}, f"the host pool is read by XLA ops: {consumers}"
    assert (
        "copy-start" not in hlo.text and "copy-done" not in hlo.text
    ), "an async copy (host <-> device) was inserted"
    for placement in ("annotate_device_placement", "MoveToDevice", "MoveToHost"):
        assert placement not in hlo.text, f"{placement} left in the optimized program"


# --------------------------------------------------------------------------- the programs


def nested_resolve_program(traces: list, implementation: str = "ffi"):
    """Steps x layers of RESOLVE on the FFI handler, cache donated."""

    def decode(cache, host_pool, selections, sealed):
        traces.append(1)

        def step(cache, sel_t):
            def layer(cache, xs):
                index, sel = xs
                result, cache = hs.resolve(
                    cache, host_pool, sel, sealed, index, implementation=implementation
                )
                return cache, result.slots

            return lax.scan(layer, cache, (jnp.arange(CFG.num_layers, dtype=jnp.int32), sel_t))

        return lax.scan(step, cache, selections)

    return jax.jit(decode, donate_argnums=0)


def decode_loop_program(traces: list):
    """Each step: append one record per stream (pool write), then RESOLVE every layer; cache and pool donated."""

    def run(cache, host_pool, written, new_records, selections):
        traces.append(1)

        def step(carry, xs):
            cache, pool, written = carry
            rows, sel_t = xs
            ones = jnp.ones_like(written)
            pool = hs.write_records(pool, rows, written, ones, implementation="ffi")
            written = written + ones

            def layer(cache, ys):
                index, sel = ys
                result, cache = hs.resolve(cache, pool, sel, written, index, implementation="ffi")
                return cache, result.slots

            cache, slots = lax.scan(layer, cache, (jnp.arange(CFG.num_layers, dtype=jnp.int32), sel_t))
            return (cache, pool, written), slots

        (cache, host_pool, written), slots = lax.scan(
            step, (cache, host_pool, written), (new_records, selections)
        )
        return cache, host_pool, written, slots

    return jax.jit(run, donate_argnums=(0, 1), out_shardings=(None, hs.pinned_host_sharding(), None, None))


def resolve_inputs(rng):
    pool = to_pinned_host(random_records(rng, CFG.pool_shape, CFG.dtype))
    selections = rng.integers(-1, 16, size=(T, CFG.num_layers, *CFG.stream_shape, CFG.top_k)).astype(np.int32)
    return (
        empty_state(CFG).to_cache(),
        pool,
        jnp.asarray(selections),
        jnp.full(CFG.stream_shape, 16, jnp.int32),
    )


def decode_inputs(rng):
    cache, pool, selections, _ = resolve_inputs(rng)
    records = jnp.asarray(
        rng.standard_normal((T, CFG.num_layers, *CFG.stream_shape, 1, *CFG.record_shape)), jnp.float32
    )
    return cache, pool, jnp.zeros(CFG.stream_shape, jnp.int32), records, selections


@needs_ffi
def test_resolve_once_per_layer_per_step():
    fn = nested_resolve_program([])
    hlo = Hlo(fn.lower(*resolve_inputs(np.random.default_rng(0))).compile().as_text())
    assert hlo.text.count(f'custom_call_target="{targets.RESOLVE}"') == 1, "one call site, in the layer loop"
    assert hlo.loop_nest_of(targets.RESOLVE) == [T, CFG.num_layers]
    assert hlo.executions(targets.RESOLVE) == T * CFG.num_layers


@needs_ffi
def test_resolve_program_memory_and_aliasing():
    fn = nested_resolve_program([])
    hlo = Hlo(fn.lower(*resolve_inputs(np.random.default_rng(0))).compile().as_text())
    assert_pool_passed_without_copy(hlo, parameter=3)  # (hot, slot_record, lru, host_pool, ...)
    assert {0, 1, 2} <= hlo.aliased_parameters(), f"donated cache not aliased: {hlo.header[:300]}"


def test_copy_check_catches_xla_reads_of_the_pool():
    """Control: the reference reads the pool with XLA ops (a gather on a device
    copy); the check above must flag that program."""
    fn = nested_resolve_program([], implementation="reference")
    hlo = Hlo(fn.lower(*resolve_inputs(np.random.default_rng(0))).compile().as_text())
    with pytest.raises(AssertionError, match="pool"):
        assert_pool_passed_without_copy(hlo, parameter=3)


@needs_ffi
def test_decode_loop_program():
    """Pool write and RESOLVE in one program: each once per step / per layer, the
    donated pool stays S(5) in and out, every donated buffer aliased."""
    fn = decode_loop_program([])
    hlo = Hlo(fn.lower(*decode_inputs(np.random.default_rng(1))).compile().as_text())
    assert hlo.text.count(f'custom_call_target="{targets.POOL_WRITE}"') == 1
    assert hlo.loop_nest_of(targets.POOL_WRITE) == [T]
    assert hlo.loop_nest_of(targets.RESOLVE) == [T, CFG.num_layers]
    assert hlo.executions(targets.RESOLVE) == T * CFG.num_layers
    assert_pool_passed_without_copy(hlo, parameter=3)
    _, result = hlo.entry_layout()
    assert re.search(
        rf"{re.escape(POOL_SHAPE)}\{{[^}}]*:S\(5\)\}}", result
    ), f"pool result left host memory: {result}"
    assert {0, 1, 2, 3} <= hlo.aliased_parameters(), f"donated cache/pool not aliased: {hlo.header[:300]}"


@needs_ffi
@pytest.mark.parametrize("program", ["nested_resolve", "decode_loop"])
def test_second_call_does_not_recompile_and_donation_consumes(program):
    traces = []
    make, inputs = {
        "nested_resolve": (nested_resolve_program, resolve_inputs),
        "decode_loop": (decode_loop_program, decode_inputs),
    }[program]
    fn = make(traces)
    donated = 1 if program == "nested_resolve" else 2  # cache, then the pool
    for seed in range(2):
        args = inputs(np.random.default_rng(seed))
        out = jax.block_until_ready(fn(*args))
        for leaf in jax.tree.leaves(args[:donated]):
            assert leaf.is_deleted(), "a donated input is still alive after the call"
        assert not any(x.is_deleted() for x in jax.tree.leaves(args[donated:]))
    assert len(traces) == 1, f"traced {len(traces)} times"
    assert fn._cache_size() == 1
    if program == "decode_loop":
        assert out[1].sharding.memory_kind == "pinned_host"


@pytest.mark.gpu
def test_ffi_is_the_cuda_handler_on_gpu():
    """On the GPU backend "auto" picks the CUDA handler, and the compiled program runs it."""
    assert "cuda" in hs.ffi_platforms() and hs.has_ffi()
    assert IMPLEMENTATIONS == ("reference", "ffi")
    fn = nested_resolve_program([])
    args = resolve_inputs(np.random.default_rng(0))
    hlo = Hlo(fn.lower(*args).compile().as_text())
    assert hlo.executions(targets.RESOLVE) == T * CFG.num_layers
    assert_pool_passed_without_copy(hlo, parameter=3)


# --------------------------------------------------------------------------- target names (ABI)


def test_target_names():
    assert targets.ALL == ("hisparse_resolve", "hisparse_pool_write", "hisparse_topk", "hisparse_index_scores",
                            "hisparse_grouped_matmul", "hisparse_resolve_prefetch", "hisparse_prefetch_join",
                            "hisparse_sparse_attention", "hisparse_moe_route")
    assert (targets.RESOLVE, targets.POOL_WRITE, targets.TOPK, targets.INDEX_SCORES,
            targets.GROUPED_MATMUL, targets.RESOLVE_PREFETCH, targets.PREFETCH_JOIN,
            targets.SPARSE_ATTENTION, targets.MOE_ROUTE) == targets.ALL
    assert set(targets.CAPSULE_KEYS) == set(targets.ALL)
    assert targets.CUDA_ONLY == ("hisparse_index_scores", "hisparse_grouped_matmul", "hisparse_sparse_attention")


def test_every_target_registered_for_cpu():
    assert "cpu" in hs.ffi_platforms()
    capsules = hs.ffi_registrations("cpu")
    assert set(capsules) == {targets.CAPSULE_KEYS[t] for t in targets.ALL if t not in targets.CUDA_ONLY}
    if hs.built_with_cuda():
        assert set(hs.ffi_registrations("cuda")) == set(targets.CAPSULE_KEYS.values())
        assert "cuda" in hs.ffi_platforms()
    else:
        assert not hs.ffi_registrations("cuda") and "cuda" not in hs.ffi_platforms()


@pytest.mark.parametrize("target", [t for t in targets.ALL if t not in targets.CUDA_ONLY])
def test_targets_compile_and_run_on_cpu(target):
    """Registered means XLA:CPU finds a handler: a program calling each target
    compiles and runs on a CPU device (an unknown name does not)."""
    cpu = jax.devices("cpu")[0]
    pool = jax.device_put(
        np.arange(np.prod(CFG.pool_shape), dtype=np.float32).reshape(CFG.pool_shape),
        jax.sharding.SingleDeviceSharding(cpu, memory_kind="pinned_host"),
    )
    with jax.default_device(cpu):
        if target == targets.RESOLVE:
            cache = hs.init_hot_cache(CFG, jax.sharding.SingleDeviceSharding(cpu))
            sel = jnp.array([[1, 2, -1, -1], [3, 3, 3, 3]], jnp.int32)
            result, cache = jax.jit(
                lambda c, p: hs.resolve(c, p, sel, jnp.full((2,), 16, jnp.int32), 2, implementation="ffi")
            )(cache, pool)
            np.testing.assert_array_equal(result.slots, [[0, 1, -1, -1], [0, 0, 0, 0]])
        elif target in (targets.RESOLVE_PREFETCH, targets.PREFETCH_JOIN):
            cache = hs.init_hot_cache(CFG, jax.sharding.SingleDeviceSharding(cpu))
            sel = jnp.array([[1, 2, -1, -1], [3, 3, 3, 3]], jnp.int32)

            def resolved(c, p):
                result, c, pending = hs.resolve_prefetch(c, p, sel, jnp.full((2,), 16, jnp.int32), 2, slot=0,
                                                         implementation="ffi")
                return result, hs.join_prefetch(c, pending, result.slots)

            result, (cache, misses) = jax.jit(resolved)(cache, pool)
            np.testing.assert_array_equal(result.slots, [[0, 1, -1, -1], [0, 0, 0, 0]])
            np.testing.assert_array_equal(misses, [2, 1])
        elif target == targets.MOE_ROUTE:
            routed = jax.jit(lambda s: hs.route_experts(s, 1, 2, 1.0, implementation="ffi"))(
                jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], jnp.float32))
            np.testing.assert_array_equal(routed.chosen, [[0], [1]])
            np.testing.assert_array_equal(routed.group_sizes, [1, 1])
        elif target == targets.TOPK:
            scores = jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], jnp.float32)
            ids = jax.jit(
                lambda s: hs.select_topk(s, jnp.array([3, 1], jnp.int32), 2, implementation="ffi")
            )(scores)
            np.testing.assert_array_equal(ids, [[0, 2], [0, -1]])
        else:
            rows = jnp.zeros((CFG.num_layers, 2, 1, 1, 2), jnp.float32)
            out = jax.jit(
                lambda p: hs.write_records(p, rows, jnp.array([0, 5], jnp.int32), implementation="ffi")
            )(pool)
            assert float(np.asarray(out)[0, 1, 5].sum()) == 0.0


def test_unknown_target_is_refused():
    call = jax.ffi.ffi_call("hisparse_not_a_target", jax.ShapeDtypeStruct((), jnp.int32))
    with pytest.raises(Exception, match="hisparse_not_a_target"):
        jax.jit(lambda: call()).lower().compile()

"""The compiled decode program of every family, not just its values.

- one RESOLVE per sparse layer per step and one pool write per step (counted in the jaxpr,
  weighted by scan lengths);
- the host pool enters and leaves the program in pinned_host memory (S(5)), reaches the RESOLVE
  custom calls without a copy, and is never copied;
- no weight-, key- or KV-sized array is copied, sliced or padded in the step: every layer reads
  its weights, index keys and KV buffers in place;
- a second generate call with equal shapes neither traces nor compiles, and the state is donated.
The checks themselves are hisparse_jax.testing's (what a researcher runs on their own family;
tests/test_testing_helpers.py proves they fail on broken families), through program_helpers.
The shapes match the session runs of test_families.py, so lowering reuses their compilation.
(conftest.py sets jax_disable_most_optimizations once for the whole process: jit's cache is not
keyed on it, so it must never flip between compilations.)
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import dispatch
from model_helpers import CASES, FEW_LAYERS, STEPS
from program_helpers import IN_PLACE, assert_no_big_copies, ffi_calls, traced

from hisparse_jax import decode, hlo, targets, testing


@pytest.fixture
def needs_ffi(ffi_backend):
    if not ffi_backend:
        pytest.skip(f"no RESOLVE FFI handler on {jax.default_backend()}: resolve runs the JAX reference")


def test_one_resolve_per_sparse_layer_per_step(needs_ffi, case):
    config = case.config()
    testing.assert_one_resolve_per_sparse_layer_per_step(traced(case, config), config, STEPS)


def test_no_resolve_or_pool_outside_hisparse(case):
    calls = ffi_calls(traced(case, case.config(), "device").jaxpr.jaxpr)
    assert not [c for c in calls if c[0] in (targets.RESOLVE, targets.POOL_WRITE)]


def test_host_pool_stays_pinned_and_is_never_copied(needs_ffi, case):
    config = case.config()
    program = hlo.parse(traced(case, config).lower().compile().as_text())
    testing.assert_host_pool_stays_pinned(program, config, len(case.lengths))


@contextlib.contextmanager
def _count_events(function_name):
    """Counts traces and compilations of the jitted function called `function_name`."""
    counts = {dispatch.JAXPR_TRACE_EVENT: 0, dispatch.BACKEND_COMPILE_EVENT: 0}

    def listener(event, duration, fun_name="", **_):
        if event in counts and function_name in str(fun_name):
            counts[event] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_second_generate_reuses_the_program_and_donates(case):
    config = case.config()
    w = case.weights(config)
    tokens, lengths = case.prompts()
    lengths = np.minimum(lengths, config.max_context - 2 * STEPS)  # room for two calls
    state = case.module.init_state(config, len(case.lengths), "hisparse")
    state, logits = decode.prefill(case.family, config, w, state, jnp.asarray(tokens), jnp.asarray(lengths))
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out = decode.generate(case.family, config, w, state, first, STEPS, return_logits=True)
    donated, programs = out.state, decode.generate_program._cache_size()
    with _count_events(decode.generate_program.__name__) as counts:
        out = decode.generate(case.family, config, w, out.state, out.tokens[-1], STEPS, return_logits=True)
        jax.block_until_ready(out.tokens)
    assert counts[dispatch.JAXPR_TRACE_EVENT] == 0, "generate was traced again"
    assert counts[dispatch.BACKEND_COMPILE_EVENT] == 0, "generate was compiled again"
    assert decode.generate_program._cache_size() == programs
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(donated)), "the state was not donated"
    assert out.state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(out.state.lengths), lengths + 2 * STEPS)


# --------------------------------------------------------------------------- in-place reads


@pytest.mark.parametrize("mode", ["hisparse", "device", "dense"])
def test_no_weight_key_or_kv_sized_copy(case, mode):
    # 32 records of 16 tokens for Quest and NSA: no small buffer (an open page, a window) then has
    # the shape of a record-indexed one (page bounds, KV), and a copy of one cannot hide as the other.
    assert_no_big_copies(case, case.config(max_context=512), mode)


# Sizes that give no intermediate an expert weight's dims: the routed pairs (3 x 2) are neither
# 4 experts nor 1 shared expert, and 2F = 96, F = 48 are no other width of the model. F = 48 keeps
# the down projection's K a multiple of 16. On a GPU the model runs in bfloat16, the activations
# the CUDA kernel takes (a float32 model would send the experts to the XLA reference there); the CPU
# keeps float32, since XLA's CPU backend widens bfloat16 arrays (the KV among them) to compute.
MOE_COPY_CHECK = dict(experts=4, experts_per_token=2, expert_d_ff=48, shared_experts=1, expert_groups=2,
                      expert_dtype="fp8")


def test_no_weight_sized_copy_with_experts():
    """The MoE reads its router and expert weights (fp8 codes and scales, the shared expert) in
    place: no copy of any weight's shape, and no array of an expert matrix's dims, in any dtype or
    axis order, made per step. One family suffices, the MoE is the same code in each: Quest, whose
    slice has a dense-attention and a sparse layer.

    The second rule is the stricter one for the experts: widening or transposing an expert matrix
    is a copy too. On CPU the grouped matmul is its XLA reference (hisparse_jax.grouped_matmul),
    which widens each expert matrix to a transposed float copy; XLA hoists those out of the step
    loop (one per generate call, from weights that do not change), so the step itself reads the
    experts without copies. On GPUs the CUDA kernel reads the fp8 codes in place.
    """
    case = CASES["quest"]
    dtype = "bfloat16" if jax.default_backend() == "gpu" else "float32"
    config = case.config(max_context=512, dtype=dtype, **MOE_COPY_CHECK, **FEW_LAYERS[case.family])
    program = assert_no_big_copies(case, config, "hisparse")
    weights = jax.eval_shape(lambda: case.weights(config))
    experts = {tuple(sorted(leaf.shape)) for path, leaf in jax.tree_util.tree_flatten_with_path(weights)[0]
               if "moe" in jax.tree_util.keystr(path) and leaf.ndim == 3}
    assert experts, "no expert matrices in the weights"
    step = program.loop_computations()
    bad = [f"{name} = {shape} {opcode} (root {root})" for name, shape, opcode, root in program.materialized(step)
           if opcode not in IN_PLACE and tuple(sorted(hlo.dims(shape))) in experts]
    assert not bad, "expert-sized arrays produced in the decode step:\n" + "\n".join(bad[:20])





def test_fused_routing_is_one_custom_call_per_moe_layer_per_step(ffi_backend):
    """routing_implementation="fused": the MoE's routing bookkeeping is one hisparse_moe_route call
    a layer, run once per decode step, in both modes (its bits are those of "count":
    tests/models/test_routing.py)."""
    if not ffi_backend:
        pytest.skip(f"no FFI handler on {jax.default_backend()}: the routing runs its XLA reference")
    case = CASES["quest"]
    config = case.config(max_context=512, **MOE_COPY_CHECK, **FEW_LAYERS[case.family], routing_implementation="fused")
    for mode in ("hisparse", "device"):
        calls = [c for c in ffi_calls(traced(case, config, mode).jaxpr.jaxpr) if c[0] == targets.MOE_ROUTE]
        assert len(calls) == config.num_layers and all(c[1:] == (STEPS, 1) for c in calls), (mode, calls)

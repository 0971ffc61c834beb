"""The decode's working memory (hisparse_jax.bench.decode.working_memory) against the compiled program,
and the capacity search that counts it (hisparse_jax.bench.decode.capacity)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.selection import synthetic as traces
from hisparse_jax.bench import cli
from hisparse_jax.bench.decode import runner
from hisparse_jax.bench.decode import working_memory as wm
from hisparse_jax.bench.decode.capacity import largest_fitting, account, capacity
from hisparse_jax.bench.decode.plan import build_plan
from hisparse_jax.models import get_family
from hisparse_jax.models.family import decode_weights

STEPS, CONTEXT = 3, 40


def _config(name):
    return get_family(name).Config.tiny(max_context=64)


def _real_call_analysis(family, config, mode: str, batch: int, trace: bool):
    """The memory analysis of generate's program compiled (default options) for arrays placed as
    the runner's are: a filled state, first tokens, weights and trace ids in default device memory
    (their values do not change the program: zeros, which are quicker to make)."""
    shapes = jax.eval_shape(lambda: decode_weights(family, config, family.init_weights(config, 0)))  # as run_decode
    weights = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    state, first = runner.initial_state(family, config, weights, mode, batch, CONTEXT, fill="synthetic")
    selection = {}
    if trace:
        ids = np.zeros(wm.selections_shape(family, config, batch, STEPS), np.int32)  # runner.trace_ids' shape
        selection = dict(forced=decode.ForcedTrace(jax.block_until_ready(jnp.asarray(ids))))
    traced = decode.trace_generate(family, config, weights, state, first, STEPS, **selection)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(weights))
    return traced.lower().compile().memory_analysis(), weight_bytes


@pytest.mark.parametrize("name, mode, trace", [("dsa", "hisparse", True), ("quest", "device", False)])
def test_program_memory_is_the_memory_analysis_of_the_runners_call(name, mode, trace):
    family, config = get_family(name), _config(name)
    real, weight_bytes = _real_call_analysis(family, config, mode, 2, trace)
    got = wm.program_memory(family, config, mode, 2, STEPS, trace=trace)
    assert got.temp == real.temp_size_in_bytes
    assert got.outputs == real.output_size_in_bytes - real.alias_size_in_bytes
    assert got.argument_bytes == real.argument_size_in_bytes
    # Every argument byte is accounted for: the state (both memories), the weights, the small
    # inputs and the trace ids (XLA:CPU reports the host pool among the arguments). Greedy decoding
    # leaves the PRNG key unused, and jit drops unused arguments from the program; the key is on
    # device all the same, so `arguments` counts it.
    state = account(family, config, 2, mode)
    key = wm.nbytes(jax.random.key(0))
    assert got.argument_bytes == (state.total("device") + state.total("host") + weight_bytes + got.arguments - key
                                  + got.trace_ids)
    assert got.trace_ids == (wm.trace_ids_bytes(family, config, 2, STEPS) if trace else 0)
    assert got.host == 0  # XLA:CPU reports no memory apart as host memory


def test_the_affine_fit_reproduces_a_third_compiled_batch():
    family, config = get_family("dsa"), _config("dsa")
    working = wm.working_memory(family, config, "hisparse", STEPS, trace=False, batches=(2, 4))
    assert [m.batch for m in working.fitted] == [2, 4]
    for m in working.fitted:  # rounded up per request: never below the fitted programs
        assert working.estimate(m.batch) >= m.total
        assert working.estimate(m.batch) - m.total < 4  # (rounding: less than batch - 2 bytes)
    third = working.at(8)
    # The residual at a third batch is what buffer assignment adds beyond affine (packing,
    # alignment): within 1% of the compiled figure here.
    assert abs(working.estimate(8) - third.total) <= 0.01 * third.total, (working.estimate(8), third.total)
    assert working.per_request > 0 and third.total > working.fitted[1].total


def _device_bytes(family, config, mode: str, batch: int, working) -> int:
    """State bytes from the byte account plus the compiled working memory: no Capacity arithmetic."""
    return account(family, config, batch, mode).total("device") + wm.program_memory(
        family, config, mode, batch, working.steps, trace=working.trace, skip_indexer=working.skip_indexer).total


def test_capacity_counts_the_compiled_working_memory():
    family, config = get_family("dsa"), _config("dsa")
    working = wm.working_memory(family, config, "hisparse", STEPS, trace=False, batches=(2, 4))
    # A budget the state of 4 requests fits but not with the decode's working memory at 4.
    budget = _device_bytes(family, config, "hisparse", 4, working) - 1
    state_only = capacity(family, config, "hisparse", device_budget=budget)
    assert state_only.max_batch >= 4  # the working memory is what moves the answer
    c = capacity(family, config, "hisparse", device_budget=budget, working=working)
    b = c.max_batch
    assert b == 3 and c.limited_by == "device"
    assert _device_bytes(family, config, "hisparse", b, working) <= budget
    assert _device_bytes(family, config, "hisparse", b + 1, working) > budget
    assert c.device_bytes(b) == _device_bytes(family, config, "hisparse", b, working)
    assert c.working_at_max_batch == working.at(b).total
    assert (c.working_fixed, c.working_per_request, c.trace_ids_per_request) == (working.fixed,
                                                                                 working.per_request, 0)
    # Budget to spare: the cap limits, and the working memory at the cap is what was checked.
    roomy = capacity(family, config, "hisparse", device_budget=2**40, max_batch_cap=4, working=working)
    assert (roomy.max_batch, roomy.limited_by, roomy.working_at_max_batch) == (4, "cap", working.at(4).total)
    # A budget below batch 1's state answers 0 without compiling anything new.
    assert capacity(family, config, "hisparse", device_budget=1000, working=working).max_batch == 0


def test_capacity_refuses_the_working_memory_of_another_program():
    family, config = get_family("dsa"), _config("dsa")
    working = wm.working_memory(family, config, "hisparse", STEPS, trace=False, batches=(2, 4))
    with pytest.raises(ValueError, match="working_memory\\(family, config, mode"):
        capacity(family, config, "device", device_budget=2**30, working=working)
    with pytest.raises(ValueError, match="working_memory\\(family, config, mode"):
        capacity(family, dataclasses.replace(config, top_k=8), "hisparse", device_budget=2**30, working=working)


@pytest.mark.parametrize("upper", [0, 1, 2, 7, 64, 1000])
def test_the_search_finds_thelargest_fitting_batch_from_any_guess(upper):
    batches = set(range(upper + 1))
    for answer in sorted({0, 1, upper // 3, upper - 1, upper} & batches):
        for guess in sorted({0, 1, answer - 1, answer, answer + 1, upper // 2, upper} & batches):
            checked = []

            def fits(b):
                checked.append(b)
                return b <= answer

            assert largest_fitting(fits, guess, upper) == answer
            # Bounded: an exact guess costs 2 checks (guess and guess + 1; 1 at the bound), a wrong
            # one a logarithmic number.
            if guess == answer:
                bound = 1 if answer == upper else 2
            else:
                bound = 2 * math.log2(upper + 1) + 3
            assert len(checked) <= bound, (answer, guess, checked)
            assert all(1 <= b <= upper for b in checked)  # batch 0 always fits: never compiled


@pytest.mark.parametrize("name", ["dsa", "nsa", "quest"])
def test_trace_ids_are_steps_layers_streams_k_int32(name):
    family, config = get_family(name), _config(name)
    layers, streams, _ = family.selecting_layout(config, 3)
    expected = STEPS * layers * int(np.prod(streams)) * config.top_k * 4
    assert wm.trace_ids_bytes(family, config, 3, STEPS) == expected
    if name == "dsa":  # the ids the runner generates (one family: generating them compiles)
        ids = runner.trace_ids(family, config, traces.TraceConfig.calibration("glm-5.1", config.page_size),
                               jnp.full((3,), CONTEXT, jnp.int32), STEPS)
        assert ids.dtype == np.int32 and ids.nbytes == expected


def test_bad_arguments_are_refused():
    family, config = get_family("dsa"), _config("dsa")
    with pytest.raises(ValueError, match="batch and steps must be >= 1"):
        wm.program_memory(family, config, "device", 0, STEPS, trace=False)
    with pytest.raises(ValueError, match="skip_indexer=True needs trace=True"):
        wm.program_memory(family, config, "device", 1, STEPS, trace=False, skip_indexer=True)
    with pytest.raises(ValueError, match="two increasing batches"):
        wm.working_memory(family, config, "device", STEPS, trace=False, batches=(4, 2))
    with pytest.raises(ValueError, match="upper must be >= 0"):
        wm.fit_batches(-1)
    assert [wm.fit_batches(u) for u in (0, 1, 3, 6, 16, 17)] == [(2, 3), (2, 3), (2, 3), (3, 6), (8, 16), (8, 17)]


def test_the_plan_sizes_every_run_with_its_working_memory():
    """build_plan's capacities count the decode as it runs: its steps, its trace ids, no indexer."""
    argv = ["decode", "--contexts", "24", "--modes", "device", "--steps", "2", "--reps", "1", "--max-batch", "16",
            "--selection", "trace-no-indexer", "--device-budget-mib", "0.3", "--no-equal-batch"]
    plan = build_plan(cli.parser().parse_args(argv))
    (c,) = plan.contexts
    cap = c.caps["device"]
    assert (cap.working.steps, cap.working.trace, cap.working.skip_indexer) == (2, True, True)
    assert cap.trace_ids_per_request == wm.trace_ids_bytes(plan.family, c.config, 1, 2)
    (run,) = c.runs
    assert run.batch == cap.max_batch >= 1 and cap.limited_by == "device"
    assert cap.device_bytes(run.batch) <= plan.device_budget < cap.device_bytes(run.batch + 1)
    state_only = capacity(plan.family, c.config, "device", device_budget=plan.device_budget, max_batch_cap=16)
    assert state_only.max_batch > run.batch  # the working memory is what moves the answer here

"""The compiled decode program, not just its values (STYLE.md principle 5).

- one RESOLVE per sparse layer per step and one pool write per step, inside
  the scans (counted in the jaxpr, weighted by scan lengths);
- the host pool enters and leaves the program in pinned_host memory (S(5)),
  reaches the RESOLVE custom calls without a copy, and is never copied;
- a second generate call with equal shapes neither traces nor compiles;
- the state is donated.
The shapes match the session runs of conftest.py, so lowering reuses their compilation.
(conftest.py sets jax_disable_most_optimizations once for the whole process: jit's cache is
not keyed on it, so it must never flip between compilations.)
"""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import dispatch

from hisparse_jax import _targets, decode
from hisparse_jax.models import dsa

STEPS = 64
BATCH = 3


def _traced(config, weights, mode="hisparse"):
    state = dsa.init_state(config, BATCH, mode)
    return decode.trace_generate("dsa", config, weights(config), state, jnp.zeros((BATCH,), jnp.int32), STEPS,
                                 return_logits=True)


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def ffi_calls(jaxpr, trips=1, scans=0):
    """[(target_name, executions per program run, enclosing scans)] of every ffi_call."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ffi_call":
            found.append((eqn.params["target_name"], trips, scans))
        inner_trips, inner_scans = trips, scans
        if eqn.primitive.name == "scan":
            inner_trips, inner_scans = trips * eqn.params["length"], scans + 1
        for sub in _sub_jaxprs(eqn):
            found += ffi_calls(sub, inner_trips, inner_scans)
    return found


@pytest.fixture
def needs_ffi(ffi_backend):
    if not ffi_backend:
        pytest.skip(f"no RESOLVE FFI handler on {jax.default_backend()}: resolve runs the JAX reference")


@pytest.mark.parametrize("overrides", [dict(), dict(n_layers=4, index_share=2)], ids=["per-layer", "shared"])
def test_one_resolve_per_sparse_layer_per_step(needs_ffi, make_config, weights, overrides):
    config = make_config(**overrides)
    calls = ffi_calls(_traced(config, weights).jaxpr.jaxpr)
    resolves = [c for c in calls if c[0] == _targets.RESOLVE]
    writes = [c for c in calls if c[0] == _targets.POOL_WRITE]
    assert len(resolves) == 1, "one RESOLVE call site, in the layer loop body"
    assert sum(trips for _, trips, _ in resolves) == STEPS * config.n_layers
    assert resolves[0][2] == 3, "RESOLVE sits in step scan > group scan > layer scan"
    assert len(writes) == 1 and writes[0][1] == STEPS, "one pool write (the sealed page) per step"


def test_no_resolve_or_pool_outside_hisparse(make_config, weights):
    calls = ffi_calls(_traced(make_config(), weights, "device").jaxpr.jaxpr)
    assert calls == []


_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def _split_shape(text):
    """'SHAPE opcode(operands), attrs' -> (SHAPE, opcode, rest); SHAPE may be a (tuple)."""
    if text.startswith("("):
        depth = 0
        for end, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
        shape, text = text[: end + 1], text[end + 1 :].lstrip()
    else:
        shape, _, text = text.partition(" ")
    opcode, _, rest = text.partition("(")
    return shape, opcode, rest


def _instructions(hlo_text):
    """name -> (shape text, opcode, rest of line) of every HLO instruction."""
    out = {}
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if m:
            out[m.group(1)] = _split_shape(m.group(2))
    return out


def _pool_shape(config) -> str:
    c = config.cache_config(BATCH)
    dtype = {"float32": "f32", "bfloat16": "bf16"}[c.dtype.name]
    return f"{dtype}[{','.join(map(str, c.pool_shape))}]"


def test_host_pool_stays_pinned_and_is_never_copied(needs_ffi, make_config, weights):
    config = make_config()
    hlo = _traced(config, weights).lower().compile().as_text()
    pool = _pool_shape(config)
    entry = re.search(r"entry_computation_layout=\{\((.*)\)->(.*)\}", hlo)
    assert entry, "no entry_computation_layout in the compiled HLO"
    host_pool = re.escape(pool[:-1]) + r"\]\{[\d,]+:S\(5\)\}"
    assert re.search(host_pool, entry.group(1)), f"pool {pool} is not an S(5) parameter"
    assert re.search(host_pool, entry.group(2)), f"pool {pool} is not an S(5) result"

    instructions = _instructions(hlo)
    resolves = [i for i in instructions.values() if f'custom_call_target="{_targets.RESOLVE}"' in i[2]]
    assert resolves, "no RESOLVE custom call in the compiled program"
    on_gpu = jax.default_backend() == "gpu"
    for _, _, rest in resolves:
        operand = rest.split(",")[0].strip().lstrip("%")
        shape = instructions[operand][0]
        assert shape.startswith(pool[:-1]), f"RESOLVE operand 0 is {shape}, expected the pool {pool}"
        if on_gpu:  # the CPU compiler keeps memory spaces only at the entry
            assert ":S(5)" in shape, f"RESOLVE reads the pool from {shape}, not pinned host"

    allowed = {"parameter", "get-tuple-element", "custom-call", "bitcast", "tuple", "while", "opt-barrier"}
    for name, (shape, opcode, rest) in instructions.items():
        if shape.startswith(pool[:-1]):
            assert opcode in allowed, f"{name} = {opcode} produces a pool-shaped array: a copy of the pool"
            if opcode == "custom-call":
                assert _targets.POOL_WRITE in rest, f"{name}: unexpected custom call on the pool"


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


def test_second_generate_reuses_the_program_and_donates(make_config, weights, prompts):
    config = make_config()
    w = weights(config)
    state = dsa.init_state(config, BATCH, "hisparse")
    state, logits = decode.prefill("dsa", config, w, state, *prompts)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    tokens, _, _, state = decode.generate("dsa", config, w, state, first, STEPS, return_logits=True)
    donated, programs = state, decode._generate_jit._cache_size()
    with _count_events(decode._generate_program.__name__) as counts:
        tokens, _, _, state = decode.generate("dsa", config, w, state, tokens[-1], STEPS, return_logits=True)
        jax.block_until_ready(tokens)
    assert counts[dispatch.JAXPR_TRACE_EVENT] == 0, "generate was traced again"
    assert counts[dispatch.BACKEND_COMPILE_EVENT] == 0, "generate was compiled again"
    assert decode._generate_jit._cache_size() == programs
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(donated)), "the state was not donated"
    assert state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(state.lengths), np.array([37, 20, 5]) + 2 * STEPS)

"""Inspecting a family's compiled decode program: its traced jaxpr (ffi calls weighted by scan
trips) and its compiled HLO (read with hisparse_jax.hlo), shared by test_decode_program.py and
test_prefetch_decode.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from model_helpers import STEPS

from hisparse_jax import decode, hlo, layout


def traced(case, config, mode="hisparse"):
    batch = len(case.lengths)
    state = case.module.init_state(config, batch, mode)
    return decode.trace_generate(case.family, config, case.weights(config), state, jnp.zeros((batch,), jnp.int32),
                                 STEPS, return_logits=True)


def sub_jaxprs(eqn):
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
        for sub in sub_jaxprs(eqn):
            found += ffi_calls(sub, inner_trips, inner_scans)
    return found


def big_shapes(case, config, mode):
    """HLO shapes of every weight matrix, every per-layer state buffer and the device KV: arrays a
    step must read in place (a copy of one of them is a copy of weights, keys or KV)."""
    batch = len(case.lengths)
    state = jax.eval_shape(lambda: case.module.init_state(config, batch, mode))
    shapes = {hlo.shape_text(leaf.value.shape, leaf.value.dtype) for leaf in layout.leaves(state)
              if leaf.layout.category not in (layout.COUNTERS, layout.OPEN_PAGE) and leaf.layout.memory == layout.DEVICE
              and not leaf.path.startswith("store.cache")}
    weights = jax.eval_shape(lambda: case.weights(config))
    shapes |= {hlo.shape_text(w.shape, w.dtype) for w in jax.tree.leaves(weights) if len(w.shape) >= 2}
    return shapes


def fully_optimized(lowered) -> str:
    """Compiled HLO text with the optimizations conftest.py turns off for speed. An AOT compile
    (lower().compile()) never enters jit's dispatch cache, so flipping the flag around it cannot
    leak a program into the cached runs."""
    was = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        return lowered.compile().as_text()
    finally:
        jax.config.update("jax_disable_most_optimizations", was)


# Opcodes that may produce a big array: passing it through, or updating it in place.
IN_PLACE = {"parameter", "get-tuple-element", "tuple", "bitcast", "while", "opt-barrier", "custom-call",
             "dynamic-update-slice", "scatter", "call", "conditional"}


def assert_no_big_copies(case, config, mode) -> hlo.Module:
    """Asserts the step copies no weight-, key- or KV-sized array; returns the compiled program."""
    # At full optimization (the session's runs compile with most optimizations off, which leaves
    # every elementwise op unfused and materialized): this is the program a user runs.
    program = hlo.parse(fully_optimized(traced(case, config, mode).lower()))
    big = big_shapes(case, config, mode)
    bad = []
    for name, shape, opcode, root in program.materialized():
        if hlo.array_type(shape) not in big or opcode in IN_PLACE:
            continue
        if opcode == "fusion" and root in ("dynamic-update-slice", "scatter"):
            continue  # an in-place update fusion
        bad.append(f"{name} = {shape} {opcode} (root {root})")
    assert not bad, "weight-, key- or KV-sized arrays produced in the step:\n" + "\n".join(bad[:20])
    return program

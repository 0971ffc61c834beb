"""Inspecting a family's compiled decode program: its traced jaxpr (ffi calls weighted by scan
trips) and its compiled HLO (which instructions get a buffer, which run in the step loop), shared
by test_decode_program.py and test_prefetch_decode.py.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from model_helpers import STEPS

from hisparse_jax import decode, layout


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


DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def split_shape(text):
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


def instructions(hlo_text):
    """name -> (shape text, opcode, rest of line) of every HLO instruction."""
    out = {}
    for line in hlo_text.splitlines():
        m = DEFINITION.match(line)
        if m:
            out[m.group(1)] = split_shape(m.group(2))
    return out


def hlo_shape(shape, dtype) -> str:
    name = {"float32": "f32", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3fn", "int32": "s32"}[np.dtype(dtype).name]
    return f"{name}[{','.join(map(str, shape))}]"


def big_shapes(case, config, mode):
    """HLO shapes of every weight matrix, every per-layer state buffer and the device KV: arrays a
    step must read in place (a copy of one of them is a copy of weights, keys or KV)."""
    batch = len(case.lengths)
    state = jax.eval_shape(lambda: case.module.init_state(config, batch, mode))
    shapes = {hlo_shape(leaf.value.shape, leaf.value.dtype) for leaf in layout.leaves(state)
              if leaf.layout.category not in (layout.COUNTERS, layout.OPEN_PAGE) and leaf.layout.memory == layout.DEVICE
              and not leaf.path.startswith("store.cache")}
    weights = jax.eval_shape(lambda: case.weights(config))
    shapes |= {hlo_shape(w.shape, w.dtype) for w in jax.tree.leaves(weights) if len(w.shape) >= 2}
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


def computations(hlo):
    """computation name -> its instruction lines."""
    bodies, current = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            bodies[current] = []
        elif current is not None and line.strip() and line.strip() != "}":
            bodies[current].append(line)
    return bodies


def materialized(hlo, only=None):
    """(name, shape, opcode, fusion root opcode) of every instruction that gets a buffer: those of
    every computation but the bodies of fusions (what a fusion computes inside stays in registers);
    `only`: a set of computation names to look in (None: all)."""
    bodies = computations(hlo)
    fused = set(re.findall(r" fusion\(.*?calls=%?([\w.\-]+)", hlo))
    roots = {}
    for name, lines in bodies.items():
        for line in lines:
            root = re.match(r"^\s*ROOT %?[\w.\-]+ = (.*)$", line)
            if root:
                roots[name] = split_shape(root.group(1))[1]
    out = []
    for name, lines in bodies.items():
        if name in fused or (only is not None and name not in only):
            continue
        for line in lines:
            m = DEFINITION.match(line)
            if not m:
                continue
            shape, opcode, rest = split_shape(m.group(2))
            called = re.search(r"calls=%?([\w.\-]+)", rest)
            out.append((m.group(1), shape, opcode, roots.get(called.group(1)) if called else None))
    return out


def dims(shape: str) -> tuple[int, ...]:
    """'f32[4,48,64]{2,1,0}' -> (4, 48, 64); () for a tuple shape."""
    m = re.match(r"^\w+\[([\d,]*)\]", shape)
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def loop_computations(hlo) -> set[str]:
    """Computations run inside the entry computation's while loops (the decode steps' scan): their
    bodies and conditions and everything these call, transitively."""
    bodies = computations(hlo)
    entry = next(name for name in bodies if re.search(rf"^ENTRY %?{re.escape(name)} ", hlo, re.M))
    called = lambda lines: {c.lstrip("%") for line in lines for group in re.findall(
        r"(?:body|condition|calls|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)", line)
        for c in re.findall(r"%?[\w.\-]+", group)}
    todo = {c for line in bodies[entry] if " while(" in line for c in called([line])}
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        todo |= called(bodies[name])
    return seen


def assert_no_big_copies(case, config, mode) -> str:
    """Asserts the step copies no weight-, key- or KV-sized array; returns the compiled HLO text."""
    # At full optimization (the session's runs compile with most optimizations off, which leaves
    # every elementwise op unfused and materialized): this is the program a user runs.
    hlo = fully_optimized(traced(case, config, mode).lower())
    big = big_shapes(case, config, mode)
    bad = []
    for name, shape, opcode, root in materialized(hlo):
        if shape.split("{")[0] not in big or opcode in IN_PLACE:
            continue
        if opcode == "fusion" and root in ("dynamic-update-slice", "scatter"):
            continue  # an in-place update fusion
        bad.append(f"{name} = {shape} {opcode} (root {root})")
    assert not bad, "weight-, key- or KV-sized arrays produced in the step:\n" + "\n".join(bad[:20])
    return hlo

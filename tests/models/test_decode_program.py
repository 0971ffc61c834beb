"""The compiled decode program of every family, not just its values.

- one RESOLVE per sparse layer per step and one pool write per step (counted in the jaxpr,
  weighted by scan lengths);
- the host pool enters and leaves the program in pinned_host memory (S(5)), reaches the RESOLVE
  custom calls without a copy, and is never copied;
- no weight-, key- or KV-sized array is copied, sliced or padded in the step: every layer reads
  its weights, index keys and KV buffers in place;
- a second generate call with equal shapes neither traces nor compiles, and the state is donated.
The shapes match the session runs of test_families.py, so lowering reuses their compilation.
(conftest.py sets jax_disable_most_optimizations once for the whole process: jit's cache is not
keyed on it, so it must never flip between compilations.)
"""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import dispatch
from model_helpers import CASES, FEW_LAYERS, STEPS

from hisparse_jax import targets, decode, layout


def _traced(case, config, mode="hisparse"):
    batch = len(case.lengths)
    state = case.module.init_state(config, batch, mode)
    return decode.trace_generate(case.family, config, case.weights(config), state, jnp.zeros((batch,), jnp.int32),
                                 STEPS, return_logits=True)

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


def test_one_resolve_per_sparse_layer_per_step(needs_ffi, case):
    config = case.config()
    calls = ffi_calls(_traced(case, config).jaxpr.jaxpr)
    resolves = [c for c in calls if c[0] == targets.RESOLVE]
    writes = [c for c in calls if c[0] == targets.POOL_WRITE]
    layers = config.cache_config(1).num_layers
    assert len(resolves) == layers, "one RESOLVE call site per sparse layer (the layers are unrolled)"
    assert all(trips == STEPS and scans == 1 for _, trips, scans in resolves), "each runs once per step"
    assert len(writes) == 1 and writes[0][1] == STEPS, "one pool write (the sealed page) per step"


def test_no_resolve_or_pool_outside_hisparse(case):
    calls = ffi_calls(_traced(case, case.config(), "device").jaxpr.jaxpr)
    assert not [c for c in calls if c[0] in (targets.RESOLVE, targets.POOL_WRITE)]


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


def _hlo_shape(shape, dtype) -> str:
    name = {"float32": "f32", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3fn", "int32": "s32"}[np.dtype(dtype).name]
    return f"{name}[{','.join(map(str, shape))}]"


def _pool_shape(config) -> str:
    c = config.cache_config(3)
    dtype = {"float32": "f32", "bfloat16": "bf16"}[c.dtype.name]
    return f"{dtype}[{','.join(map(str, c.pool_shape))}]"


def test_host_pool_stays_pinned_and_is_never_copied(needs_ffi, case):
    config = case.config()
    hlo = _traced(case, config).lower().compile().as_text()
    pool = _pool_shape(config)
    entry = re.search(r"entry_computation_layout=\{\((.*)\)->(.*)\}", hlo)
    assert entry, "no entry_computation_layout in the compiled HLO"
    host_pool = re.escape(pool[:-1]) + r"\]\{[\d,]+:S\(5\)\}"
    assert re.search(host_pool, entry.group(1)), f"pool {pool} is not an S(5) parameter"
    assert re.search(host_pool, entry.group(2)), f"pool {pool} is not an S(5) result"

    instructions = _instructions(hlo)
    resolves = [i for i in instructions.values() if f'custom_call_target="{targets.RESOLVE}"' in i[2]]
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
                assert targets.POOL_WRITE in rest, f"{name}: unexpected custom call on the pool"


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
    out, _, _, state = decode.generate(case.family, config, w, state, first, STEPS, return_logits=True)
    donated, programs = state, decode._generate_jit._cache_size()
    with _count_events(decode._generate_program.__name__) as counts:
        out, _, _, state = decode.generate(case.family, config, w, state, out[-1], STEPS, return_logits=True)
        jax.block_until_ready(out)
    assert counts[dispatch.JAXPR_TRACE_EVENT] == 0, "generate was traced again"
    assert counts[dispatch.BACKEND_COMPILE_EVENT] == 0, "generate was compiled again"
    assert decode._generate_jit._cache_size() == programs
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(donated)), "the state was not donated"
    assert state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(state.lengths), lengths + 2 * STEPS)


# --------------------------------------------------------------------------- in-place reads


def _big_shapes(case, config, mode):
    """HLO shapes of every weight matrix, every per-layer state buffer and the device KV: arrays a
    step must read in place (a copy of one of them is a copy of weights, keys or KV)."""
    batch = len(case.lengths)
    state = jax.eval_shape(lambda: case.module.init_state(config, batch, mode))
    shapes = {_hlo_shape(leaf.value.shape, leaf.value.dtype) for leaf in layout.leaves(state)
              if leaf.layout.category not in (layout.COUNTERS, layout.OPEN_PAGE) and leaf.layout.memory == layout.DEVICE
              and not leaf.path.startswith("store.cache")}
    weights = jax.eval_shape(lambda: case.weights(config))
    shapes |= {_hlo_shape(w.shape, w.dtype) for w in jax.tree.leaves(weights) if len(w.shape) >= 2}
    return shapes


def _fully_optimized(lowered) -> str:
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
_IN_PLACE = {"parameter", "get-tuple-element", "tuple", "bitcast", "while", "opt-barrier", "custom-call",
             "dynamic-update-slice", "scatter", "call", "conditional"}


def _computations(hlo):
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


def _materialized(hlo, only=None):
    """(name, shape, opcode, fusion root opcode) of every instruction that gets a buffer: those of
    every computation but the bodies of fusions (what a fusion computes inside stays in registers);
    `only`: a set of computation names to look in (None: all)."""
    bodies = _computations(hlo)
    fused = set(re.findall(r" fusion\(.*?calls=%?([\w.\-]+)", hlo))
    roots = {}
    for name, lines in bodies.items():
        for line in lines:
            root = re.match(r"^\s*ROOT %?[\w.\-]+ = (.*)$", line)
            if root:
                roots[name] = _split_shape(root.group(1))[1]
    out = []
    for name, lines in bodies.items():
        if name in fused or (only is not None and name not in only):
            continue
        for line in lines:
            m = _DEFINITION.match(line)
            if not m:
                continue
            shape, opcode, rest = _split_shape(m.group(2))
            called = re.search(r"calls=%?([\w.\-]+)", rest)
            out.append((m.group(1), shape, opcode, roots.get(called.group(1)) if called else None))
    return out


@pytest.mark.parametrize("mode", ["hisparse", "device", "dense"])
def test_no_weight_key_or_kv_sized_copy(case, mode):
    # 32 records of 16 tokens for Quest and NSA: no small buffer (an open page, a window) then has
    # the shape of a record-indexed one (page bounds, KV), and a copy of one cannot hide as the other.
    _assert_no_big_copies(case, case.config(max_context=512), mode)


# Sizes that give no intermediate an expert weight's dims: the routed pairs (3 x 2) are neither
# 4 experts nor 1 shared expert, and 2F = 48, F = 24 are no other width of the model.
MOE_COPY_CHECK = dict(experts=4, experts_per_token=2, expert_d_ff=24, shared_experts=1, expert_groups=2,
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
    config = case.config(max_context=512, **MOE_COPY_CHECK, **FEW_LAYERS[case.family])
    hlo = _assert_no_big_copies(case, config, "hisparse")
    weights = jax.eval_shape(lambda: case.weights(config))
    experts = {tuple(sorted(leaf.shape)) for path, leaf in jax.tree_util.tree_flatten_with_path(weights)[0]
               if "moe" in jax.tree_util.keystr(path) and leaf.ndim == 3}
    assert experts, "no expert matrices in the weights"
    step = _loop_computations(hlo)
    bad = [f"{name} = {shape} {opcode} (root {root})" for name, shape, opcode, root in _materialized(hlo, step)
           if opcode not in _IN_PLACE and tuple(sorted(_dims(shape))) in experts]
    assert not bad, "expert-sized arrays produced in the decode step:\n" + "\n".join(bad[:20])


def _dims(shape: str) -> tuple[int, ...]:
    """'f32[4,48,64]{2,1,0}' -> (4, 48, 64); () for a tuple shape."""
    m = re.match(r"^\w+\[([\d,]*)\]", shape)
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def _loop_computations(hlo) -> set[str]:
    """Computations run inside the entry computation's while loops (the decode steps' scan): their
    bodies and conditions and everything these call, transitively."""
    bodies = _computations(hlo)
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


def _assert_no_big_copies(case, config, mode) -> str:
    """Asserts the step copies no weight-, key- or KV-sized array; returns the compiled HLO text."""
    # At full optimization (the session's runs compile with most optimizations off, which leaves
    # every elementwise op unfused and materialized): this is the program a user runs.
    hlo = _fully_optimized(_traced(case, config, mode).lower())
    big = _big_shapes(case, config, mode)
    bad = []
    for name, shape, opcode, root in _materialized(hlo):
        if shape.split("{")[0] not in big or opcode in _IN_PLACE:
            continue
        if opcode == "fusion" and root in ("dynamic-update-slice", "scatter"):
            continue  # an in-place update fusion
        bad.append(f"{name} = {shape} {opcode} (root {root})")
    assert not bad, "weight-, key- or KV-sized arrays produced in the step:\n" + "\n".join(bad[:20])
    return hlo

"""The compiled decode program of a family, checked: its traced jaxpr (ffi calls weighted by scan
trips) and its compiled HLO (read with hisparse_jax.hlo). What a step must never do is copy: the
pool lives in host memory and is written in place, the weights, index keys and KV are read in
place; a copy of any of them costs a step its bandwidth budget while giving the same bits, so
only the program shows it."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp

from .. import decode, hlo, layout, targets
from ..models.family import decode_weights
from . import arguments


def trace_decode(family, config, weights, batch: int = 3, mode: str = "hisparse", steps: int = 8):
    """The traced (not run) generate program of a fresh `mode` state of `batch` streams, `steps`
    greedy steps with logits: `.jaxpr`, `.lower().compile().as_text()`."""
    family = arguments.family_of(family)
    batch, steps = arguments.batch_of(batch), arguments.steps_of(steps)
    state = arguments.new_state(family, config, batch, mode)
    return decode.trace_generate(family, config, weights, state, jnp.zeros((batch,), jnp.int32), steps,
                                 return_logits=True)


def _sub_jaxprs(eqn):
    """The jaxprs an equation runs (scan and cond bodies, pjit and custom_jvp calls), found by shape
    rather than by primitive name so new higher-order primitives are walked too."""
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def _ffi_eqns(jaxpr, trips: int = 1, scans: int = 0) -> list:
    """[(ffi_call equation, executions per program run, enclosing scans)] in `jaxpr`."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ffi_call":
            found.append((eqn, trips, scans))
        inner_trips, inner_scans = trips, scans
        if eqn.primitive.name == "scan":
            inner_trips, inner_scans = trips * eqn.params["length"], scans + 1
        for sub in _sub_jaxprs(eqn):
            found += _ffi_eqns(sub, inner_trips, inner_scans)
    return found


def ffi_calls(jaxpr, trips: int = 1, scans: int = 0) -> list[tuple[str, int, int]]:
    """[(target_name, executions per program run, enclosing scans)] of every ffi_call in `jaxpr`."""
    return [(eqn.params["target_name"], n, s) for eqn, n, s in _ffi_eqns(jaxpr, trips, scans)]


def overlap_groups(config) -> int:
    """G: the groups of streams a "hisparse" step resolves and attends separately
    (Config.overlap_groups of the kit's models; 1 for families without the field)."""
    return getattr(config, "overlap_groups", 1)


def _attribute(eqn, name: str):
    value = eqn.params.get(name)
    if value is None:  # jax keeps the call's keyword attributes apart in some versions
        value = dict(eqn.params.get("attributes", ())).get(name)
    return None if value is None else int(value)


def fully_optimized(lowered) -> str:
    """Compiled HLO text at full optimization (the program a user runs), whatever
    jax_disable_most_optimizations says (test suites turn them off for speed). An AOT compile
    (lower().compile()) never enters jit's dispatch cache, so flipping the flag around it cannot
    leak a program into cached runs."""
    was = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        return lowered.compile().as_text()
    finally:
        jax.config.update("jax_disable_most_optimizations", was)


def assert_one_resolve_per_sparse_layer_per_step(traced, config, steps: int) -> None:
    """One RESOLVE call site per sparse layer (the layers are unrolled), each run once per step of
    the one decode scan, and one pool write (the sealed page) per step. With config.prefetch, one
    resolve_prefetch and one join per sparse layer per step and no plain RESOLVE.

    With G = config.overlap_groups > 1, one per overlap group per sparse layer per step (each
    resolves its group's streams; kit.overlap), and the prefetch slots of the resolves (one per
    group and layer) are distinct and each joined once: two resolves where one is due show as an
    extra call or a repeated slot. Each resolve's stream range (its stream_begin and
    stream_count attributes) is its group's, b / G streams, each group's once per sparse layer
    (G = 1: every stream): a group call over the whole batch costs G times its share."""
    eqns = _ffi_eqns(traced.jaxpr.jaxpr)
    calls = [(e.params["target_name"], n, s) for e, n, s in eqns]
    layers = config.cache_config(1).num_layers
    groups = overlap_groups(config)
    # A kit indexer with a record kind of its own resolves its records once per selecting group
    # (a plain RESOLVE on its own store, whole batch, never prefetched): index_layers more.
    index = index_store_config(config, 1)
    index_layers = 0 if index is None else index.num_layers
    wanted = (targets.RESOLVE_PREFETCH, targets.PREFETCH_JOIN) if config.prefetch else (targets.RESOLVE,)
    per = "sparse layer" if groups == 1 else f"overlap group ({groups}) per sparse layer"
    for target in wanted:
        sites = [c for c in calls if c[0] == target]
        want = layers * groups + (index_layers if target == targets.RESOLVE else 0)
        if len(sites) != want or any(trips != steps or scans != 1 for _, trips, scans in sites):
            extra = f" and one per indexer group ({index_layers}) for its records" if index_layers else ""
            raise AssertionError(f"{target}: expected one call per {per} ({layers * groups}){extra} per step "
                                 f"({steps}) in one scan, found (target, runs, scans) {sites}")
    if config.prefetch:
        slots = {t: [_attribute(e, "prefetch_slot") for e, _, _ in eqns if e.params["target_name"] == t]
                 for t in (targets.RESOLVE_PREFETCH, targets.PREFETCH_JOIN)}
        forks, joins = slots[targets.RESOLVE_PREFETCH], slots[targets.PREFETCH_JOIN]
        if len(set(forks)) != len(forks) or sorted(forks) != sorted(joins):
            raise AssertionError(f"prefetch slots: resolves {sorted(forks)}, joins {sorted(joins)}; expected one "
                                 "distinct slot per group and sparse layer, each joined once")
    if config.prefetch and sum(c[0] == targets.RESOLVE for c in calls) != index_layers:
        raise AssertionError("a plain RESOLVE next to the prefetch: a layer resolves twice")
    resolves = [e for e, _, _ in eqns if e.params["target_name"] == wanted[0]]
    streams = math.prod(resolves[0].invars[1].aval.shape[:-1])  # selection [*S, k]
    share = streams // groups
    ranges = sorted((_attribute(e, "stream_begin"), _attribute(e, "stream_count")) for e in resolves)
    # The indexer's own records resolve the whole batch (plain RESOLVE, also next to the prefetch).
    whole = [(0, streams)] * index_layers if wanted[0] == targets.RESOLVE else []
    expected = sorted([(g * share, share) for g in range(groups) for _ in range(layers)] + whole)
    if ranges != expected:
        raise AssertionError(f"{wanted[0]}: stream ranges (begin, count) {ranges}; expected each of the {groups} "
                             f"groups' ranges of {share} streams once per sparse layer ({layers})"
                             f"{' and the whole batch once per indexer group' if whole else ''}: {expected}")
    writes = [c for c in calls if c[0] == targets.POOL_WRITE]
    pools = 1 + (index is not None)
    if len(writes) != pools or any(w[1] != steps for w in writes):
        raise AssertionError(f"{targets.POOL_WRITE}: expected one pool write per pool ({pools}) per step ({steps}), "
                             f"found {writes}")


def index_store_config(config, batch: int):
    """The CacheConfig of a kit indexer's own record kind (MLAConfig.index_cache_config), or None."""
    get = getattr(config, "index_cache_config", None)
    return None if get is None else get(batch)


# Opcodes that may produce a pool-shaped array without copying it.
_POOL_PASSING = {"parameter", "get-tuple-element", "custom-call", "bitcast", "tuple", "while", "opt-barrier"}


def assert_host_pool_stays_pinned(program: hlo.Module, config, batch: int) -> None:
    """The host pool enters and leaves the compiled `program` in pinned-host memory (S(5)), reaches
    every RESOLVE without a copy (on a GPU: still in S(5); the CPU compiler keeps memory spaces at
    the entry only), and no instruction produces a pool-shaped array but a pass-through or the
    pool write."""
    caches = [c for c in (config.cache_config(batch), index_store_config(config, batch)) if c is not None]
    pools = [hlo.shape_text(cache.pool_shape, cache.dtype) for cache in caches]  # the KV's, the indexer's
    params, result = program.entry_layout()
    for pool in pools:
        host_pool = re.escape(pool[:-1]) + r"\]\{[\d,]+:S\(5\)\}"
        if not any(re.search(host_pool, p) for p in params) or not re.search(host_pool, result):
            raise AssertionError(f"the pool {pool} is not an S(5) (pinned host) parameter and result of the program")
    resolves = [i for i in program.instructions.values() if i.target in (targets.RESOLVE, targets.RESOLVE_PREFETCH)]
    if not resolves:
        raise AssertionError("no RESOLVE custom call in the compiled program")
    for resolve in resolves:
        shape = program.instructions[resolve.operands[0]].shape
        if not any(shape.startswith(pool[:-1]) for pool in pools) or (
                jax.default_backend() == "gpu" and ":S(5)" not in shape):
            raise AssertionError(f"{resolve.name} reads the pool from {shape}, expected a pinned-host pool of {pools}")
    for name, inst in program.instructions.items():
        if any(inst.shape.startswith(pool[:-1]) for pool in pools) and (
                inst.opcode not in _POOL_PASSING or (inst.opcode == "custom-call" and inst.target != targets.POOL_WRITE)):
            what = f"custom call {inst.target}" if inst.target else inst.opcode
            raise AssertionError(f"{name} = {what} produces a pool-shaped array: a copy of the pool")


def big_shapes(config, weights, state, family=None) -> set[str]:
    """HLO types of every weight matrix, every per-layer device state buffer and the device KV:
    arrays a step must read in place (a copy of one is a copy of weights, keys or KV).

    With `family`, the weight matrices of both its layouts count, whichever `weights` is in:
    init_weights' and Family.decode_weights' (the kit: each layer's input projections in one
    matrix), so a step that concatenates the pieces (or slices the merged matrix) is a copy too."""
    shapes = {hlo.shape_text(leaf.value.shape, leaf.value.dtype) for leaf in layout.leaves(state)
              if leaf.layout.category not in (layout.COUNTERS, layout.OPEN_PAGE) and leaf.layout.memory == layout.DEVICE
              and not leaf.path.startswith(("store.cache", "index_store.cache"))}
    layouts = [weights]
    if family is not None:
        canonical = jax.eval_shape(lambda: family.init_weights(config, 0))
        layouts += [canonical, jax.eval_shape(lambda w: decode_weights(family, config, w), canonical)]
    return shapes | {hlo.shape_text(w.shape, w.dtype) for t in layouts for w in jax.tree.leaves(t) if len(w.shape) >= 2}


# Opcodes that may produce a big array: passing it through, or updating it in place.
IN_PLACE = {"parameter", "get-tuple-element", "tuple", "bitcast", "while", "opt-barrier", "custom-call",
            "dynamic-update-slice", "scatter", "call", "conditional"}


def assert_no_big_copies(family, config, weights, mode: str = "hisparse", batch: int = 3,
                         steps: int = 8) -> hlo.Module:
    """Compiles the decode program at full optimization (the program a user runs) and asserts it
    produces no array of a weight matrix's, a device state buffer's (index keys, page bounds) or
    the KV's type but by passing it through or updating it in place: every step reads them where
    they are. Returns the parsed program.

    The check goes by array type (dtype and dims): pick sizes where no small per-step buffer shares
    a big array's type, e.g. records per stream (max_context // page_size) != page_size, or a slice
    of the open page reads as a copy of the page bounds."""
    family = arguments.family_of(family)
    traced = trace_decode(family, config, weights, batch, mode, steps)
    program = hlo.parse(fully_optimized(traced.lower()))
    state = jax.eval_shape(lambda: family.init_state(config, batch, mode))
    big = big_shapes(config, weights, state, family)
    bad = [f"{name} = {shape} {opcode} (root {root})" for name, shape, opcode, root in program.materialized()
           if hlo.array_type(shape) in big and opcode not in IN_PLACE
           and not (opcode == "fusion" and root in ("dynamic-update-slice", "scatter"))]  # in-place update fusions
    if bad:
        raise AssertionError(f"{mode} decode program: {len(bad)} weight-, key- or KV-sized arrays produced in the "
                             f"step (each a copy), first {bad[0]}; all: {'; '.join(bad[:20])}")
    return program


def assert_clean_decode_program(family, config, weights, batch: int = 3, steps: int = 8) -> hlo.Module:
    """The "hisparse" decode program is what the hierarchy promises, on any backend with the
    RESOLVE handler (C++ on CPU, CUDA on GPU):

    - one RESOLVE per sparse layer per step and one pool write per step (traced jaxpr); a kit
      indexer with a record kind: one more RESOLVE per selecting group and pool write per step;
    - the host pool is an S(5) (pinned host) parameter and result, reaches RESOLVE without a copy
      and is never copied (compiled HLO);
    - no weight-, key- or KV-sized array is copied in the step (fully optimized HLO).

    Why: a copy or an extra RESOLVE gives the same bits, so the bitwise checks cannot see it, but it
    spends the memory traffic the cache exists to save. Args as assert_hisparse_matches_device;
    batch: streams of the traced program; steps: scan length. Returns the fully optimized program.

    The program checked is the one decoding runs: `weights` in the family's decode layout
    (Family.decode_weights, as the decode benchmark loads them; weights already in it pass
    unchanged). Decoding another layout is not what this vouches for: on a GPU, XLA's dot merger
    concatenates the kit's separate input projections every step (assert_no_big_copies on those
    weights shows it).
    """
    family = arguments.family_of(family)
    arguments.on_ffi(config)
    weights = decode_weights(family, config, weights)
    traced = trace_decode(family, config, weights, batch, "hisparse", steps)
    assert_one_resolve_per_sparse_layer_per_step(traced, config, arguments.steps_of(steps))
    assert_host_pool_stays_pinned(hlo.parse(traced.lower().compile().as_text()), config, batch)
    return assert_no_big_copies(family, config, weights, "hisparse", batch, steps)

"""RESOLVE: make the selected records resident in the hot buffer and return their slots.

Two implementations behind `implementation=`: the FFI custom call "hisparse_resolve" (C++ on
CPU, CUDA on GPU) and `resolve_reference`, pure JAX (its per-stream rules in _resolve_stream.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from . import _bits, _checks, _dispatch, _resolve_stream, targets
from ._dispatch import Implementation
from .cache import HotCache

_LAUNCH = {"auto": 0, "fused": 1, "split": 2}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ResolveResult:
    """What one RESOLVE call reports, per stream of the layer resolved.

    Attributes:
      slots: [*streams, k] int32, the slot holding selection[..., j]; -1 where
        selection[..., j] is padding (-1) or invalid.
      miss_records: [*streams, k] int32, records fetched from the host pool in
        miss order (first appearance), -1 after the last miss.
      miss_slots: [*streams, k] int32, the slot each miss was written to.
      misses: [*streams] int32, number of records fetched.
      invalid: [*streams] int32, ids that were neither -1 nor in [0, min(sealed, R)).
      malformed: [*streams] int32, 1 where the stream's state was malformed (its
        lru row not a permutation of [0, B), or its slot_record row holding a
        value outside [-1, R) or one record twice): such a stream resolved
        nothing (state untouched, slots and miss plan -1, misses 0); rebuild it
        with init_hot_cache or reset_streams. 0 elsewhere, and for a layer
        outside [0, L).
    """

    slots: jax.Array
    miss_records: jax.Array
    miss_slots: jax.Array
    misses: jax.Array
    invalid: jax.Array
    malformed: jax.Array


def resolve(
    cache: HotCache,
    host_pool: jax.Array,
    selection: jax.Array,
    sealed: jax.Array,
    layer: jax.Array | int,
    *,
    implementation: Implementation = "auto",
    fetch: bool = True,
    launch: Literal["auto", "fused", "split"] = "auto",
    checked: bool = False,
    stream_begin: int = 0,
    stream_count: int | None = None,
) -> tuple[ResolveResult, HotCache]:
    """Resolves one layer's selection for every stream, or for a range of them (docs/contract.md).

    Args:
      cache: HotCache with hot [L, *S, B, *rec], slot_record and lru [L, *S, B].
      host_pool: [L, *S, R, *rec] in pinned_host memory, read-only here.
      selection: [*S, k] int32 record ids, -1 = padding; repeated ids share a slot.
        k = 0 is allowed: nothing is resolved and the [*S, k] results are empty.
      sealed: [*S] int32 sealed records per stream; ids outside
        [0, min(sealed, R)) are treated as padding and counted in `invalid`.
      layer: int32 scalar (may be traced, e.g. a scan index) or Python int.
      implementation: "ffi" (the C++/CUDA handler), "reference" (pure JAX) or
        "auto" (the handler when one is registered for the default backend).
      fetch: False skips copying record bytes (benchmarks of the pure resolve
        cost); slot_record and lru are updated as usual, hot is not.
      launch: CUDA launch plan, "fused" (one launch), "split" (a resolve launch
        and a copy spread over many blocks) or "auto"; ignored on CPU.
      checked: emit checkify checks that no id was invalid and no stream's
        state was malformed; wrap the caller with
        jax.experimental.checkify.checkify to turn them into errors.
      stream_begin, stream_count: static Python ints: resolve only the streams
        [stream_begin, stream_begin + stream_count) of the flattened stream axis
        (stream_count None: through the last stream; the default is every
        stream). The others are neither read nor written and their results are
        what padding gives (slots and miss plan -1, counts 0): for a well-formed
        state, the call with -1 outside the range, bit for bit, at the cost of
        the range's streams alone (on CUDA the launch covers only them).

    Returns:
      (ResolveResult, new HotCache). Under jit with the cache donated, the
      state is updated in place (the FFI call aliases it).
    """
    result, cache, _, _ = resolve_with(targets.RESOLVE, cache, host_pool, selection, sealed, layer,
                                       implementation=implementation, fetch=fetch, launch=launch, checked=checked,
                                       stream_begin=stream_begin, stream_count=stream_count)
    return result, cache


def resolve_with(target: str, cache: HotCache, host_pool, selection, sealed, layer, *, implementation: str,
                 fetch: bool, launch: str, checked: bool, stream_begin: int = 0, stream_count: int | None = None,
                 **attributes):
    """`resolve` through the FFI target `target` (RESOLVE or its prefetch variant, with its extra
    `attributes`): (ResolveResult, HotCache, the implementation that ran, the int32 layer)."""
    impl = _dispatch.choose_implementation("resolve", implementation, target)
    _checks.check_resolve(cache, host_pool, selection, sealed, layer, need_host=impl == "ffi")
    if launch not in _LAUNCH:
        raise ValueError(f"launch must be 'auto', 'fused' or 'split', got {launch!r}")
    streams = _checks.check_stream_range("resolve", selection, stream_begin, stream_count)
    layer = jnp.asarray(layer, jnp.int32)
    if impl == "ffi":
        outs = resolve_call(target, cache, host_pool, selection, sealed, layer, fetch=fetch, launch=launch,
                            stream_range=streams, **attributes)
    else:
        outs = resolve_reference(
            cache.hot, cache.slot_record, cache.lru, host_pool, selection, sealed, layer, fetch=fetch,
            stream_begin=streams[0], stream_count=streams[1],
        )
    result, cache = resolve_outputs(outs, checked)
    return result, cache, impl, layer


def resolve_call(target: str, cache: HotCache, host_pool, selection, sealed, layer, *, fetch: bool,
                 launch: str, stream_range: tuple[int, int] | None = None, **attributes):
    """The FFI call of RESOLVE or its prefetch variant (`target`; extra `attributes`): its nine
    results, the state updated in place (aliased). Arguments already checked by `resolve`;
    stream_range (begin, count) is checked there too (None: every stream)."""
    _dispatch.require_handler("resolve", target)
    k = selection.shape[-1]
    streams = selection.shape[:-1]
    begin, count = stream_range if stream_range is not None else (0, math.prod(streams))
    per_pick = jax.ShapeDtypeStruct((*streams, k), jnp.int32)
    per_stream = jax.ShapeDtypeStruct(streams, jnp.int32)
    call = jax.ffi.ffi_call(
        target,
        (
            per_pick,
            per_pick,
            per_pick,
            per_stream,
            per_stream,
            per_stream,
            jax.typeof(cache.hot),
            jax.typeof(cache.slot_record),
            jax.typeof(cache.lru),
        ),
        # operands hot, slot_record, lru -> results 6, 7, 8 (updated in place)
        input_output_aliases={4: 6, 5: 7, 6: 8},
    )
    return call(
        host_pool,
        selection,
        sealed,
        layer,
        cache.hot,
        cache.slot_record,
        cache.lru,
        fetch=bool(fetch),
        launch=np.int32(_LAUNCH[launch]),  # the handler decodes an int32 attribute
        stream_begin=int(begin),  # int64 attributes
        stream_count=int(count),
        **attributes,
    )


def resolve_reference(hot, slot_record, lru, host_pool, selection, sealed, layer, *, fetch=True,
                      stream_begin: int = 0, stream_count: int | None = None):
    """RESOLVE on every stream of one layer, or on the streams [stream_begin, stream_begin +
    stream_count) of the flattened stream axis; same operands and results as the FFI call.

    Shapes: hot [L, *S, B, *rec], slot_record/lru [L, *S, B], host_pool
    [L, *S, R, *rec], selection [*S, k], sealed [*S], layer [] int32.
    Returns (slots, miss_records, miss_slots, misses, invalid, malformed, hot,
    slot_record, lru); see ffi/resolve.h for the malformed-state, k = 0 and
    stream-range rules (streams outside the range: rows of padding, state untouched).

    Vectorized with sorts and prefix sums (_resolve_stream.py), so it runs under jit, vmap and
    scan on any backend. It reads the host pool by moving it to device memory first (XLA gathers
    cannot read pinned_host operands), so it copies the whole pool on every call: a reference
    and a fallback, not a fast path.
    """
    for name, value in (("selection", selection), ("sealed", sealed), ("layer", layer)):
        _checks.check_int32("resolve_reference", name, value)  # before the casts below (a cast wraps)
    lo, count = _checks.check_stream_range("resolve_reference", selection, stream_begin, stream_count)
    hi = lo + count
    num_layers = host_pool.shape[0]
    stream_shape = selection.shape[:-1]
    k = selection.shape[-1]
    B = slot_record.shape[-1]
    R = host_pool.shape[1 + len(stream_shape)]
    rec = host_pool.shape[2 + len(stream_shape) :]
    n = math.prod(stream_shape)
    layer = jnp.asarray(layer, jnp.int32)
    layer_ok = (layer >= 0) & (layer < num_layers)
    at = jnp.clip(layer, 0, num_layers - 1)

    # The range's streams only (static slices of the flattened stream axis): the others are
    # neither read nor written, and their result rows stay those of padding. Every stream: the
    # whole arrays, as without a range.
    every = (lo, hi) == (0, n)
    mine = (lambda x: x) if every else (lambda x: x[lo:hi])
    flat_sel = mine(selection.reshape(n, k))
    flat_sealed = mine(jnp.asarray(sealed, jnp.int32).reshape(n))
    layer_rec = slot_record[at].reshape(n, B)
    layer_lru = lru[at].reshape(n, B)
    out = jax.vmap(_resolve_stream.resolve_stream, in_axes=(0, 0, 0, 0, None))(
        flat_sel, flat_sealed, mine(layer_rec), mine(layer_lru), R
    )

    hot_dtype, hot = hot.dtype, _bits.as_bits(hot)
    layer_hot = hot[at].reshape(n, B, *rec)
    new_hot = mine(layer_hot)
    if fetch:
        pool = mine(_bits.as_bits(jax.device_put(host_pool, jax.memory.Space.Device))[at].reshape(n, R, *rec))
        rows = jax.vmap(lambda p, s: p[jnp.clip(s, 0, R - 1)])(pool, flat_sel)
        new_hot = jax.vmap(lambda h, f, r: h.at[f].set(r, mode="drop"))(new_hot, out["fill_slot"], rows)

    def put(full, layer_rows, new_rows):
        new_layer = new_rows if every else layer_rows.at[lo:hi].set(new_rows)
        updated = full.at[at].set(new_layer.reshape(full.shape[1:]))
        return jnp.where(layer_ok, updated, full)

    def rows_of(new_rows, padding):
        if every:
            return new_rows
        return jnp.full((n, *new_rows.shape[1:]), padding, jnp.int32).at[lo:hi].set(new_rows)

    never = jnp.full((count, k), -1, jnp.int32)
    slots = rows_of(jnp.where(layer_ok, out["slots"], never), -1)
    miss_records = rows_of(jnp.where(layer_ok, out["miss_records"], never), -1)
    miss_slots = rows_of(jnp.where(layer_ok, out["miss_slots"], never), -1)
    misses = rows_of(jnp.where(layer_ok, out["misses"], 0), 0)
    invalid = rows_of(jnp.where(layer_ok, out["invalid"], jnp.sum(flat_sel != -1, axis=1, dtype=jnp.int32)), 0)
    malformed = rows_of(jnp.where(layer_ok, out["malformed"], 0), 0)
    return (
        slots.reshape(*stream_shape, k),
        miss_records.reshape(*stream_shape, k),
        miss_slots.reshape(*stream_shape, k),
        misses.reshape(stream_shape),
        invalid.reshape(stream_shape),
        malformed.reshape(stream_shape),
        _bits.from_bits(put(hot, layer_hot, new_hot), hot_dtype),
        put(slot_record, layer_rec, out["slot_record"]),
        put(lru, layer_lru, out["lru"]),
    )


def resolve_outputs(outs, checked: bool) -> tuple[ResolveResult, HotCache]:
    """(ResolveResult, HotCache) of RESOLVE's nine results, with the checkify checks of
    `checked`."""
    slots, miss_records, miss_slots, misses, invalid, malformed, hot, slot_record, lru = outs
    if checked:
        checkify.check(
            jnp.all(invalid == 0),
            "resolve: {n} selected ids were neither -1 nor in [0, min(sealed, R)); "
            "they were treated as padding",
            n=jnp.sum(invalid),
        )
        checkify.check(
            jnp.all(malformed == 0),
            "resolve: {n} streams hold a malformed cache state (lru not a permutation of [0, B), "
            "or slot_record outside [-1, R) or holding a record twice) and resolved nothing; "
            "rebuild the cache with init_hot_cache / reset_streams",
            n=jnp.sum(malformed),
        )
    result = ResolveResult(slots, miss_records, miss_slots, misses, invalid, malformed)
    return result, HotCache(hot=hot, slot_record=slot_record, lru=lru)

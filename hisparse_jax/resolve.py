"""RESOLVE: make the selected records resident in the hot buffer and return their slots."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from . import _checks, _ffi, _targets
from .cache import HotCache
from .reference import resolve_reference

Implementation = Literal["auto", "ffi", "reference"]
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
) -> tuple[ResolveResult, HotCache]:
    """Resolves one layer's selection for every stream (docs/contract.md).

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

    Returns:
      (ResolveResult, new HotCache). Under jit with the cache donated, the
      state is updated in place (the FFI call aliases it).
    """
    result, cache, _, _ = resolve_with(_targets.RESOLVE, cache, host_pool, selection, sealed, layer,
                                       implementation=implementation, fetch=fetch, launch=launch, checked=checked)
    return result, cache


def resolve_with(target: str, cache: HotCache, host_pool, selection, sealed, layer, *, implementation: str,
                 fetch: bool, launch: str, checked: bool, **attributes):
    """`resolve` through the FFI target `target` (RESOLVE or its prefetch variant, with its extra
    `attributes`): (ResolveResult, HotCache, the implementation that ran, the int32 layer)."""
    impl = _ffi.choose_implementation(implementation)
    _checks.check_resolve(cache, host_pool, selection, sealed, layer, need_host=impl == "ffi")
    if launch not in _LAUNCH:
        raise ValueError(f"launch must be 'auto', 'fused' or 'split', got {launch!r}")
    layer = jnp.asarray(layer, jnp.int32)
    if impl == "ffi":
        outs = resolve_call(target, cache, host_pool, selection, sealed, layer, fetch=fetch, launch=launch,
                            **attributes)
    else:
        outs = resolve_reference(
            cache.hot, cache.slot_record, cache.lru, host_pool, selection, sealed, layer, fetch=fetch
        )
    result, cache = resolve_outputs(outs, checked)
    return result, cache, impl, layer


def resolve_call(target: str, cache: HotCache, host_pool, selection, sealed, layer, *, fetch: bool,
                 launch: str, **attributes):
    """The FFI call of RESOLVE or its prefetch variant (`target`; extra `attributes`): its nine
    results, the state updated in place (aliased). Arguments already checked by `resolve`."""
    _ffi.require_ffi(jax.default_backend())
    k = selection.shape[-1]
    streams = selection.shape[:-1]
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
        **attributes,
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

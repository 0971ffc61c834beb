"""Prefetch: RESOLVE with its record copy overlapping the compute that comes before the read.

`resolve_prefetch` decides exactly as `resolve` does, but on a CUDA device it leaves the copy of
the missed records to a stream of its own; `join_prefetch` hands the hot buffer on once that copy
is done. Whatever the program computes between the two (and before `after`, the join's ordering
operand) overlaps the copy. A group of layers that shares one selection (DSA's `index_share`)
resolves all its layers at the anchor and joins each right before it reads: the copies of the
later layers overlap the earlier layers' attention and feed-forward.

Only timing changes: after the join, the hot buffer, the slots and the LRU state are RESOLVE's,
bit for bit (ffi/prefetch.h has the contract). On CPU, and with the pure-JAX reference, the copy
happens inside the resolve and the join only hands its operands on: the same program, the same
bits.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from . import targets
from ._dispatch import Implementation
from .cache import HotCache
from .resolve import ResolveResult, resolve_with


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PendingFetch:
    """A copy `resolve_prefetch` left in flight, until `join_prefetch`.

    Attributes:
      misses, miss_records, miss_slots: the resolve's miss plan ([*S], [*S, k], [*S, k] int32),
        which the copy reads; layer: the int32 layer scalar it reads.
      slot: static; the key that pairs the resolve with its join.
      in_flight: static; False where the copy already happened in the resolve (CPU, reference).
      hot: static; the shape and dtype of the hot buffer the copy writes, which the join's cache
        must have (the CUDA join also checks that it is the same buffer).
      layer_index: static; the layer as a Python int when resolve_prefetch got one (None when
        it was traced), which `join_prefetch(..., layer=)` checks at trace time.
    """

    misses: jax.Array
    miss_records: jax.Array
    miss_slots: jax.Array
    layer: jax.Array
    slot: int = dataclasses.field(metadata=dict(static=True))
    in_flight: bool = dataclasses.field(metadata=dict(static=True))
    hot: tuple = dataclasses.field(default=(), metadata=dict(static=True))
    layer_index: int | None = dataclasses.field(default=None, metadata=dict(static=True))


def resolve_prefetch(
    cache: HotCache,
    host_pool: jax.Array,
    selection: jax.Array,
    sealed: jax.Array,
    layer: jax.Array | int,
    *,
    slot: int,
    implementation: Implementation = "auto",
    fetch: bool = True,
    launch: Literal["auto", "fused", "split"] = "auto",
    checked: bool = False,
    stream_begin: int = 0,
    stream_count: int | None = None,
) -> tuple[ResolveResult, HotCache, PendingFetch]:
    """`resolve` (same arguments and results) with the record copy left in flight.

    Args:
      slot: a Python int >= 0, one per resolve of a program that may be in flight at once (a
        layer index does): the join of the same slot waits for this copy.
      stream_begin, stream_count: `resolve`'s stream range; the copy in flight is the range's
        misses only, made with every block the copy of the whole batch would get.
    Returns:
      (ResolveResult, HotCache, PendingFetch). The HotCache's `hot` rows of this call's misses
      are undefined until `join_prefetch(cache, pending, after)`; read `hot` only from the join's
      result (slot_record and lru are final at once).
    """
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < 2**31:
        raise ValueError(f"resolve_prefetch: slot must be a Python int in [0, 2^31) (one per layer of the "
                         f"program), got {slot!r}")
    layer_index = _static_int(layer)  # before resolve_with makes it an int32 array
    result, cache, impl, layer = resolve_with(targets.RESOLVE_PREFETCH, cache, host_pool, selection, sealed, layer,
                                              implementation=implementation, fetch=fetch, launch=launch,
                                              checked=checked, stream_begin=stream_begin,
                                              stream_count=stream_count, prefetch_slot=slot)
    pending = PendingFetch(result.misses, result.miss_records, result.miss_slots, layer, slot, impl == "ffi",
                           _hot_type(cache), layer_index)
    return result, cache, pending


def _static_int(x) -> int | None:
    """x as a Python int when its value is known now (a Python or NumPy int, a concrete scalar
    array), else None (a tracer)."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _hot_type(cache: HotCache) -> tuple:
    return (tuple(jax.typeof(cache.hot).shape), str(jax.typeof(cache.hot).dtype))


def join_prefetch(cache: HotCache, pending: PendingFetch, after, *, layer: int | None = None,
                  checked: bool = False) -> tuple[HotCache, jax.Array]:
    """(cache with the pending copy done, the resolve's misses [*S]).

    Args:
      pending: `resolve_prefetch`'s PendingFetch.
      after: any array (or pytree of arrays): the join runs once it is computed, so the copy
        overlaps everything computed before it. Never read.
      layer: the layer about to read the joined rows (optional): refused unless it is the layer
        `pending` copies into.
      checked: also check, inside a traced program, that the cache maps each of the pending
        copy's slots to the record copied into it (a checkify check: functionalize the caller
        with checkify.checkify); with concrete values this check always runs.

    Which cache and layer a PendingFetch belongs to is checked as far as it costs nothing in the
    compiled program: the hot buffer's shape and dtype (static), the layer when both are Python
    ints (static), and, when the values are concrete (eager calls), that this cache's slot map
    holds the copied records where the copy put them: another cache, or this one after another
    resolve of the layer, would read rows the copy never wrote. Inside a traced program the
    values are unknown at trace time; a check there costs a gather and a compare per step,
    hence `checked`. The CUDA join also compares the hot buffer itself with the one the copy
    writes (a pointer compare, free), which catches another cache of the same shape on a GPU.
    """
    if not isinstance(pending, PendingFetch):
        raise TypeError(f"join_prefetch: pending must be resolve_prefetch's PendingFetch, got "
                        f"{type(pending).__name__}")
    if pending.hot != _hot_type(cache):
        raise ValueError(f"join_prefetch: the pending copy writes a hot buffer of {pending.hot}, this cache's is "
                         f"{_hot_type(cache)}; join a PendingFetch into the cache its resolve_prefetch returned")
    _check_layer(pending, layer)
    _check_slot_map(cache, pending, checked)
    if not pending.in_flight:
        return cache, pending.misses
    leaves = jax.tree_util.tree_leaves(after)
    if not leaves:
        raise ValueError("join_prefetch: after must hold at least one array (what the copy should overlap)")
    # The first leaf orders the join: an operand the handler never reads (no copy, no slice).
    anchor = jnp.asarray(leaves[0])
    call = jax.ffi.ffi_call(
        targets.PREFETCH_JOIN,
        (jax.typeof(cache.hot), jax.ShapeDtypeStruct(pending.misses.shape, jnp.int32)),
        input_output_aliases={0: 0, 1: 1},  # hot and misses pass through in place
    )
    hot, misses = call(cache.hot, pending.misses, pending.miss_records, pending.miss_slots, pending.layer,
                       anchor, prefetch_slot=pending.slot)
    return dataclasses.replace(cache, hot=hot), misses


def _check_layer(pending: PendingFetch, layer) -> None:
    if layer is None:
        return
    mine = pending.layer_index if pending.layer_index is not None else _static_int(pending.layer)
    theirs = _static_int(layer)
    if mine is not None and theirs is not None and mine != theirs:
        raise ValueError(f"join_prefetch: the pending copy is layer {mine}'s, joined for layer {theirs}; join "
                         f"each layer's own PendingFetch (its resolve_prefetch's) before that layer reads")


def _slot_map_holds(cache: HotCache, pending: PendingFetch):
    """Whether cache.slot_record[layer] holds every record the pending copy wrote where it wrote
    it (misses j < misses[s]: slot_record[layer, s, miss_slots[s, j]] == miss_records[s, j])."""
    k = pending.miss_slots.shape[-1]
    at = jnp.clip(pending.layer, 0, cache.slot_record.shape[0] - 1)
    held = jnp.take_along_axis(cache.slot_record[at], jnp.maximum(pending.miss_slots, 0), axis=-1)
    copied = jnp.arange(k, dtype=jnp.int32) < pending.misses[..., None]
    return jnp.all(~copied | (held == pending.miss_records))


def _check_slot_map(cache: HotCache, pending: PendingFetch, checked: bool) -> None:
    leaves = (cache.slot_record, pending.miss_slots, pending.miss_records, pending.misses, pending.layer)
    message = ("join_prefetch: this cache does not hold the pending copy's records in the slots it copied them "
               "to: the PendingFetch belongs to another cache, or the layer was resolved again before its join; "
               "join each PendingFetch into the cache its resolve_prefetch returned, before resolving that "
               "layer again")
    if not any(isinstance(x, jax.core.Tracer) for x in leaves):
        if not bool(_slot_map_holds(cache, pending)):
            raise ValueError(message)
    elif checked:
        checkify.check(_slot_map_holds(cache, pending), message)

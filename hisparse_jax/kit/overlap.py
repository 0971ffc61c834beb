"""Overlap groups: a layer's RESOLVE and attention run group by group of streams, so that one
group's record copy (prefetch: on a stream of its own) overlaps the other groups' work, also in
layers that select their own records (index_share = 1). Config.overlap_groups = G.

Within one layer the step runs
    RESOLVE(group 0) ... RESOLVE(group G-1)              probes on the compute stream, each
                                                           forking its group's copy
    join 0, attention(group 0)                            copy 0 overlapped the later probes
    join 1 (after attention 0), attention(group 1)        copy 1 overlapped attention 0
    ...
while the projections, the indexer, top-k and the feed-forward stay whole-batch (weights read
once per step). Copy g >= 1 hides behind attention g - 1; copy 0 only behind the later groups'
probes and the query projection, so at most about (G - 1) / G of the miss IO hides.

No KV-sized state is split or copied:
- each group's RESOLVE is a RESOLVE over the whole batch's buffers (pool in pinned host memory,
  hot buffer, slot map and LRU updated in place) restricted to the group's streams by its
  stream range (ffi/resolve.h "Stream range": group g = streams [g b / G, (g + 1) b / G)). The
  other streams are neither read nor written, so every stream is resolved once per layer, by
  its own group's call, exactly as the whole-batch call resolves it. The range also sizes the
  launch: on CUDA a group's resolve grid covers its b / G streams only (no block probes another
  group's streams; with fewer streams than SMs a call still lasts about one block's time, so a
  layer's G calls cost about G such latencies), and its copy gets every block the whole
  batch's copy would (not 1 / G of them).
  (Before the range, each group's call held -1 for the other streams: every call probed and
  checked every stream, G times a whole-batch RESOLVE without IO, and the copy's grid, sized
  by the whole batch, gave the group's misses 1 / G of its blocks: BENCHMARKS.md "Overlap
  groups at the slice's shapes".)
- each group's attention reads the hot buffer viewed as [L * G, b / G, ...] (a reshape of the
  leading axes, a bitcast), its streams being layer l * G + g of the view: the layer index the
  sparse attention kernel and the gather already take.
(Folding the state itself into [L * G, b / G, ...] would need no stream range, but XLA copies
a loop-carried buffer that is reshaped and then updated in place, i.e. the hot buffer and the
pool every step.)

Exact: streams never depend on each other in RESOLVE (docs/contract.md), and a range call gives
its streams what the whole-batch call gives them (tests/test_resolve_range.py), so each stream's
slots, LRU order, misses and hot bytes are what the whole-batch RESOLVE gives it; attention runs per
request where it is batch invariant: the sparse attention kernel (GPU), and XLA:CPU's batched
dots. XLA's attention on a GPU need not be (an H200 run failed the bit-equality at G = 2 and 4
with it, passed with the kernel), so there the groups need the kernel and refuse otherwise. tests/models/test_overlap_decode.py checks every bit at
G = 1, 2, 4 (CPU) and G = 2 with the kernel (GPU).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..cache import HotCache
from ..kv_store import Located, RecordStore, await_located
from ..models import paging
from .attention import attend_records, attention_kernel_domain, uses_attention_kernel


def groups_of(config, store: RecordStore) -> int:
    """G for this store: config.overlap_groups in "hisparse" mode (the only mode with a copy to
    hide), else 1 (the whole-batch step)."""
    groups = getattr(config, "overlap_groups", 1)
    if store.mode != "hisparse" or groups == 1:
        return 1
    batch = store.sealed.shape[0]
    if store.sealed.ndim != 1 or batch % groups:
        raise ValueError(f"overlap_groups={groups} must divide the batch of {batch} streams (a stream shape of "
                         f"{tuple(store.sealed.shape)}); pick a divisor of the batch, or overlap_groups=1")
    if jax.default_backend() != "cpu" and not uses_attention_kernel(config, store.mode, store.sealed.ndim):
        # On an H200 the bit-equality tests failed at G = 2 and 4 with XLA's attention and passed
        # with the sparse attention kernel: XLA's batched dots on b / G requests need not give the
        # whole batch's bits on a GPU (the library picks its algorithm by shape); the kernel runs
        # per request (XLA:CPU's dots are batch invariant, tested).
        why = attention_kernel_domain(config, store.mode, store.sealed.ndim) or "attention_implementation='reference'"
        raise ValueError(f"overlap_groups={groups} on {jax.default_backend()} needs the sparse attention kernel "
                         f"(batch invariant) for the groups' attention, which cannot run here ({why}); XLA's "
                         "attention there is not batch invariant; use overlap_groups=1")
    return groups


def _rows(groups: int, batch: int, g: int) -> slice:
    n = batch // groups
    return slice(g * n, (g + 1) * n)


def locate(store: RecordStore, layer: int, selection, groups: int):
    """paging.locate per group: (one whole-batch Located per group, or the batch's one when G =
    1; store). Group g's RESOLVE resolves its streams alone (its stream range), under prefetch
    slot layer * G + g; its Located holds padding's -1 and 0 in the other streams' rows, which
    `attend` never reads. Every group's RESOLVE runs here, before any group reads."""
    if groups == 1:
        return paging.locate(store, layer, selection)
    batch = store.sealed.shape[0]
    located = []
    for g in range(groups):
        rows = _rows(groups, batch, g)
        where, store = paging.locate(store, layer, selection, slot=layer * groups + g,
                                     streams=(rows.start, rows.stop - rows.start))
        located.append(where)
    return tuple(located), store


def _group_view(store: RecordStore, groups: int, g: int) -> RecordStore:
    """Group g's streams of a "hisparse" store for reading: the hot buffer as [L * G, b / G, ...]
    (its layer l is view layer l * G + g; a bitcast) and its streams' sealed counts."""
    fold = lambda x: x.reshape(x.shape[0] * groups, x.shape[1] // groups, *x.shape[2:])
    cache = HotCache(hot=fold(store.cache.hot), slot_record=fold(store.cache.slot_record), lru=fold(store.cache.lru))
    return dataclasses.replace(store, sealed=store.sealed[_rows(groups, store.sealed.shape[0], g)], cache=cache)


def attend(config, store: RecordStore, layer: int, located, tail, pos, q, groups: int):
    """kit.attention.attend_records group by group: (latent [b, H, dc], misses [b], store).

    Group g's prefetch join is ordered after group g - 1's attention (its `after`), so the
    compute stream waits for copy g only once attention g - 1 is issued: the copy runs beside it.
    """
    if groups == 1:
        return attend_records(config, store, layer, located, tail, pos, q)
    latents, misses = [], []
    batch = store.sealed.shape[0]
    after = None
    for g in range(groups):
        rows = _rows(groups, batch, g)
        # Group 0's join waits for its open page (everything before the layer), as without groups.
        where, store = await_located(store, located[g], tail[rows] if after is None else after)
        mine = Located(where.index[rows], where.valid[rows], where.misses[rows])
        latent, m, _ = attend_records(config, _group_view(store, groups, g), layer * groups + g, mine,
                                      tail[rows], pos[rows], q[rows])
        latents.append(latent)
        misses.append(m)
        after = latent
    return jnp.concatenate(latents), jnp.concatenate(misses), store

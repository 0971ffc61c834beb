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
once per step). Copy g >= 1 hides behind attention g - 1; only copy 0 waits mostly exposed, so
at most (G - 1) / G of the miss IO hides (plus what the probes and the query projection cover).

No KV-sized state is split or copied: the store is *folded* for the step, its [L, b, ...] arrays
(host pool, hot buffer, slot map, LRU) seen as [L * G, b / G, ...], a reshape of the leading two
axes that XLA makes a bitcast (the pool stays in pinned host memory, S(5), every RESOLVE updates
the hot buffer in place). Layer `l` of group `g` is folded layer l * G + g: RESOLVE, its prefetch
join and the sparse attention kernel all take a layer index into a stacked buffer already, so
each group's call works on exactly its own b / G streams with no new kernel.

Exact: streams never depend on each other in RESOLVE (docs/contract.md), so each stream's
slots, LRU order, misses and hot bytes are what the whole-batch RESOLVE gives it; attention runs
per request (the sparse attention reference and kernel, and XLA's batched dots, are batch
invariant: tests/models/test_overlap_decode.py checks the bits at G = 1, 2, 4).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ..cache import HotCache
from ..kv_store import RecordStore
from ..models import paging
from .attention import attend_records


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
    return groups


def _fold_axes(x, groups: int):
    return x.reshape(x.shape[0] * groups, x.shape[1] // groups, *x.shape[2:])


def _unfold_axes(x, groups: int):
    return x.reshape(x.shape[0] // groups, x.shape[1] * groups, *x.shape[2:])


def fold(store: RecordStore, groups: int) -> RecordStore:
    """The store's per-layer arrays as [L * G, b / G, ...] (bitcasts); `sealed` stays [b]."""
    if groups == 1:
        return store
    f = lambda x: _fold_axes(x, groups)
    cache = HotCache(hot=f(store.cache.hot), slot_record=f(store.cache.slot_record), lru=f(store.cache.lru))
    return dataclasses.replace(store, host_pool=f(store.host_pool), cache=cache)


def unfold(store: RecordStore, groups: int) -> RecordStore:
    """`fold` undone: the store as the State holds it."""
    if groups == 1:
        return store
    f = lambda x: _unfold_axes(x, groups)
    cache = HotCache(hot=f(store.cache.hot), slot_record=f(store.cache.slot_record), lru=f(store.cache.lru))
    return dataclasses.replace(store, host_pool=f(store.host_pool), cache=cache)


def _rows(groups: int, batch: int, g: int) -> slice:
    n = batch // groups
    return slice(g * n, (g + 1) * n)


def _view(folded: RecordStore, groups: int, g: int) -> RecordStore:
    """Group g's store: the folded arrays (its streams are folded layer l * G + g) and its
    streams' sealed counts."""
    return dataclasses.replace(folded, sealed=folded.sealed[_rows(groups, folded.sealed.shape[0], g)])


def _merge(folded: RecordStore, view: RecordStore) -> RecordStore:
    """The folded store after a group's call updated `view` (its arrays are the folded ones)."""
    return dataclasses.replace(view, sealed=folded.sealed)


def locate(store: RecordStore, layer: int, selection, groups: int):
    """paging.locate for every group of a folded store: (one Located per group, or the whole
    batch's when G = 1; store). Every group's RESOLVE runs here, before any group reads."""
    if groups == 1:
        return paging.locate(store, layer, selection)
    located = []
    for g in range(groups):
        rows = _rows(groups, store.sealed.shape[0], g)
        where, view = paging.locate(_view(store, groups, g), layer * groups + g, selection[rows])
        store = _merge(store, view)
        located.append(where)
    return tuple(located), store


def attend(config, store: RecordStore, layer: int, located, tail, pos, q, groups: int):
    """kit.attention.attend_records group by group: (latent [b, H, dc], misses [b], store).

    Group g's prefetch join is ordered after group g - 1's attention (its `after`), so the
    compute stream waits for copy g only once attention g - 1 is issued: the copy runs beside it.
    """
    if groups == 1:
        return attend_records(config, store, layer, located, tail, pos, q)
    latents, misses = [], []
    batch = store.sealed.shape[0]
    after = None  # group 0: its own open page (everything before the layer), as without groups
    for g in range(groups):
        rows = _rows(groups, batch, g)
        latent, m, view = attend_records(config, _view(store, groups, g), layer * groups + g, located[g],
                                         tail[rows], pos[rows], q[rows], after=after)
        store = _merge(store, view)
        latents.append(latent)
        misses.append(m)
        after = latent
    return jnp.concatenate(latents), jnp.concatenate(misses), store

"""Paged KV bookkeeping every family shares: the open page, sealing, prefill pages, selection,
and attention over the selected records plus the open page.

Shapes: *S = stream dims (b, or b x kv_heads), P = page_size, W = record width, R = records per
stream, k = top_k. Stream-shaped arguments ([*S]) must already be broadcast to the stream shape.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from .. import kv_store
from ..kv_store import RecordStore
from ..topk import select_topk
from .layers import Part


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ForcedSelection:
    """One decode step's selections, fed to a model in place of its own top-k.

    Attributes:
      ids: [layers, *S, k] int32, ascending per stream, -1 padding (what select_topk returns)
        for each selecting layer of the family.
      enabled: bool scalar, a runtime value: True replaces the model's ids by `ids`. Being an
        input of the program, it keeps XLA from removing the indexer and top-k it overrides.
      skip_indexer: static; True does not compute the indexer at all (a diagnostic that shows,
        by difference, what the indexer costs).
    """

    ids: jax.Array
    enabled: jax.Array
    skip_indexer: bool = dataclasses.field(default=False, metadata=dict(static=True))


def tail_valid(positions: jax.Array, page_size: int) -> jax.Array:
    """[*S, P] bool: tail slots holding tokens of the open page once `positions` [*S] is written."""
    return jnp.arange(page_size, dtype=jnp.int32) <= (positions % page_size)[..., None]


def tail_write(tail: jax.Array, record: jax.Array, positions: jax.Array) -> jax.Array:
    """tail [*S, P, W] with record [*S, W] written at row positions % P ([*S] int32).

    One row per stream is written in place (a scatter): a select over the whole buffer would
    rewrite every row, which for a sliding-window ring of hundreds of tokens is a copy per step.
    """
    rows = tail.shape[-2]
    put = lambda t, r, i: t.at[i].set(r.astype(t.dtype))
    for _ in range(positions.ndim):
        put = jax.vmap(put)
    return put(tail, record, positions % rows)


def seal_full_pages(store: RecordStore, tails: Sequence[jax.Array], new_lengths: jax.Array,
                    misses: jax.Array) -> RecordStore:
    """Seals each stream's open page when it just filled up: `sealed` counts it, and in
    "hisparse" the pool gets it (device buffers already hold it: kv_store.write_open_page).

    Args:
      tails: the open page [*S, P, W] of each of the store's layers.
      new_lengths: [*S] int32 tokens per stream after this step; a page seals when
        new_lengths % P == 0 (page_size 1: every step).
      misses: this step's RESOLVE misses of the store's layers (any shape; unused outside "hisparse").
    """
    page_size = tails[0].shape[-2]
    count = (new_lengths % page_size == 0).astype(jnp.int32)
    if store.mode != "hisparse":
        return dataclasses.replace(store, sealed=store.sealed + count)
    records = jnp.stack(tails)[..., None, :, :]
    # The pool write updates the pool in place, and nothing orders it after this step's RESOLVE
    # calls, which read the pool (the tails do not depend on them): XLA would copy the whole pool
    # to keep their reads safe. A data dependency on RESOLVE's results (misses are never
    # negative) orders the write after every read, for one select over the new records.
    records = jnp.where(jnp.min(misses) >= 0, records, jnp.zeros((), records.dtype))
    return kv_store.write_sealed(store, records, count)


def prefill_pages(kv: jax.Array, lengths: jax.Array, page_size: int):
    """Splits prefill KV into sealed pages and the open page.

    Args:
      kv: [L, *S, T, W] per-token records; T a multiple of page_size.
      lengths: [*S] int32 valid tokens per stream.
    Returns:
      records [L, *S, T // P, P, W], count [*S] int32 (= lengths // P, the sealed pages),
      tails [L, *S, P, W] (tokens of page lengths // P, zeros past lengths).
    """
    *lead, T, W = kv.shape
    pages = kv.reshape(*lead, T // page_size, page_size, W)
    count = (lengths // page_size).astype(jnp.int32)
    open_page = jnp.minimum(count, T // page_size - 1)
    take = lambda p, i: p[i]
    for _ in range(lengths.ndim):
        take = jax.vmap(take)
    tail = jax.vmap(take, in_axes=(0, None))(pages, open_page)  # [L, *S, P, W]
    token = count[..., None] * page_size + jnp.arange(page_size, dtype=jnp.int32)
    keep = (token < lengths[..., None])[..., None]
    return pages, count, jnp.where(keep, tail, jnp.zeros((), kv.dtype))


def select(config, store: RecordStore, scores: Callable[[], jax.Array], forced: ForcedSelection | None,
           selector: int) -> jax.Array | None:
    """The one selection rule of every family: the records a selecting layer attends to.

    Args:
      scores: () -> [*S, R] float scores of every record id (the family's indexer); not called
        in "dense" mode.
      forced: per-step ids of a selection trace, or None. When given, the indexer and top-k still
        run at full cost and a runtime select replaces their ids by forced.ids[selector] (forced
        .enabled is a runtime value, so XLA cannot drop the indexer): benchmarks with realistic
        locality cost what a real step costs. With forced.skip_indexer, scores is never called
        and the ids are forced.ids[selector] outright.
      selector: index of this selecting layer among the family's selecting layers.
    Returns:
      [*S, k] int32 ids ascending, -1 padding at the end (top-k of the sealed records, ties to
      the lower id); None in "dense" mode (every sealed record, read in place).
    """
    return select_ids(store, lambda: select_topk(scores(), store.sealed, config.top_k,
                                                 implementation=config.implementation), forced, selector)


def select_ids(store: RecordStore, choose: Callable[[], jax.Array], forced: ForcedSelection | None,
               selector: int) -> jax.Array | None:
    """`select` for any selection rule: choose() -> [*S, k] int32 ids (ascending, -1 padding,
    every id < store.sealed), called as `select` calls its top-k (not in "dense" mode nor with
    forced.skip_indexer; replaced by forced ids at run time when forced)."""
    if store.mode == "dense":
        ids = None
    elif forced is not None and forced.skip_indexer:
        ids = forced.ids[selector]  # the diagnostic: neither the indexer nor top-k runs
    else:
        ids = choose()
        if forced is not None:
            ids = jnp.where(forced.enabled, forced.ids[selector], ids)
    return ids


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepOutput:
    """What one decode step of a family returns.

    Attributes:
      state: the new State (one token longer per stream).
      logits: [b, V] float32 of the next token.
      misses: [L, *streams] int32 records RESOLVE fetched per layer (zeros outside "hisparse").
      selected: with record_selection, [layers, *S, k] int32: the ids every selecting layer
        attended to (the model's top-k, or the forced ids); else None.
      index_misses: [groups, *S] int32 records of the indexer's own record kind RESOLVE fetched
        per selecting group (a kit indexer with a kit.RecordKind); else None.
      index_selected: with record_selection and a kit.RecordKind, [groups, *S, fetch] int32: the
        ids of the indexer's own records each group asked for (Indexer.fetch); else None.
    """

    state: object
    logits: jax.Array
    misses: jax.Array
    selected: jax.Array | None = None
    index_misses: jax.Array | None = None
    index_selected: jax.Array | None = None


def stack_selected(chosen: Sequence[jax.Array | None]) -> jax.Array:
    """The ids `select` returned for every selecting layer of one step, [layers, *S, k]."""
    if not chosen or any(ids is None for ids in chosen):
        raise ValueError('generate: record_selection needs a "hisparse" or "device" state; a "dense" state '
                         "attends to every record and selects none")
    return jnp.stack(chosen)


def locate(store: RecordStore, layer: int, selection: jax.Array | None, slot: int | None = None,
           streams: tuple[int, int] | None = None):
    """(kv_store.Located or None for "dense", store): RESOLVE in "hisparse". A layer group that
    shares one selection locates all its layers before any of them reads: every read then follows
    every RESOLVE that updates the hot buffer in place. `slot` and `streams`: kv_store.locate's
    prefetch slot and stream range."""
    if selection is None:
        return None, store
    return kv_store.locate(store, layer, selection, slot, streams)


def selected_parts(store: RecordStore, layer: int, located, tail: jax.Array, positions: jax.Array,
                   split: Callable[[jax.Array], tuple[jax.Array, jax.Array]], after=None):
    """The two blocks one layer attends to: the selected sealed records and the open page.

    Args:
      located: `locate`'s result for this layer (None: "dense").
      tail: [*S, P, W] this layer's open page, this step's token written; positions: [*S] int32.
      split: record tokens [..., W] -> (keys [..., d], values [..., dv]).
      after: what a prefetched copy's join is ordered after (default: the tail).
    Returns:
      ([records Part, tail Part], misses [*S] int32, store).
    """
    store = kv_store.write_open_page(store, layer, tail)
    # A prefetched copy is joined here, after the layer's own input (the tail holds this step's
    # token): the copy overlaps everything the step computed before this layer.
    located, store = kv_store.await_located(store, located, tail if after is None else after)
    records, valid = kv_store.gather(store, layer, located)
    *streams, k, P, W = records.shape
    records = records.reshape(*streams, k * P, W)
    valid = jnp.repeat(valid, P, axis=-1)
    tail = tail.astype(records.dtype)
    parts = [Part(*split(records), valid), Part(*split(tail), tail_valid(positions, P))]
    misses = located.misses if located is not None else jnp.zeros(store.sealed.shape, jnp.int32)
    return parts, misses, store

"""The kit model's prefill and decode step: MLA over a RecordStore, records selected by the
config's indexer (moved from models/dsa.py, which is now this model with the lightning indexer).

Each selecting group (index_share layers) runs its indexer once at its anchor layer: `write`
stores this step's token in the group's metadata, then `score` + the library's top-k (or the
indexer's own `select`) picks the records, which every layer of the group locates (RESOLVE in
"hisparse") before any of them reads. Each layer then attends to its selected records plus its
open page (kit.attention). Every indexer call goes through kit.checks, which checks what it
returns when the step is traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import kv_store
from ..models import layers, mla, moe, paging
from ..models.paging import ForcedSelection
from ..topk import select_topk
from . import checks, inputs, overlap
from .protocol import SCORE, Fetched, selection_rule
from .state import group_metadata, has_records, replace_metadata


def _selection(config, params, metadata, h, pos, store, forced, group: int):
    """The ids group `group` attends to ([b, k] int32; None in "dense" mode): the indexer's scores
    through the library's top-k, or its own select."""
    indexer = config.indexer
    if selection_rule(indexer) == SCORE:
        def choose():
            scores = checks.score(indexer, config, params, metadata, h, pos, store.sealed)
            return select_topk(scores, store.sealed, config.top_k, implementation=config.implementation)
    else:
        def choose():
            return checks.select(indexer, config, params, metadata, h, pos, store.sealed)
    return paging.select_ids(store, choose, forced, group)


def _fetched_selection(config, params, metadata, h, pos, store, forced, group: int, index_store, index_tail):
    """`_selection` of an indexer with a record kind: the records its `fetch` names located (RESOLVE on
    the index store in "hisparse", a read of its device buffer in "device") and gathered, then its
    select on them. Returns (ids or None, index_store, misses [b] of the index store, the fetched
    ids [b, fetch] or None where the indexer did not choose)."""
    indexer, out = config.indexer, {}

    def choose():
        wanted = checks.fetch(indexer, config, params, metadata, h, pos, index_store.sealed)
        with jax.named_scope("resolve_index_records"):
            where, located_store = kv_store.locate(index_store, group, wanted)
        records, valid = kv_store.gather(located_store, group, where)
        out.update(store=located_store, misses=where.misses, wanted=wanted)
        fetched = Fetched(ids=wanted, records=records, valid=valid, open_page=index_tail)
        return checks.select(indexer, config, params, metadata, h, pos, store.sealed, fetched=fetched)

    ids = paging.select_ids(store, choose, forced, group)
    # Not chosen ("dense", or a forced trace without the indexer): the index store is untouched.
    return ids, out.get("store", index_store), out.get("misses", jnp.zeros(pos.shape, jnp.int32)), out.get("wanted")


def _decode_layer(config, w, store, located, pos, x, tail, layer: int, groups: int):
    """One layer of one decode step, its records located: (x, tail, store, misses [b]).
    Attention runs per overlap group (kit.overlap; one group: the whole batch). Merged input
    projections (kit.inputs) run as one matmul here (the anchor's ran in decode_step)."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("mla_project"):
        w, _ = inputs.apply(w, None, h)
    with jax.named_scope("mla_project"):
        q = mla.query(config, w, h, pos)  # [b, H, dc + dr] f32
        tail = paging.tail_write(tail, mla.kv_record(config, w, h, pos), pos)
    with jax.named_scope("attention"):
        latent, misses, store = overlap.attend(config, store, layer, located, tail, pos, q, groups)  # [b, H, dc]
        x = x + mla.attention_out(config, w, latent)
    x = moe.add_feed_forward(config, w, x)
    return x, tail, store, misses


def decode_step(config, weights, state, tokens: jax.Array, forced: ForcedSelection | None = None,
                record_selection: bool = False) -> paging.StepOutput:
    """One token per stream (the family protocol's decode_step, hisparse_jax.models).

    Args:
      tokens: [b] int32, the token at position state.lengths.
      forced: a trace's ids [G, b, k] for this step (benchmarks), or None.
      record_selection: also return the ids each indexer group selected ([G, b, k]) and, with a
        record kind, the ids of its own records each group fetched ([G, b, fetch]).
    Returns:
      StepOutput(state, logits [b, V] float32, misses [L, b] int32: records RESOLVE fetched per
      layer, zeros outside "hisparse", selected).
    """
    c, indexer, pos = config, config.indexer, state.lengths
    store, tails = state.store, list(state.tail)
    records = has_records(state)
    index_store = state.index_store if records else None
    index_tails, index_misses, index_chosen = (list(state.index_tail) if records else None), [], []
    # Overlap groups (hisparse with prefetch): each layer's RESOLVE and attention run per group
    # of streams, one group's copy beside another's work (kit.overlap).
    groups = overlap.groups_of(c, store)
    metadata = [group_metadata(state, g) for g in range(c.groups)]
    b = pos.shape[0]
    written = jnp.ones((b, 1), bool)
    with jax.named_scope("embed"):
        x = layers.embed(weights.embed, tokens)
    misses, chosen = [], []
    for g in range(c.groups):
        params, anchor = weights.indexers[g], weights.layers[g * c.index_share]
        with jax.named_scope("indexer"):
            h = layers.rms_norm(x, anchor.attn_norm, c.norm_eps)
        with jax.named_scope("mla_project"):
            # the anchor's merged matmul: its own projections and its indexer's, of the same h
            anchor, params = inputs.apply(anchor, params, h)
        with jax.named_scope("indexer"):
            # The token is written before the group selects, so a step's scores see the whole
            # sealed prefix (the write orders itself before the read: an in-place update).
            metadata[g] = checks.write(indexer, c, params, metadata[g], h[:, None], pos[:, None], written)
            if records:
                # The token's own record values too: its open record is read by this step's select.
                values = checks.record_values(indexer, c, params, h[:, None], pos[:, None])[:, 0]
                index_tails[g] = paging.tail_write(index_tails[g], values, pos)
                index_store = kv_store.write_open_page(index_store, g, index_tails[g])
                selection, index_store, m, wanted = _fetched_selection(c, params, metadata[g], h, pos, store, forced,
                                                                       g, index_store, index_tails[g])
                index_misses.append(m)
                index_chosen.append(wanted)
            else:
                selection = _selection(c, params, metadata[g], h, pos, store, forced, g)
            chosen.append(selection)
        group = range(g * c.index_share, (g + 1) * c.index_share)
        located = []
        with jax.named_scope("attention"):
            for layer in group:  # the group's RESOLVE calls first: each read then follows them all
                where, store = overlap.locate(store, layer, selection, groups)
                located.append(where)
        for layer, where in zip(group, located):
            w = anchor if layer == group[0] else weights.layers[layer]
            x, tails[layer], store, m = _decode_layer(c, w, store, where, pos, x, tails[layer], layer, groups)
            misses.append(m)
    logits = layers.lm_head(weights, x, c.norm_eps)
    misses = jnp.stack(misses)
    with jax.named_scope("seal"):
        store = paging.seal_full_pages(store, tails, pos + 1, misses)
        extra = {}
        if records:
            index_misses = jnp.stack(index_misses)  # [G, b]
            extra = dict(index_store=paging.seal_full_pages(index_store, index_tails, pos + 1, index_misses),
                         index_tail=tuple(index_tails))
    state = replace_metadata(state, metadata, store=store, tail=tuple(tails), lengths=pos + 1, **extra)
    selected = paging.stack_selected(chosen) if record_selection else None
    # None where the indexer never fetched (a forced trace with skip_indexer): nothing to record.
    fetched_all = record_selection and records and all(w is not None for w in index_chosen)
    index_selected = jnp.stack(index_chosen) if fetched_all else None
    return paging.StepOutput(state, logits, misses, selected, index_misses if records else None, index_selected)


def _prefill_layer(config, w, positions, chunk, x):
    """One layer over the whole prompt: x [b, T, D] -> (x, records [b, T, W])."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    record = mla.kv_record(config, w, h, positions)

    def q_fn(q_pos):
        h_chunk = jax.lax.dynamic_slice_in_dim(h, q_pos[0], chunk, axis=1)
        return mla.query(config, w, h_chunk, q_pos[None, :])

    with jax.named_scope("attention"):
        latent = layers.causal_attention(q_fn, record, record[..., : config.kv_lora_rank], mla.scale(config), chunk)
        x = x + mla.attention_out(config, w, latent)
    x = moe.add_feed_forward(config, w, x)
    return x, record


def prefill(config, weights, state, prompts: jax.Array, lengths: jax.Array):
    """The protocol's prefill (hisparse_jax.models: prompts [b, T], lengths [b] -> (state, logits
    [b, V] of each prompt's last token)), dense and causal: each indexer group first writes every
    prompt token into its metadata, then its layers page their latent records into the store."""
    c, indexer = config, config.indexer
    # Merged decode weights apart again (slices, once per call): prefill's matmuls have every
    # prompt token for rows, and compute as with the checkpoint's layout.
    weights = inputs.split(c, weights)
    x, lengths, positions, chunk, keep = layers.embed_prompts(c, weights.embed, prompts, lengths)
    written = positions[:keep] < lengths[:, None]  # [b, keep]
    token_pos = jnp.broadcast_to(positions[:keep], written.shape)
    metadata = [group_metadata(state, g) for g in range(c.groups)]
    records, values = [], []
    for g in range(c.groups):
        with jax.named_scope("indexer"):
            h = layers.rms_norm(x, weights.layers[g * c.index_share].attn_norm, c.norm_eps)
            metadata[g] = checks.write(indexer, c, weights.indexers[g], metadata[g], h[:, :keep], token_pos, written)
            if has_records(state):
                values.append(checks.record_values(indexer, c, weights.indexers[g], h[:, :keep], token_pos))
        for i in range(c.index_share):
            x, record = _prefill_layer(c, weights.layers[g * c.index_share + i], positions, chunk, x)
            records.append(record[:, :keep])
    with jax.named_scope("write_sealed"):
        pages, count, tails = paging.prefill_pages(jnp.stack(records), lengths, c.page_size)
        store = kv_store.write_sealed(state.store, pages, count)
    extra = {} if not values else _prefill_index_records(state.index_store, jnp.stack(values), lengths)
    logits = layers.lm_head(weights, layers.last_token(x, lengths), c.norm_eps)
    return replace_metadata(state, metadata, store=store, tail=tuple(tails), lengths=lengths, **extra), logits


def _prefill_index_records(index_store, values, lengths):
    """The prompt's record-kind values [G, b, T, width] paged into the index store: its full
    records sealed, the rest its open records (State fields index_store, index_tail)."""
    page = index_store.host_pool.shape[-2] if index_store.mode == "hisparse" else index_store.device_kv[0].shape[-2]
    T = values.shape[2]
    padded = jnp.pad(values, ((0, 0), (0, 0), (0, -T % page), (0, 0)))
    with jax.named_scope("write_index_records"):
        pages, count, tails = paging.prefill_pages(padded, lengths, page)
        return dict(index_store=kv_store.write_sealed(index_store, pages, count), index_tail=tuple(tails))

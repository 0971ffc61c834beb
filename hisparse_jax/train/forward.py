"""The training forward over whole sequences: next-token loss and the indexer's KL, for any
protocol indexer (hisparse_jax.kit.Indexer; DSA's lightning indexer is one).

It runs the decode model's own pieces (the MLA query and record, the read-out and the
feed-forward branch of hisparse_jax.models.mla / moe) over every position of a [b, T] batch, with
attention in blocks of `chunk` queries, each block rematerialized in the backward pass so that
memory holds one block's scores at a time. The indexer enters through its `train_features`
(what it reads of the whole sequence, once per layer) and `train_scores`: the token-level
logits I [b, chunk, T] of a block's queries against every token.

Two phases, as DeepSeek trained DSA (DeepSeek-V3.2 report, section 2.1):

- dense (warm-up): every query attends to all of its causal prefix; the indexer learns the
  attention distribution: its target at query t is the attention of the layer's heads, summed
  over heads and L1-normalized over the sealed keys s < t, and its loss KL(target || softmax(I_t)).
- sparse: query t attends to the top-k sealed keys by the indexer's score I_t (the decode rule:
  hisparse_jax.topk.select_topk, ties to the lower id) plus itself (the open page of
  page_size 1); the indexer's KL is taken over the selected keys only.

The indexer's input is detached from the model (train_features reads stop_gradient(h)) and its
target is detached too, so the KL trains the indexer alone and the next-token loss trains the
rest. Each layer has its own indexer (index_share = 1) and page_size is 1. An indexer whose
train_scores returns None has nothing to learn: its KL is 0 and only dense phases train it. A
two-level indexer's train_scores (kit.TrainLevels) adds the KL of its page logits against the
attention summed per closed page, and training selects as its decode does: the top-k tokens of
the candidate pages (the best closed pages by the page logits, plus the query's own).
`measure=True` also returns the share of the dense attention mass the indexer's top-k captures
(the comparison of hisparse-bench indexers).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..kit import checks
from ..kit.protocol import Indexer, TrainLevels
from ..models import layers, mla, moe
from ..topk import select_topk

f32 = jnp.float32


def check_trainable(config) -> None:
    """The shapes this forward trains: one indexer per layer, one token per record, no fp8 keys."""
    for field, want in (("index_share", 1), ("page_size", 1), ("index_dtype", None)):
        if hasattr(config, field) and getattr(config, field) != want:
            raise ValueError(f"train: Config.{field}={getattr(config, field)!r}; training needs {field}={want}")


def _chunk_attention(config, q, keys, index, start, chunk: int, sparse: bool, measure: bool):
    """One block of `chunk` queries from position `start`.

    Args:
      q: [b, T, H, W] float32 absorbed queries; keys: [b, T, W] records in config.dtype.
      index: [b, C, T] float32 the indexer's logits of the block's queries (train_scores), or None.
    Returns:
      (latent [b, C, H, dc] float32, stats: float32 scalars, the KL summed over the block's
      queries and the count of queries with a target; with measure also the captured mass summed
      over the queries where the top-k drops keys, and their count).
    """
    b, T = keys.shape[:2]
    positions = start + jnp.arange(chunk, dtype=jnp.int32)  # [C]
    levels = index if isinstance(index, TrainLevels) else None
    if levels is not None:
        index = levels.fine
    key_pos = jnp.arange(T, dtype=jnp.int32)
    take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1)
    scores = jnp.einsum("bchw,btw->bhct", take(q).astype(config.dtype), keys, preferred_element_type=f32)
    scores = scores * mla.scale(config)
    sealed = key_pos[None, None, :] < positions[None, :, None]  # [1, C, T]: keys s < t
    chosen = None
    if index is not None and (sparse or measure):
        rows = jnp.broadcast_to(positions, (b, chunk)).reshape(-1)  # each query's sealed keys
        ranked = jax.lax.stop_gradient(index)
        if levels is not None:  # decode's two-level rule: the top-k tokens of the candidate pages
            allowed = candidate_tokens(config, levels, positions, T)
            ranked = jnp.where(allowed, ranked, -jnp.inf)
        ids = select_topk(ranked.reshape(b * chunk, T), rows, config.top_k, implementation=config.implementation)
        put = jnp.where(ids >= 0, ids, T)  # -1 padding goes to a dropped column
        chosen = jnp.zeros((b * chunk, T + 1), bool).at[jnp.arange(b * chunk)[:, None], put].set(True)
        chosen = chosen[:, :T].reshape(b, chunk, T)
        if levels is not None:  # fewer than top_k candidate tokens: the top-k took others, at -inf
            chosen &= allowed
    if sparse:
        if chosen is None:
            raise ValueError(f"{type(config.indexer).__name__}.train_scores: returned None, so sparse attention has no "
                             "scores to select keys by; define train_scores or train with dense attention only")
        target_keys = chosen
        attended = target_keys | (key_pos[None, None, :] == positions[None, :, None])
    else:
        target_keys = jnp.broadcast_to(sealed, (b, chunk, T))
        attended = key_pos[None, None, :] <= positions[None, :, None]
    scores = jnp.where(attended[:, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)  # [b, H, C, T]
    values = keys[..., : config.kv_lora_rank]
    latent = jnp.einsum("bhct,btv->bchv", probs.astype(config.dtype), values, preferred_element_type=f32)

    target = jnp.where(target_keys, jax.lax.stop_gradient(jnp.sum(probs, axis=1)), 0.0)
    mass = jnp.sum(target, axis=-1, keepdims=True)
    has_target = mass[..., 0] > 0  # query 0 has no sealed key
    target = target / jnp.where(mass > 0, mass, 1.0)
    if index is None:
        kl = jnp.zeros(has_target.shape, f32)
    else:
        log_q = jax.nn.log_softmax(jnp.where(target_keys, index, -jnp.inf), axis=-1)
        log_q = jnp.where(target_keys, log_q, 0.0)
        log_t = jnp.log(jnp.where(target > 0, target, 1.0))
        kl = jnp.sum(jnp.where(target > 0, target * (log_t - log_q), 0.0), axis=-1)  # [b, C]
        if levels is not None:
            kl = kl + _page_kl(levels, target, positions)
    stats = [jnp.sum(jnp.where(has_target, kl, 0.0)), jnp.sum(has_target.astype(f32))]
    if measure:  # the dense target's mass on the top-k, where the top-k leaves keys out
        drops = jnp.broadcast_to(positions > config.top_k, has_target.shape) & has_target
        captured = (jnp.sum(jnp.where(chosen, target, 0.0), axis=-1) if chosen is not None
                    else jnp.full_like(kl, jnp.nan))  # no scores: no top-k to measure
        stats += [jnp.sum(jnp.where(drops, captured, 0.0)), jnp.sum(drops.astype(f32))]
    return latent, tuple(stats)


def candidate_tokens(config, levels: TrainLevels, positions, T: int) -> jax.Array:
    """[b, C, T] bool: the tokens of each query's candidate pages, as decode picks them: the
    `candidates` closed pages (wholly before the query's own) best by the coarse logits (the
    library's top-k, ties to the lower page) and the query's own page."""
    coarse = jax.lax.stop_gradient(levels.coarse)  # [b, C, n]
    b, C, n = coarse.shape
    own = positions // levels.page  # [C]: the query's page; pages before it are closed
    top = min(levels.candidates, n)
    closed = jnp.broadcast_to(own, (b, C)).reshape(-1)
    ids = select_topk(coarse.reshape(b * C, n), closed, top, implementation=config.implementation)
    put = jnp.where(ids >= 0, ids, n)
    pages = jnp.zeros((b * C, n + 1), bool).at[jnp.arange(b * C)[:, None], put].set(True)[:, :n].reshape(b, C, n)
    pages |= jnp.arange(n)[None, None, :] == own[None, :, None]
    return jnp.take(pages, jnp.arange(T) // levels.page, axis=2)


def _page_kl(levels: TrainLevels, target, positions) -> jax.Array:
    """[b, C] KL(page target || softmax of the coarse logits over the closed pages): the page
    target is the token target (the head-summed attention, normalized) summed over each closed
    page and renormalized; 0 for a query with no closed page or no mass on one."""
    b, C, T = target.shape
    n, page = levels.coarse.shape[-1], levels.page
    mass = jnp.pad(target, ((0, 0), (0, 0), (0, n * page - T))).reshape(b, C, n, page).sum(axis=-1)
    closed = jnp.arange(n)[None, None, :] < (positions // page)[None, :, None]  # [1, C, n]
    mass = jnp.where(closed, mass, 0.0)
    total = jnp.sum(mass, axis=-1, keepdims=True)
    t = mass / jnp.where(total > 0, total, 1.0)
    log_q = jnp.where(closed, jax.nn.log_softmax(jnp.where(closed, levels.coarse, -jnp.inf), axis=-1), 0.0)
    log_t = jnp.log(jnp.where(t > 0, t, 1.0))
    return jnp.sum(jnp.where(t > 0, t * (log_t - log_q), 0.0), axis=-1)


def _layer(config, indexer: Indexer, w, params, x, positions, chunk: int, sparse: bool, measure: bool):
    """One layer over the batch: (x [b, T, D], stats summed over queries: see _chunk_attention)."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    keys = mla.kv_record(config, w, h, positions)  # [b, T, W]
    q = mla.query(config, w, h, positions)  # [b, T, H, W] float32
    detached = jax.lax.stop_gradient(h)  # the indexer trains on the KL alone
    # Per-token work (DSA's index keys and queries, page bounds) once per layer, outside the
    # blocks: computed and differentiated once, as before the protocol (the same bits for DSA).
    features = checks.train_features(indexer, config, params, detached, positions)

    @jax.checkpoint  # the backward pass recomputes a block's scores instead of keeping all of them
    def block(start):
        index = checks.train_scores(indexer, config, params, features, positions, start, chunk)
        return _chunk_attention(config, q, keys, index, start, chunk, sparse, measure)

    T = x.shape[1]
    latent, stats = jax.lax.map(block, jnp.arange(0, T, chunk, dtype=jnp.int32))
    latent = jnp.moveaxis(latent, 0, 1).reshape(x.shape[0], T, *latent.shape[3:])
    x = x + mla.attention_out(config, w, latent)
    x = x + moe.feed_forward(config, w, x)
    return x, tuple(jnp.sum(s) for s in stats)


def forward(config, weights, inputs: jax.Array, *, sparse: bool, chunk: int, measure: bool = False):
    """Logits [b, T, V] float32 of every position of inputs [b, T] int32, and the indexers' mean
    KL per layer [L]; T a multiple of chunk. sparse: attend to the indexer's top-k (config.top_k)
    and the query itself instead of the whole causal prefix. measure: also the share of the dense
    attention mass each layer's top-k captures [L] (over queries with more than top_k sealed
    keys; NaN where none has), returned as a third value."""
    T = inputs.shape[1]
    if T % chunk:
        raise ValueError(f"train: the sequence length {T} must be a multiple of the attention chunk {chunk}")
    indexer = config.indexer  # kit Configs carry it; dsa.Config's reads its index_* fields
    positions = jnp.arange(T, dtype=jnp.int32)
    x = layers.embed(weights.embed, inputs)
    kls, captured = [], []
    for w, params in zip(weights.layers, weights.indexers):
        x, stats = _layer(config, indexer, w, params, x, positions, chunk, sparse, measure)
        kls.append(stats[0] / jnp.maximum(stats[1], 1.0))
        if measure:
            captured.append(jnp.where(stats[3] > 0, stats[2] / jnp.maximum(stats[3], 1.0), jnp.nan))
    logits = layers.lm_head(weights, x, config.norm_eps)
    return (logits, jnp.stack(kls), jnp.stack(captured)) if measure else (logits, jnp.stack(kls))


def forward_loss(config, weights, tokens: jax.Array, *, sparse: bool, chunk: int, measure: bool = False):
    """Mean next-token cross-entropy (nats per token) plus the indexers' mean KL.

    Args:
      weights: the model's weights in config.dtype (dsa.Weights, or a kit family's).
      tokens: [b, T + 1] int32; positions 0..T-1 are read, 1..T predicted.
    Returns:
      (loss, dict(lm=cross-entropy, kl=[L] mean KL per layer, and with measure captured=[L])).
    """
    out = forward(config, weights, tokens[:, :-1], sparse=sparse, chunk=chunk, measure=measure)
    logits, kl = out[:2]
    targets = tokens[:, 1:]
    lm = jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0])
    parts = dict(lm=lm, kl=kl, **(dict(captured=out[2]) if measure else {}))
    return lm + jnp.mean(kl), parts

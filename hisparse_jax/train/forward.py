"""The DSA model's training forward over whole sequences: next-token loss and the indexer's KL.

It runs the decode model's own pieces (hisparse_jax.models.dsa: the MLA query and record, the
lightning indexer's keys and queries, the read-out and the feed-forward branch) over every
position of a [b, T] batch, with attention in blocks of `chunk` queries, each block
rematerialized in the backward pass so that memory holds one block's scores at a time.

Two phases, as DeepSeek trained DSA (DeepSeek-V3.2 report, section 2.1):

- dense (warm-up): every query attends to all of its causal prefix; the indexer learns the
  attention distribution: its target at query t is the attention of the layer's heads, summed
  over heads and L1-normalized over the sealed keys s < t, and its loss KL(target || softmax(I_t)).
- sparse: query t attends to the top-k sealed keys by the indexer's score I_t (the decode rule:
  hisparse_jax.topk.select_topk, ties to the lower id) plus itself (the open page of
  page_size 1); the indexer's KL is taken over the selected keys only.

The indexer's input is detached from the model (its keys and queries read stop_gradient(h)) and
its target is detached too, so the KL trains the indexer alone and the next-token loss trains
the rest. Each layer has its own indexer (index_share = 1) and page_size is 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..models import dsa, layers, mla, moe
from ..topk import select_topk

f32 = jnp.float32


def check_trainable(config: dsa.Config) -> None:
    """The shapes this forward trains: one indexer per layer, one token per record, no fp8 keys."""
    for field, ok, want in (("index_share", config.index_share == 1, "1"), ("page_size", config.page_size == 1, "1"),
                            ("index_dtype", config.index_dtype is None, "None")):
        if not ok:
            raise ValueError(f"train: Config.{field}={getattr(config, field)!r}; training needs {field}={want}")


def _chunk_attention(config: dsa.Config, q, keys, q_index, head, index_keys, start, chunk: int, sparse: bool):
    """One block of `chunk` queries from position `start`.

    Args:
      q: [b, T, H, W] float32 absorbed queries; keys: [b, T, W] records in config.dtype.
      q_index: [b, T, HI, dI], head: [b, T, HI] float32, index_keys: [b, T, dI] (detached).
    Returns:
      (latent [b, C, H, dc] float32, KL summed over the block's queries, queries with a target).
    """
    b, T = keys.shape[:2]
    positions = start + jnp.arange(chunk, dtype=jnp.int32)  # [C]
    key_pos = jnp.arange(T, dtype=jnp.int32)
    take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1)
    scores = jnp.einsum("bchw,btw->bhct", take(q).astype(config.dtype), keys, preferred_element_type=f32)
    scores = scores * mla.scale(config)
    index = jnp.einsum("bcjd,btd->bcjt", take(q_index), index_keys, preferred_element_type=f32)
    index = jnp.einsum("bcjt,bcj->bct", jax.nn.relu(index), take(head))  # I [b, C, T]
    sealed = key_pos[None, None, :] < positions[None, :, None]  # [1, C, T]: keys s < t
    if sparse:
        rows = jnp.broadcast_to(positions, (b, chunk)).reshape(-1)  # each query's sealed keys
        ids = select_topk(jax.lax.stop_gradient(index).reshape(b * chunk, T), rows, config.top_k,
                          implementation=config.implementation)
        put = jnp.where(ids >= 0, ids, T)  # -1 padding goes to a dropped column
        chosen = jnp.zeros((b * chunk, T + 1), bool).at[jnp.arange(b * chunk)[:, None], put].set(True)
        target_keys = chosen[:, :T].reshape(b, chunk, T)
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
    log_q = jax.nn.log_softmax(jnp.where(target_keys, index, -jnp.inf), axis=-1)
    log_q = jnp.where(target_keys, log_q, 0.0)
    log_t = jnp.log(jnp.where(target > 0, target, 1.0))
    kl = jnp.sum(jnp.where(target > 0, target * (log_t - log_q), 0.0), axis=-1)  # [b, C]
    return latent, jnp.sum(jnp.where(has_target, kl, 0.0)), jnp.sum(has_target.astype(f32))


def _layer(config: dsa.Config, w: dsa.LayerWeights, iw: dsa.IndexerWeights, x, positions, chunk: int, sparse: bool):
    """One layer over the batch: (x [b, T, D], KL summed over queries, queries with a target)."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    keys = mla.kv_record(config, w, h, positions)  # [b, T, W]
    q = mla.query(config, w, h, positions)  # [b, T, H, W] float32
    detached = jax.lax.stop_gradient(h)  # the indexer trains on the KL alone
    index_keys, _ = dsa.index_key(config, iw, detached, positions)
    q_index, head = dsa.index_query(config, iw, detached, positions)

    @jax.checkpoint  # the backward pass recomputes a block's scores instead of keeping all of them
    def block(start):
        return _chunk_attention(config, q, keys, q_index, head, index_keys, start, chunk, sparse)

    T = x.shape[1]
    latent, kl, count = jax.lax.map(block, jnp.arange(0, T, chunk, dtype=jnp.int32))
    latent = jnp.moveaxis(latent, 0, 1).reshape(x.shape[0], T, *latent.shape[3:])
    x = x + mla.attention_out(config, w, latent)
    x = x + moe.feed_forward(config, w, x)
    return x, jnp.sum(kl), jnp.sum(count)


def forward(config: dsa.Config, weights: dsa.Weights, inputs: jax.Array, *, sparse: bool, chunk: int):
    """Logits [b, T, V] float32 of every position of inputs [b, T] int32, and the indexers' mean
    KL per layer [L]; T a multiple of chunk. sparse: attend to the indexer's top-k (config.top_k)
    and the query itself instead of the whole causal prefix."""
    T = inputs.shape[1]
    if T % chunk:
        raise ValueError(f"train: the sequence length {T} must be a multiple of the attention chunk {chunk}")
    positions = jnp.arange(T, dtype=jnp.int32)
    x = layers.embed(weights.embed, inputs)
    kls = []
    for w, iw in zip(weights.layers, weights.indexers):
        x, kl, count = _layer(config, w, iw, x, positions, chunk, sparse)
        kls.append(kl / jnp.maximum(count, 1.0))
    return layers.lm_head(weights, x, config.norm_eps), jnp.stack(kls)


def forward_loss(config: dsa.Config, weights: dsa.Weights, tokens: jax.Array, *, sparse: bool, chunk: int):
    """Mean next-token cross-entropy (nats per token) plus the indexers' mean KL.

    Args:
      weights: dsa.Weights in config.dtype.
      tokens: [b, T + 1] int32; positions 0..T-1 are read, 1..T predicted.
    Returns:
      (loss, dict(lm=cross-entropy, kl=[L] mean KL per layer)).
    """
    logits, kl = forward(config, weights, tokens[:, :-1], sparse=sparse, chunk=chunk)
    targets = tokens[:, 1:]
    lm = jnp.mean(jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0])
    return lm + jnp.mean(kl), dict(lm=lm, kl=kl)

"""DeepSeek Sparse Attention (DSA) on MLA, decoding through a HiSparse RecordStore.

Attention is MLA in absorbed form: a token's KV record is its compressed latent
c [kv_lora_rank] followed by its shared rope key [qk_rope_dim] (576 values in
the realistic preset). Query heads score in the latent space,
  score[h, s] = (q_nope[h] W_UK[h]) . c[s] + q_rope[h] . k_rope[s],
and read out softmax @ c, then W_UV and W_O.

The lightning indexer (DESIGN.md section 6) scores past tokens,
  I[t, s] = sum_j w[t, j] * relu(q_I[t, j] . k_I[s]),   k_I[s] = LayerNorm(W_k x_s),
with one index key per token kept on device ([G, b, max_context, index_dim]).
Each step a layer attends to the top-k sealed records by I (ids in position
order, -1 padding) plus the open page in the tail. With page_size P > 1 a
record is a page and its score is the max of its tokens' scores.

Shared indexer (IndexShare): with index_share = n, layers form groups of n;
the first layer of a group (its anchor) computes the selection and the other
n - 1 reuse it. Every layer keeps and resolves its own KV. The layer loop is a
scan over groups around a scan over the layers of a group.

Modes: "hisparse" and "device" run the same program up to where records are
read (RESOLVE + hot slots vs the device copy) and agree bit for bit; "dense"
replaces the indexer's selection by every sealed id in position order, so
top_k == max_context // page_size reproduces it bit for bit.

Simplifications against DeepSeek-V3.2: a SwiGLU MLP instead of MoE, no q
low-rank projection, index keys stored in `dtype` (not fp8 + scale).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .. import kv_store, traces
from ..config import CacheConfig
from ..kv_store import RecordStore
from . import common

PRESETS = {
    "tiny": dict(
        vocab=256, d_model=64, n_layers=4, n_heads=4, qk_nope_dim=16, qk_rope_dim=8,
        v_head_dim=16, kv_lora_rank=32, d_ff=128, index_heads=4, index_dim=16,
        top_k=16, hot_slots=32, max_context=256, prefill_chunk=64, dtype="float32",
    ),
    "realistic": dict(
        vocab=32000, d_model=2048, n_layers=4, n_heads=16, qk_nope_dim=128, qk_rope_dim=64,
        v_head_dim=128, kv_lora_rank=512, d_ff=5632, index_heads=64, index_dim=128,
        top_k=2048, hot_slots=4096, max_context=32768, prefill_chunk=256, dtype="bfloat16",
    ),
}


@dataclasses.dataclass(frozen=True)
class Config(common.PresetMixin):
    """Static DSA model configuration (hashable: a static jit argument).

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: 4 layers, d_model 64, vocab 256, context 256, float32; "realistic", GPU benchmark
    shapes: MLA 512 + 64 records in bf16, 16 heads, k = 2048.

    Attributes:
      vocab, d_model, n_layers, d_ff: transformer sizes (SwiGLU MLP).
      n_heads: H query heads; qk_nope_dim / qk_rope_dim / v_head_dim per head.
      kv_lora_rank: dc, the latent width; record_width = dc + qk_rope_dim.
      index_heads, index_dim: lightning indexer heads and key width.
      top_k: k records selected per stream and step; hot_slots: B >= k.
      max_context: tokens per stream; page_size: tokens per record (DSA: 1).
      index_share: n layers per indexer group (1 = every layer selects).
      pool_records: records per stream in the store (None: max_context // P).
      prefill_chunk: queries per block of the dense prefill attention.
      dtype: weights, activations and records (float32 or bfloat16).
    """

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    kv_lora_rank: int
    d_ff: int
    index_heads: int
    index_dim: int
    top_k: int
    hot_slots: int
    max_context: int
    page_size: int = 1
    index_share: int = 1
    pool_records: int | None = None
    prefill_chunk: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: Any = "float32"

    PRESETS: ClassVar = PRESETS

    def __post_init__(self):
        common.check_model_fields(
            self, "n_heads", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "kv_lora_rank", "index_heads",
            "index_dim", "index_share",
        )
        common.require(self.qk_rope_dim % 2 == 0, self, "qk_rope_dim", f"must be even, got {self.qk_rope_dim}")
        common.require(
            self.n_layers % self.index_share == 0, self, "index_share",
            f"index_share={self.index_share} must divide n_layers={self.n_layers}",
        )
        common.check_record_layout(self, "kv_lora_rank", "page_size x (kv_lora_rank + qk_rope_dim)")

    @property
    def record_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def groups(self) -> int:
        """G: indexer groups (anchor layers)."""
        return self.n_layers // self.index_share

    @property
    def index_key_bytes(self) -> int:
        """Device bytes of indexer keys per token of a stream, all anchor layers
        (metadata that grows with context; stored in `dtype`, not fp8 as in DeepSeek)."""
        return self.groups * self.index_dim * self.dtype.itemsize

    def cache_config(self, batch: int) -> CacheConfig:
        return self.store_config(self.n_layers, (batch,))


# --------------------------------------------------------------------------- weights and state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """Per-layer weights stacked on a leading [L] axis."""

    attn_norm: jax.Array  # [L, D]
    w_q: jax.Array  # [L, D, H, qk_nope + qk_rope]
    w_kv: jax.Array  # [L, D, dc + qk_rope]
    kv_norm: jax.Array  # [L, dc]
    w_uk: jax.Array  # [L, H, qk_nope, dc]
    w_uv: jax.Array  # [L, H, dc, dv]
    w_o: jax.Array  # [L, H, dv, D]
    mlp_norm: jax.Array  # [L, D]
    w_gate: jax.Array  # [L, D, F]
    w_up: jax.Array  # [L, D, F]
    w_down: jax.Array  # [L, F, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class IndexerWeights:
    """Lightning indexer weights of the anchor layers, stacked on a leading [G] axis."""

    w_q: jax.Array  # [G, D, HI, dI]
    w_head: jax.Array  # [G, D, HI]
    w_k: jax.Array  # [G, D, dI]
    k_scale: jax.Array  # [G, dI]
    k_bias: jax.Array  # [G, dI]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    embed: jax.Array  # [V, D]
    layers: LayerWeights
    indexer: IndexerWeights
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams.

    Attributes:
      store: sealed records [L, b, R, P, W] (host pool + hot buffer, or device).
      tail: [L, b, P, W] the open page of every layer, on device.
      index_keys: [G, b, max_context, dI] indexer keys of every token, on device.
      lengths: [b] int32 tokens held per stream (the next token's position).
      trace: a traces.TraceState over [G, b, R] that steers the selection (benchmarks), or None.
    """

    store: RecordStore
    tail: jax.Array
    index_keys: jax.Array
    lengths: jax.Array
    trace: traces.TraceState | None = None


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal with 1/fan_in variance, norms at 1), on the default device."""
    c, dt = config, config.dtype
    L, G, D, H, F = c.n_layers, c.groups, c.d_model, c.n_heads, c.d_ff
    dc, dn, dr, dv = c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim
    HI, dI = c.index_heads, c.index_dim
    shapes = {
        "embed": ((c.vocab, D), D),
        "w_q": ((L, D, H, dn + dr), D),
        "w_kv": ((L, D, dc + dr), D),
        "w_uk": ((L, H, dn, dc), dn),
        "w_uv": ((L, H, dc, dv), dc),
        "w_o": ((L, H, dv, D), H * dv),
        "w_gate": ((L, D, F), D),
        "w_up": ((L, D, F), D),
        "w_down": ((L, F, D), F),
        "i_q": ((G, D, HI, dI), D),
        "i_head": ((G, D, HI), D),
        "i_k": ((G, D, dI), D),
        "unembed": ((D, c.vocab), D),
    }
    w = common.init_normal_host(seed, shapes, dt)
    ones = lambda *shape: jnp.asarray(np.ones(shape, dt))
    layers = LayerWeights(
        attn_norm=ones(L, D), w_q=w["w_q"], w_kv=w["w_kv"], kv_norm=ones(L, dc), w_uk=w["w_uk"],
        w_uv=w["w_uv"], w_o=w["w_o"], mlp_norm=ones(L, D), w_gate=w["w_gate"], w_up=w["w_up"],
        w_down=w["w_down"],
    )
    indexer = IndexerWeights(
        w_q=w["i_q"], w_head=w["i_head"], w_k=w["i_k"], k_scale=ones(G, dI), k_bias=jnp.asarray(np.zeros((G, dI), dt))
    )
    return Weights(w["embed"], layers, indexer, ones(D), w["unembed"])


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` streams; `mode` is "hisparse", "device" or "dense"."""
    L, G, P = config.n_layers, config.groups, config.page_size
    state = State(
        store=kv_store.init_store(mode, config.cache_config(batch), sharding),
        tail=jnp.zeros((L, batch, P, config.record_width), config.dtype),
        index_keys=jnp.zeros((G, batch, config.max_context, config.index_dim), config.dtype),
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return common.commit(state)


# --------------------------------------------------------------------------- MLA


def _query(config: Config, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [..., D] at positions (broadcast to h.shape[:-1]) -> absorbed q [..., H, dc + dr] float32."""
    q = jnp.einsum("...d,dhe->...he", h, w.w_q)
    q_nope, q_rope = q[..., : config.qk_nope_dim], q[..., config.qk_nope_dim :]
    q_rope = common.rope(q_rope, positions[..., None], config.rope_theta)
    q_latent = jnp.einsum("...hn,hnc->...hc", q_nope, w.w_uk, preferred_element_type=jnp.float32)
    return jnp.concatenate([q_latent, q_rope.astype(jnp.float32)], axis=-1)


def _kv_record(config: Config, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [..., D] -> record [..., dc + dr] in config.dtype: [rms-normed latent c, rope key]."""
    kv = jnp.einsum("...d,dw->...w", h, w.w_kv)
    latent = common.rms_norm(kv[..., : config.kv_lora_rank], w.kv_norm, config.norm_eps)
    k_rope = common.rope(kv[..., config.kv_lora_rank :], positions, config.rope_theta)
    return jnp.concatenate([latent, k_rope], axis=-1).astype(config.dtype)


def _attention_out(config: Config, w: LayerWeights, latent: jax.Array) -> jax.Array:
    """Attention read-out in latent space latent [..., H, dc] float32 -> [..., D]."""
    heads = jnp.einsum("...hc,hcv->...hv", latent.astype(config.dtype), w.w_uv)
    return jnp.einsum("...hv,hvd->...d", heads, w.w_o)


def _scale(config: Config) -> float:
    return 1.0 / math.sqrt(config.qk_nope_dim + config.qk_rope_dim)


# --------------------------------------------------------------------------- lightning indexer


def _index_key(config: Config, iw: IndexerWeights, h: jax.Array) -> jax.Array:
    """h [..., D] -> k_I [..., dI] = LayerNorm(W_k h)."""
    key = jnp.einsum("...d,de->...e", h, iw.w_k)
    return common.layer_norm(key, iw.k_scale, iw.k_bias, config.norm_eps)


def _index_scores(config: Config, iw: IndexerWeights, h: jax.Array, keys: jax.Array) -> jax.Array:
    """I[b, s] = sum_j w[b, j] relu(q_I[b, j] . k_I[b, s]); h [b, D], keys [b, T, dI] -> [b, T] f32."""
    f32 = jnp.float32
    q = jnp.einsum("bd,dje->bje", h, iw.w_q)
    head = jnp.einsum("bd,dj->bj", h, iw.w_head, preferred_element_type=f32) / math.sqrt(config.index_heads)
    dots = jnp.einsum("bje,bse->bjs", q, keys, preferred_element_type=f32) / math.sqrt(config.index_dim)
    return jnp.einsum("bjs,bj->bs", jax.nn.relu(dots), head)


def _select(config: Config, store: RecordStore, iw: IndexerWeights, keys: jax.Array, h: jax.Array,
            trace: traces.TraceState | None, group):
    """Anchor layer `group`'s selection [b, k] (dense: [b, max_context // P]) from h [b, D]."""
    if store.mode == "dense":
        return common.dense_selection(store.sealed, config.num_records)

    def indexer_scores():
        token_scores = _index_scores(config, iw, h, keys)  # [b, max_context]
        b = token_scores.shape[0]
        return jnp.max(token_scores.reshape(b, config.num_records, config.page_size), axis=-1)

    page_scores = traces.steer(indexer_scores, trace, group, store.sealed)
    return common.select_topk(page_scores, store.sealed, config.top_k)


def trace_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a traces.TraceState for this model:
    one trace layer per indexer group."""
    return config.groups, (batch,), config.num_records


# --------------------------------------------------------------------------- decode


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Carry:
    """Layer-loop carry: hidden [b, D], hot cache (hisparse only), tail, index keys."""

    x: jax.Array
    cache: Any
    tail: jax.Array
    index_keys: jax.Array


def _decode_layer(config, store, selection, pos, carry: _Carry, layer, w: LayerWeights):
    """One layer of one decode step; returns the new carry and this layer's misses [b]."""
    P, dc = config.page_size, config.kv_lora_rank
    h = common.rms_norm(carry.x, w.attn_norm, config.norm_eps)
    with jax.named_scope("mla_project"):
        q = _query(config, w, h, pos)  # [b, H, dc + dr] f32
        record = _kv_record(config, w, h, pos)  # [b, W]
        tail = common.tail_write(jax.lax.dynamic_index_in_dim(carry.tail, layer, keepdims=False), record, pos)
    with jax.named_scope("gather"):
        store = dataclasses.replace(store, cache=carry.cache)
        kv, valid, misses, store = common.gather_with_tail(
            store, layer, selection, tail, common.tail_valid(pos, P)
        )
    with jax.named_scope("attention"):
        latent = common.attend(q, kv, kv[..., :dc], valid, _scale(config))  # [b, H, dc]
        x = carry.x + _attention_out(config, w, latent)
    with jax.named_scope("mlp"):
        x = x + common.mlp(w, x, config.norm_eps)
    tails = jax.lax.dynamic_update_index_in_dim(carry.tail, tail, layer, 0)
    return dataclasses.replace(carry, x=x, cache=store.cache, tail=tails), misses


def _decode_group(config, store, trace, pos, carry: _Carry, group, layer_w: LayerWeights,
                  iw: IndexerWeights, with_selection: bool):
    """One indexer group: the anchor selects, then every layer of the group attends."""
    n = config.index_share
    with jax.named_scope("indexer"):
        h = common.rms_norm(carry.x, layer_w.attn_norm[0], config.norm_eps)
        b = pos.shape[0]
        keys = carry.index_keys.at[group, jnp.arange(b), pos].set(_index_key(config, iw, h))
        selection = _select(config, store, iw, keys[group], h, trace, group)
    carry = dataclasses.replace(carry, index_keys=keys)

    def layer_step(carry, xs):
        i, w = xs
        carry, misses = _decode_layer(config, store, selection, pos, carry, group * n + i, w)
        return carry, (misses, selection if with_selection else None)

    return jax.lax.scan(layer_step, carry, (jnp.arange(n, dtype=jnp.int32), layer_w))


def _decode(config: Config, weights: Weights, state: State, tokens: jax.Array, with_selection: bool):
    """decode_step plus the selection each layer attended, [L, b, k] (None unless with_selection)."""
    G, pos = config.groups, state.lengths
    trace = traces.advance(state.trace)
    with jax.named_scope("embed"):
        x = common.embed(weights.embed, tokens)
    carry = _Carry(x=x, cache=state.store.cache, tail=state.tail, index_keys=state.index_keys)

    def group_step(carry, xs):
        g, layer_w, iw = xs
        return _decode_group(config, state.store, trace, pos, carry, g, layer_w, iw, with_selection)

    xs = (jnp.arange(G, dtype=jnp.int32), common.stack_for_scan(weights.layers, G), weights.indexer)
    carry, (misses, selection) = jax.lax.scan(group_step, carry, xs)
    logits = common.lm_head(weights, carry.x, config.norm_eps)
    with jax.named_scope("seal"):
        store = dataclasses.replace(state.store, cache=carry.cache)
        store = common.seal_full_pages(store, carry.tail, pos + 1)
    state = State(store=store, tail=carry.tail, index_keys=carry.index_keys, lengths=pos + 1, trace=trace)
    per_layer = lambda a: a.reshape(config.n_layers, *a.shape[2:])  # [G, n, ...] -> [L, ...]
    return state, logits, per_layer(misses), None if selection is None else per_layer(selection)


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
    Returns:
      (state, logits [b, V] float32, misses [L, b] int32: records RESOLVE
      fetched per layer, zeros outside "hisparse").
    """
    state, logits, misses, _ = _decode(config, weights, state, tokens, with_selection=False)
    return state, logits, misses


def decode_step_with_selection(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """decode_step, plus the selection every layer attended: [L, b, k] int32
    ([L, b, max_context // P] in "dense" mode), for tests and trace collection."""
    return _decode(config, weights, state, tokens, with_selection=True)


# --------------------------------------------------------------------------- prefill


def _prefill_layer(config, positions, chunk, x, w: LayerWeights):
    """One layer over the whole prompt: x [b, T, D] -> (x, records [b, T, W])."""
    h = common.rms_norm(x, w.attn_norm, config.norm_eps)
    record = _kv_record(config, w, h, positions)

    def q_fn(q_pos):
        h_chunk = jax.lax.dynamic_slice_in_dim(h, q_pos[0], chunk, axis=1)
        return _query(config, w, h_chunk, q_pos[None, :])

    with jax.named_scope("attention"):
        latent = common.causal_attention(q_fn, record, record[..., : config.kv_lora_rank], _scale(config), chunk)
        x = x + _attention_out(config, w, latent)
    with jax.named_scope("mlp"):
        x = x + common.mlp(w, x, config.norm_eps)
    return x, record


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """Dense causal prefill of ragged prompts into a fresh state.

    Args:
      prompts: [b, T] int32, row i valid up to lengths[i]; T <= max_context.
      lengths: [b] int32 in [1, T].
    Returns:
      (state, logits [b, V] float32 of each prompt's last token).
    """
    x, lengths, positions, chunk, keep = common.embed_prompts(config, weights.embed, prompts, lengths)
    b, T_pad = x.shape[:2]

    def group_step(x, xs):
        layer_w, iw = xs
        with jax.named_scope("indexer"):
            keys = _index_key(config, iw, common.rms_norm(x, layer_w.attn_norm[0], config.norm_eps))
        x, records = jax.lax.scan(lambda x, w: _prefill_layer(config, positions, chunk, x, w), x, layer_w)
        return x, (records, keys)

    xs = (common.stack_for_scan(weights.layers, config.groups), weights.indexer)
    x, (records, keys) = jax.lax.scan(group_step, x, xs)
    records = records.reshape(config.n_layers, b, T_pad, config.record_width)[:, :, :keep]
    with jax.named_scope("write_sealed"):
        pages, count, tail = common.prefill_pages(records, lengths, config.page_size)
        store = kv_store.write_sealed(state.store, pages, count)
    written = (positions[:keep] < lengths[:, None])[None, :, :, None]
    keys = jnp.where(written, keys[:, :, :keep], jnp.zeros((), keys.dtype))
    index_keys = jax.lax.dynamic_update_slice(state.index_keys, keys, (0, 0, 0, 0))
    logits = common.lm_head(weights, common.last_token(x, lengths), config.norm_eps)
    return State(store=store, tail=tail, index_keys=index_keys, lengths=lengths, trace=state.trace), logits

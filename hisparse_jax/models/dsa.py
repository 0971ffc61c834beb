"""DeepSeek Sparse Attention (DSA) on MLA, decoding through a HiSparse RecordStore.

Attention is MLA in absorbed form: a token's KV record is its compressed latent c [kv_lora_rank]
followed by its shared rope key [qk_rope_dim] (576 values in the realistic preset). The query is
a direct projection of the layer input h, or with q_lora_rank = r > 0 MLA's low-rank path
(DeepSeek-V3, GLM-5): q = rms_norm(h W_QA [D, r]) W_QB [r, H, qk_nope + qk_rope]. Query heads
score in the latent space,
  score[h, s] = (q_nope[h] W_UK[h]) . c[s] + q_rope[h] . k_rope[s],
and read out softmax @ c, then W_UV and W_O.

The lightning indexer scores past tokens,
  I[t, s] = sum_j w[t, j] * relu(q_I[t, j] . k_I[s]),   k_I[s] = LayerNorm(W_k x_s),
with one index key per token kept on device (one [b, max_context, index_dim] buffer per indexer
group; fp8 e4m3 with a per-token scale when index_dtype="fp8", DeepSeek's 132 B per token). Each
step a layer attends to the top-k sealed records by I (ids in position order, -1 padding) plus
the open page in the tail. With page_size P > 1 a record is a page and its score is the max of
its tokens' scores.

Shared indexer (IndexShare): with index_share = n, layers form groups of n; the first layer of a
group (its anchor) selects and the other n - 1 reuse its selection. Every layer keeps and
resolves its own KV.

Modes: "hisparse" and "device" run the same program up to where records are read (RESOLVE + hot
slots vs the device copy) and agree bit for bit; "dense" attends to every sealed record in place,
so top_k == max_context // page_size reproduces it bit for bit.

The feed-forward branch is a dense SwiGLU MLP, or with experts > 0 a mixture of experts
(hisparse_jax.models.moe) in every layer.

Simplifications against DeepSeek-V3.2: the indexer's query is projected from the layer input h,
not from the query's low-rank latent; attention weights are in `dtype` (no fp8 attention).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import fp8, kv_store, layout, targets
from .._dispatch import IMPLEMENTATIONS, choose_implementation, require_handler
from ..config import CacheConfig
from ..indexer import index_scores
from ..kv_store import RecordStore
from ..sparse_attention import CHUNKS, HEAD_TILE, MAX_PAGE, MAX_TOP_K, STAGE, VALUE_WIDTH, WIDTH, sparse_attention
from . import shapes
from .family import Family
from .paging import ForcedSelection
from . import layers, mla, moe, paging
from .config import MAX_SIZE, ModelConfig, require
from .weights import init_normal, ones, split_layers

INDEX_DTYPES = (None, "fp8")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(ModelConfig):
    """Static DSA model configuration (hashable: a static jit argument). Shared fields: ModelConfig.

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: 4 layers, d_model 64, vocab 256, context 256, float32; "realistic", GPU benchmark
    shapes: MLA 512 + 64 records in bf16, 16 heads, k = 2048.

    Attributes:
      n_heads: H query heads; qk_nope_dim / qk_rope_dim / v_head_dim per head.
      kv_lora_rank: dc, the latent width; record_width = dc + qk_rope_dim.
      index_heads, index_dim: lightning indexer heads and key width.
      q_lora_rank: r, the query's low-rank latent width (0: a direct [D, H, qk_nope + qk_rope]
        query projection).
      index_share: n layers per indexer group (1 = every layer selects).
      index_dtype: None (index keys in `dtype`) or "fp8" (e4m3 keys with a float32 scale per token).
      index_rope_dim: trailing dims of the indexer's queries and keys rotated by the token's
        position (rope, as DeepSeek-V3.2's indexer does), so that the indexer can rank by
        distance as well as content; 0 (the default): no position in the indexer.
      indexer_implementation: the lightning indexer's kernel, "auto", "ffi" (the fused CUDA kernel)
        or "reference" (XLA). Kept apart from `implementation`: RESOLVE and top-k give the same
        bits in every implementation, the indexer's scores agree within rounding only, so a
        comparison of implementations fixes this one.
      attention_implementation: the decode attention over the selected records and the open
        page: "auto" (the sparse attention CUDA kernel, hisparse_jax.sparse_attention, on a CUDA
        backend when the layer is in its domain: bf16 records of 512 latent + 64 rope, n_heads a
        multiple of 64, one stream axis, k * page_size a multiple of 512; else XLA), "ffi" (the
        kernel; an error where it cannot run) or "reference" (XLA: a gather of the selected
        records, then layers.attend). The kernel reads each record in place by index (the hot
        buffer by slot, the device KV by record id) with a bf16 query; its bits are the same in
        every mode (hisparse == device == dense), but not XLA's: kept apart from `implementation`
        for the same reason as the indexer's.
    """

    n_heads: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    kv_lora_rank: int
    index_heads: int
    index_dim: int
    q_lora_rank: int = 0
    index_share: int = 1
    index_dtype: str | None = None
    index_rope_dim: int = 0
    indexer_implementation: str = "auto"
    attention_implementation: str = "auto"

    PRESETS = shapes.FAMILY_PRESETS["dsa"]  # named shapes live in models/shapes.py
    POSITIVE = ("n_heads", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "kv_lora_rank", "index_heads",
                "index_dim", "index_share")
    RECORD_FIELD = "kv_lora_rank"
    RECORD_SHAPE = "page_size x (kv_lora_rank + qk_rope_dim)"

    def check(self) -> None:
        r = self.q_lora_rank
        require(isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_SIZE, self, "q_lora_rank",
                f"must be an int in [0, 2^31) (0: a direct query projection), got {r!r}")
        require(self.qk_rope_dim % 2 == 0, self, "qk_rope_dim", f"must be even, got {self.qk_rope_dim}")
        require(self.num_layers % self.index_share == 0, self, "index_share",
                f"index_share={self.index_share} must divide num_layers={self.num_layers}")
        require(self.index_dtype in INDEX_DTYPES, self, "index_dtype",
                f"must be None (keys in dtype) or 'fp8', got {self.index_dtype!r}")
        require(self.indexer_implementation in IMPLEMENTATIONS, self, "indexer_implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.indexer_implementation!r}")
        require(self.attention_implementation in IMPLEMENTATIONS, self, "attention_implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.attention_implementation!r}")
        d = self.index_rope_dim
        require(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= self.index_dim and d % 2 == 0, self,
                "index_rope_dim", f"must be an even int in [0, index_dim={self.index_dim}], got {d!r}")
        require(self.index_dtype != "fp8" or self.index_dim % 16 == 0, self, "index_dim",
                f"fp8 index keys need index_dim a multiple of 16, got {self.index_dim}")

    @property
    def record_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def groups(self) -> int:
        """G: indexer groups (anchor layers)."""
        return self.num_layers // self.index_share

    @property
    def key_dtype(self):
        return jnp.float8_e4m3fn if self.index_dtype == "fp8" else self.dtype

    def cache_config(self, batch: int) -> CacheConfig:
        return self.store_config(self.num_layers, (batch,))


# --------------------------------------------------------------------------- weights and state

SELECTION_WEIGHTS = ("indexers",)  # weights.weight_bytes: the lightning indexers select records


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer's weights: the query projection is w_q (q_lora_rank = 0) or w_q_a, q_norm, w_q_b
    (the others None); the feed-forward branch is mlp (experts = 0) or moe (the other None)."""

    attn_norm: jax.Array  # [D]
    w_q: jax.Array | None  # [D, H, qk_nope + qk_rope]
    w_q_a: jax.Array | None  # [D, r]
    q_norm: jax.Array | None  # [r]
    w_q_b: jax.Array | None  # [r, H, qk_nope + qk_rope]
    w_kv: jax.Array  # [D, dc + qk_rope]
    kv_norm: jax.Array  # [dc]
    w_uk: jax.Array  # [H, qk_nope, dc]
    w_uv: jax.Array  # [H, dc, dv]
    w_o: jax.Array  # [H, dv, D]
    mlp: layers.MLPWeights | None
    moe: moe.MoEWeights | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class IndexerWeights:
    """One indexer group's lightning indexer."""

    w_q: jax.Array  # [D, HI, dI]
    w_head: jax.Array  # [D, HI]
    w_k: jax.Array  # [D, dI]
    k_scale: jax.Array  # [dI]
    k_bias: jax.Array  # [dI]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    embed: jax.Array  # [V, D]
    layers: tuple[LayerWeights, ...]  # L
    indexers: tuple[IndexerWeights, ...]  # G
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams.

    Attributes:
      store: sealed records of every layer (host pool + hot buffer, or device).
      tail: L arrays [b, P, W], the open page of each layer.
      index_keys: G arrays [b, max_context, dI], every token's index key per indexer group
        (fp8 e4m3 when index_dtype="fp8").
      lengths: [b] int32 tokens held per stream (the next token's position).
      index_scale: G arrays [b, max_context] float32 key scales (index_dtype="fp8"), else None.
    """

    store: RecordStore
    tail: tuple[jax.Array, ...] = layout.field(layout.OPEN_PAGE, batch_axis=0)
    index_keys: tuple[jax.Array, ...] = layout.field(layout.INDEXER_METADATA, batch_axis=0)
    lengths: jax.Array = layout.field(layout.COUNTERS, batch_axis=0)
    index_scale: tuple[jax.Array, ...] | None = layout.field(layout.INDEXER_METADATA, batch_axis=0, default=None)


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal with 1/fan_in variance, norms at 1), on the default device."""
    c, dt = config, config.dtype
    L, G, D, H, r = c.num_layers, c.groups, c.d_model, c.n_heads, c.q_lora_rank
    dc, dn, dr, dv = c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim
    HI, dI = c.index_heads, c.index_dim
    query = ({"w_q_a": ((L, D, r), D), "w_q_b": ((L, r, H, dn + dr), r)} if r else
             {"w_q": ((L, D, H, dn + dr), D)})
    specs = {
        "embed": ((c.vocab, D), D),
        **query,
        "w_kv": ((L, D, dc + dr), D),
        "w_uk": ((L, H, dn, dc), dn),
        "w_uv": ((L, H, dc, dv), dc),
        "w_o": ((L, H, dv, D), H * dv),
        **layers.mlp_specs(c, L),
        "i_q": ((G, D, HI, dI), D),
        "i_head": ((G, D, HI), D),
        "i_k": ((G, D, dI), D),
        "unembed": ((D, c.vocab), D),
    }
    w = init_normal(seed, specs, dt)
    attention = {n: w[n] for n in (*query, "w_kv", "w_uk", "w_uv", "w_o")}
    attention.update(attn_norm=ones((L, D), dt), kv_norm=ones((L, dc), dt))
    if r:
        attention.update(q_norm=ones((L, r), dt))
    absent = dict.fromkeys({"w_q", "w_q_a", "q_norm", "w_q_b"} - set(attention))
    feed_forward = moe.feed_forward_weights(c, seed, w)
    indexer = dict(w_q=w["i_q"], w_head=w["i_head"], w_k=w["i_k"], k_scale=ones((G, dI), dt),
                   k_bias=jnp.zeros((G, dI), dt))
    return Weights(
        embed=w["embed"],
        layers=tuple(LayerWeights(**a, **absent, **f) for a, f in zip(split_layers(attention, L, dict), feed_forward)),
        indexers=split_layers(indexer, G, IndexerWeights), final_norm=ones((D,), dt), unembed=w["unembed"],
    )


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` streams; `mode` is "hisparse", "device" or "dense"."""
    c = config
    fp8 = c.index_dtype == "fp8"
    state = State(
        store=kv_store.init_store(mode, c.cache_config(batch), sharding, c.implementation, c.prefetch),
        tail=tuple(jnp.zeros((batch, c.page_size, c.record_width), c.dtype) for _ in range(c.num_layers)),
        index_keys=tuple(jnp.zeros((batch, c.max_context, c.index_dim), c.key_dtype) for _ in range(c.groups)),
        lengths=jnp.zeros((batch,), jnp.int32),
        index_scale=tuple(jnp.zeros((batch, c.max_context), jnp.float32) for _ in range(c.groups)) if fp8 else None,
    )
    return layout.commit(state, sharding)


def selecting_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a selection trace for this model: one
    selecting layer per indexer group."""
    return config.groups, (batch,), config.num_records


def metadata_bytes_read(config: Config, context: int) -> int:
    """Device bytes one decode step reads per request besides weights and attended records: the
    index keys (and fp8 scales) of `context` tokens in every indexer group."""
    key = config.index_dim * jnp.dtype(config.key_dtype).itemsize + (4 if config.index_dtype == "fp8" else 0)
    return config.groups * context * key


# --------------------------------------------------------------------------- lightning indexer


def _index_rope(config: Config, x: jax.Array, positions) -> jax.Array:
    """Rope over the trailing index_rope_dim dims of x [..., dI] (x itself when 0)."""
    d = config.index_rope_dim
    if d == 0:
        return x
    if positions is None:
        raise ValueError("dsa: Config.index_rope_dim > 0 rotates index queries and keys by position; pass positions")
    return jnp.concatenate([x[..., :-d], layers.rope(x[..., -d:], positions, config.rope_theta)], axis=-1)


def index_key(config: Config, iw: IndexerWeights, h: jax.Array, positions=None):
    """h [..., D] -> (k_I [..., dI] in the key dtype, scale [...] float32 or None) = LayerNorm(W_k h),
    its last index_rope_dim dims rotated at `positions` (broadcast to h.shape[:-1])."""
    key = layers.layer_norm(layers.weight_einsum("...d,de->...e", h, iw.w_k), iw.k_scale, iw.k_bias, config.norm_eps)
    key = _index_rope(config, key, positions)
    if config.index_dtype == "fp8":
        return fp8.quantize_rows(key)  # one scale per token
    return key, None


def index_query(config: Config, iw: IndexerWeights, h: jax.Array, positions=None):
    """h [..., D] -> (q_I [..., HI, dI] in dtype, head weights [..., HI] float32 with 1/sqrt(HI dI) folded in);
    q_I's last index_rope_dim dims rotated at `positions` (broadcast to h.shape[:-1])."""
    q = layers.weight_einsum("...d,dje->...je", h, iw.w_q)
    q = _index_rope(config, q, None if positions is None else jnp.asarray(positions)[..., None])
    head = layers.weight_einsum("...d,dj->...j", h, iw.w_head, preferred_element_type=jnp.float32)
    return q, head / math.sqrt(config.index_heads * config.index_dim)


def record_scores(config: Config, iw: IndexerWeights, h: jax.Array, keys: jax.Array, scale, sealed: jax.Array,
                  positions=None):
    """Indexer scores of every record: [b, R] float32 (-inf past the sealed records).

    Args:
      h: [b, D] the anchor layer's normed input; keys: [b, T, dI] (scale [b, T] for fp8).
      sealed: [b] int32: only the sealed pages' tokens are scored.
      positions: [b] int32, the query token's position (read with index_rope_dim > 0).
    """
    q, head = index_query(config, iw, h, positions)
    tokens = index_scores(q, head, keys, sealed * config.page_size, key_scale=scale,
                          implementation=config.indexer_implementation)  # [b, T]
    b = tokens.shape[0]
    return jnp.max(tokens.reshape(b, config.num_records, config.page_size), axis=-1)


# --------------------------------------------------------------------------- decode


def _decode_layer(config: Config, w: LayerWeights, store, located, pos, x, tail, layer: int):
    """One layer of one decode step, its records located: (x, tail, store, misses [b])."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("mla_project"):
        q = mla.query(config, w, h, pos)  # [b, H, dc + dr] f32
        tail = paging.tail_write(tail, mla.kv_record(config, w, h, pos), pos)
    with jax.named_scope("attention"):
        latent, misses, store = _attend_records(config, store, layer, located, tail, pos, q)  # [b, H, dc]
        x = x + mla.attention_out(config, w, latent)
    x = moe.add_feed_forward(config, w, x)
    return x, tail, store, misses


def attention_kernel_domain(config: Config, mode: str, stream_axes: int = 1) -> str:
    """Why the sparse attention kernel cannot run this model's decode attention in `mode` ("" if
    it can). "dense" reads every record of the store: k = store_records."""
    P = config.page_size
    k = config.store_records if mode == "dense" else config.top_k
    if (config.kv_lora_rank, config.record_width) != (VALUE_WIDTH, WIDTH):
        return (f"records are {config.kv_lora_rank} latent + {config.qk_rope_dim} rope; the kernel reads "
                f"{VALUE_WIDTH} + {WIDTH - VALUE_WIDTH}")
    if config.dtype != np.dtype(jnp.bfloat16):
        return f"records are {config.dtype}; the kernel reads bfloat16"
    if config.n_heads % HEAD_TILE:
        return f"n_heads={config.n_heads} is not a multiple of {HEAD_TILE}"
    if stream_axes != 1:
        return f"streams have {stream_axes} axes; the kernel takes one batch axis"
    if P > MAX_PAGE or k > MAX_TOP_K or (k * P) % (CHUNKS * STAGE):
        return (f"k={k} records of page_size={P}: the kernel takes k <= {MAX_TOP_K}, P <= {MAX_PAGE}, "
                f"k * P a multiple of {CHUNKS * STAGE}")
    return ""


def uses_attention_kernel(config: Config, mode: str, stream_axes: int = 1) -> bool:
    """Whether the decode attention runs the sparse attention kernel (config.attention_implementation:
    "auto" where it can run, "reference" never); "ffi" where it cannot run raises why."""
    domain = attention_kernel_domain(config, mode, stream_axes)
    impl = choose_implementation("sparse_attention", config.attention_implementation, targets.SPARSE_ATTENTION, domain)
    if impl == "reference":
        return False
    require_handler("sparse_attention", targets.SPARSE_ATTENTION, domain)
    return True


def _attend_records(config: Config, store, layer: int, located, tail, pos, q):
    """One layer's attention over its selected records and its open page (tail, this step's token
    written): (latent [b, H, dc] float32, misses [b], store)."""
    if not uses_attention_kernel(config, store.mode, store.sealed.ndim):
        parts, misses, store = paging.selected_parts(store, layer, located, tail, pos, mla.split_record(config))
        return layers.attend(q, parts, mla.scale(config)), misses, store
    # What selected_parts does before its gather: the open page written through ("device",
    # "dense"), a prefetched copy joined; then the kernel reads the records where they live.
    store = kv_store.write_open_page(store, layer, tail)
    located, store = kv_store.await_located(store, located, tail)
    source, source_layer, index = kv_store.read_in_place(store, layer, located)
    latent = sparse_attention(
        q.astype(jnp.bfloat16), source, index, tail.astype(jnp.bfloat16), paging.tail_valid(pos, config.page_size),
        mla.scale(config), layer=0 if source_layer is None else source_layer, implementation="ffi")
    misses = located.misses if located is not None else jnp.zeros(store.sealed.shape, jnp.int32)
    return latent, misses, store


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array,
                forced: ForcedSelection | None = None, record_selection: bool = False) -> paging.StepOutput:
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
      forced: a trace's ids [G, b, k] for this step (benchmarks), or None.
      record_selection: also return the ids each indexer group selected ([G, b, k]).
    Returns:
      StepOutput(state, logits [b, V] float32, misses [L, b] int32: records RESOLVE fetched per
      layer, zeros outside "hisparse", selected).
    """
    c, pos = config, state.lengths
    store, tails = state.store, list(state.tail)
    keys, scales = list(state.index_keys), list(state.index_scale or [None] * c.groups)
    b = pos.shape[0]
    with jax.named_scope("embed"):
        x = layers.embed(weights.embed, tokens)
    misses, chosen = [], []
    for g in range(c.groups):
        iw = weights.indexers[g]
        with jax.named_scope("indexer"):
            h = layers.rms_norm(x, weights.layers[g * c.index_share].attn_norm, c.norm_eps)
            key, scale = index_key(c, iw, h, pos)
            keys[g] = keys[g].at[jnp.arange(b), pos].set(key)
            if scale is not None:
                scales[g] = scales[g].at[jnp.arange(b), pos].set(scale)
            scores = lambda: record_scores(c, iw, h, keys[g], scales[g], store.sealed, pos)
            selection = paging.select(c, store, scores, forced, g)
            chosen.append(selection)
        group = range(g * c.index_share, (g + 1) * c.index_share)
        located = []
        with jax.named_scope("attention"):
            for layer in group:  # the group's RESOLVE calls first: each read then follows them all
                where, store = paging.locate(store, layer, selection)
                located.append(where)
        for layer, where in zip(group, located):
            x, tails[layer], store, m = _decode_layer(c, weights.layers[layer], store, where, pos, x,
                                                      tails[layer], layer)
            misses.append(m)
    logits = layers.lm_head(weights, x, c.norm_eps)
    misses = jnp.stack(misses)
    with jax.named_scope("seal"):
        store = paging.seal_full_pages(store, tails, pos + 1, misses)
    state = State(store=store, tail=tuple(tails), index_keys=tuple(keys), lengths=pos + 1,
                  index_scale=None if state.index_scale is None else tuple(scales))
    return paging.StepOutput(state, logits, misses, paging.stack_selected(chosen) if record_selection else None)


# --------------------------------------------------------------------------- prefill


def _prefill_layer(config: Config, w: LayerWeights, positions, chunk, x):
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


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """The protocol's prefill (hisparse_jax.models: prompts [b, T], lengths [b] -> (state, logits
    [b, V] of each prompt's last token)), dense and causal: each indexer group first writes every
    prompt token's index key, then its layers page their latent records into the store."""
    c = config
    x, lengths, positions, chunk, keep = layers.embed_prompts(c, weights.embed, prompts, lengths)
    written = (positions[:keep] < lengths[:, None])  # [b, keep]
    records, keys, scales = [], list(state.index_keys), list(state.index_scale or [None] * c.groups)
    for g in range(c.groups):
        with jax.named_scope("indexer"):
            h = layers.rms_norm(x, weights.layers[g * c.index_share].attn_norm, c.norm_eps)
            key, scale = index_key(c, weights.indexers[g], h[:, :keep], positions[:keep])
            keys[g] = jax.lax.dynamic_update_slice(
                keys[g], jnp.where(written[..., None], key, jnp.zeros((), key.dtype)), (0, 0, 0))
            if scale is not None:
                scales[g] = jax.lax.dynamic_update_slice(scales[g], jnp.where(written, scale, 0.0), (0, 0))
        for i in range(c.index_share):
            x, record = _prefill_layer(c, weights.layers[g * c.index_share + i], positions, chunk, x)
            records.append(record[:, :keep])
    with jax.named_scope("write_sealed"):
        pages, count, tails = paging.prefill_pages(jnp.stack(records), lengths, c.page_size)
        store = kv_store.write_sealed(state.store, pages, count)
    logits = layers.lm_head(weights, layers.last_token(x, lengths), c.norm_eps)
    state = State(store=store, tail=tuple(tails), index_keys=tuple(keys), lengths=lengths,
                  index_scale=None if state.index_scale is None else tuple(scales))
    return state, logits


FAMILY = Family(name="dsa", Config=Config, init_weights=init_weights, init_state=init_state, prefill=prefill,
                decode_step=decode_step, selecting_layout=selecting_layout,
                metadata_bytes_read=metadata_bytes_read, selection_weights=SELECTION_WEIGHTS)

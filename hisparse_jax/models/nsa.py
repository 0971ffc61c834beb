"""Native Sparse Attention (NSA) on GQA, its selected branch decoding through a HiSparse RecordStore.

Every layer mixes three attention branches per query head, gated by sigmoid(W_gate h)
(DESIGN.md section 6; Yuan et al. 2025), all reading one set of rope'd keys and values:

- compressed: block i covers tokens [i d, i d + l) (l = cmp_block, d = cmp_stride); its key and
  value are a learned linear map of the block's l keys (values), one weight matrix per position
  in the block (so the map sees intra-block position), initialized to mean pooling. Compressed
  keys/values stay on device, `[L, b, kvh, Nc, 2hd]`, Nc = (max_context - l) / d + 1. A block
  is compressed once its last token is written, from the sliding-window ring.
- selected: records are selection blocks of l' = page_size tokens of one KV head. The
  compressed attention probabilities are spread evenly over the d-token chunks of each
  compressed block, summed per selection block and over the query heads of the GQA group
  (one selection per KV head: streams are (batch, kv_heads)). The initial block and the most
  recent sealed block are always selected, then the best-scoring sealed blocks up to top_k;
  the open block (the tail) is always attended, so top_k + 1 = the paper's top-n blocks
  (1 initial + 2 local: the latest sealed block and the open one). Sealed blocks go through
  the RecordStore: host pool + hot buffer ("hisparse") or HBM ("device"); "dense" attends to
  every sealed block.
- sliding window: the last `window` tokens, in a device ring `[L, b, kvh, w, 2hd]` (slot = position % w).

Prefill runs the same three branches for every prompt token (per-query selection), a chunk of
queries at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from .. import kv_store, traces
from ..config import CacheConfig
from ..kv_store import RecordStore
from . import common, gqa

PRESETS = {
    "tiny": dict(
        vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
        cmp_block=8, cmp_stride=4, page_size=16, top_k=3, hot_slots=6, window=32,
        max_context=256, prefill_chunk=64, dtype="float32",
    ),
    # NSA paper attention: 64 query heads in 4 GQA groups, l = 32, d = 16, l' = 64, n = 16, w = 512.
    "realistic": dict(
        vocab=32000, d_model=4096, n_layers=4, n_heads=64, n_kv_heads=4, head_dim=128, d_ff=11008,
        cmp_block=32, cmp_stride=16, page_size=64, top_k=15, hot_slots=32, window=512,
        max_context=32768, prefill_chunk=128, dtype="bfloat16",
    ),
}

_BRANCHES = 3  # gate order: compressed, selected, window


@dataclasses.dataclass(frozen=True)
class Config(gqa.GQAConfigMixin):
    """Static NSA model configuration (hashable: a static jit argument).

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: l=8, d=4, l'=16, top-n=4 (k=3), w=32, context 256 (16 blocks), float32;
    "realistic", GPU benchmark shapes: NSA paper attention (64 q / 4 kv heads of 128, l=32,
    d=16, l'=64, top-n=16, w=512) in bf16, context 32K.

    Attributes:
      vocab, d_model, n_layers, d_ff: transformer sizes (SwiGLU MLP).
      n_heads, n_kv_heads, head_dim: GQA attention; G = n_heads // n_kv_heads.
      cmp_block, cmp_stride: l and d of the compressed branch (d divides l and page_size).
      page_size: l', tokens per selection block = per record.
      top_k: sealed blocks selected per (request, KV head) and step (>= 2: the initial and the
        latest sealed block are forced in); with the open block, top_n = top_k + 1.
      hot_slots: B >= top_k; window: w, sliding-window tokens (>= cmp_block).
      max_context: tokens per stream; pool_records: records per stream (None: max_context // l').
      prefill_chunk: queries per block of the prefill attention.
      dtype: weights, activations, records and compressed keys (float32 or bfloat16).
    """

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    top_k: int
    hot_slots: int
    max_context: int
    cmp_block: int = 32
    cmp_stride: int = 16
    page_size: int = 64
    window: int = 512
    pool_records: int | None = None
    prefill_chunk: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: Any = "float32"

    PRESETS: ClassVar = PRESETS

    def __post_init__(self):
        common.check_model_fields(self, "n_heads", "n_kv_heads", "head_dim", "cmp_block", "cmp_stride", "window")
        gqa.check_heads(self)
        req = lambda ok, field, msg: common.require(ok, self, field, msg)
        l, d, P = self.cmp_block, self.cmp_stride, self.page_size
        req(l % d == 0, "cmp_stride", f"cmp_stride d={d} must divide cmp_block l={l}")
        req(P % d == 0, "cmp_stride",
            f"cmp_stride d={d} must divide page_size l'={P}: compressed scores map onto "
            "selection blocks by d-token chunks")
        req(l <= P, "cmp_block", f"cmp_block l={l} must be <= page_size l'={P}")
        req(self.window >= l, "window",
            f"window w={self.window} must be >= cmp_block l={l}: a block is compressed from the window ring")
        req(self.top_k >= 2, "top_k",
            f"top_k={self.top_k} must be >= 2: the initial and the latest sealed block are always selected")
        common.check_record_layout(self, "head_dim", "page_size x 2 x head_dim")

    @property
    def top_n(self) -> int:
        """Blocks attended by the selected branch: top_k sealed + the open block."""
        return self.top_k + 1

    @property
    def num_compressed(self) -> int:
        """Nc: compressed blocks of a full context, (max_context - l) // d + 1."""
        return _compressed_count(self, self.max_context)

    def cache_config(self, batch: int) -> CacheConfig:
        return self.store_config(self.n_layers, (batch, self.n_kv_heads))

    def device_bytes(self, batch: int, mode: str = "hisparse") -> dict[str, int]:
        """HBM held by the decode state of `batch` requests, by part (weights excluded).

        selected_kv: hot buffers + slot metadata ("hisparse") or every block ("device", "dense");
        compressed_kv: compressed keys and values (grow with context); window: the rings;
        tail: open selection blocks.
        """
        if mode not in kv_store.MODES:
            raise ValueError(f"mode must be one of {kv_store.MODES}, got {mode!r}")
        cache = self.cache_config(batch)
        token_bytes = self.n_layers * batch * self.n_kv_heads * self.record_width * self.dtype.itemsize
        parts = {
            "selected_kv": cache.device_bytes if mode == "hisparse" else cache.host_bytes,
            "compressed_kv": token_bytes * self.num_compressed,
            "window": token_bytes * self.window,
            "tail": token_bytes * self.page_size,
        }
        return {**parts, "total": sum(parts.values())}


def _compressed_count(config: Config, tokens):
    """Compressed blocks complete among `tokens` tokens (int or int32 array): max(0, (n - l) // d + 1)."""
    l, d = config.cmp_block, config.cmp_stride
    if isinstance(tokens, int):
        return max(0, (tokens - l) // d + 1)
    return jnp.where(tokens >= l, (tokens - l) // d + 1, 0)


# --------------------------------------------------------------------------- weights and state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """Per-layer weights stacked on a leading [L] axis (h = KV heads, g = query heads per KV head)."""

    attn_norm: jax.Array  # [L, D]
    w_q: jax.Array  # [L, D, h, g, hd]
    w_k: jax.Array  # [L, D, h, hd]
    w_v: jax.Array  # [L, D, h, hd]
    w_branch: jax.Array  # [L, D, h, g, 3] branch gate logits (compressed, selected, window)
    cmp_k: jax.Array  # [L, l, hd, hd] key compression, one matrix per position in the block
    cmp_v: jax.Array  # [L, l, hd, hd] value compression
    w_o: jax.Array  # [L, h, g, hd, D]
    mlp_norm: jax.Array  # [L, D]
    w_gate: jax.Array  # [L, D, F]
    w_up: jax.Array  # [L, D, F]
    w_down: jax.Array  # [L, F, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    embed: jax.Array  # [V, D]
    layers: LayerWeights
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams (streams = (b, kvh)).

    Attributes:
      store: sealed selection blocks [L, b, kvh, R, l', 2hd] in `mode`.
      tail: [L, b, kvh, l', 2hd] the open selection block of every layer, on device.
      window: [L, b, kvh, w, 2hd] ring of the last w tokens (slot = position % w), on device.
      compressed: [L, b, kvh, Nc, 2hd] compressed keys then values, zeros until complete, on device.
      lengths: [b] int32 tokens held per stream (the next token's position).
      trace: a traces.TraceState over [L, b, kvh, R] that steers the selection (benchmarks), or None.
    """

    store: RecordStore
    tail: jax.Array
    window: jax.Array
    compressed: jax.Array
    lengths: jax.Array
    trace: traces.TraceState | None = None


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal, 1/fan_in variance; norms at 1; compression near mean pooling)."""
    c, dt = config, config.dtype
    L, D, h, g, hd, F, l = c.n_layers, c.d_model, c.n_kv_heads, c.group_size, c.head_dim, c.d_ff, c.cmp_block
    specs = {
        "embed": ((c.vocab, D), D),
        "w_q": ((L, D, h, g, hd), D),
        "w_k": ((L, D, h, hd), D),
        "w_v": ((L, D, h, hd), D),
        "w_branch": ((L, D, h, g, _BRANCHES), D),
        "cmp_k": ((L, l, hd, hd), l * hd),
        "cmp_v": ((L, l, hd, hd), l * hd),
        "w_o": ((L, h, g, hd, D), c.n_heads * hd),
        "w_gate": ((L, D, F), D),
        "w_up": ((L, D, F), D),
        "w_down": ((L, F, D), F),
        "unembed": ((D, c.vocab), D),
    }
    w = common.init_normal(seed, specs, dt)
    mean_pool = (jnp.eye(hd, dtype=jnp.float32) / l).astype(dt)  # + noise: a learned map near mean pooling
    ones = jnp.ones((L, D), dt)
    layers = LayerWeights(
        attn_norm=ones, w_q=w["w_q"], w_k=w["w_k"], w_v=w["w_v"], w_branch=w["w_branch"],
        cmp_k=w["cmp_k"] + mean_pool, cmp_v=w["cmp_v"] + mean_pool, w_o=w["w_o"], mlp_norm=ones,
        w_gate=w["w_gate"], w_up=w["w_up"], w_down=w["w_down"],
    )
    return Weights(w["embed"], layers, jnp.ones((D,), dt), w["unembed"])


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` requests; `mode` is "hisparse", "device" or "dense"."""
    L, h, W, dt = config.n_layers, config.n_kv_heads, config.record_width, config.dtype
    buffer = lambda n: jnp.zeros((L, batch, h, n, W), dt)
    state = State(
        store=kv_store.init_store(mode, config.cache_config(batch), sharding),
        tail=buffer(config.page_size),
        window=buffer(config.window),
        compressed=buffer(config.num_compressed),
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return common.commit(state, sharding)


# --------------------------------------------------------------------------- branches


def _branch_gates(w: LayerWeights, h: jax.Array) -> jax.Array:
    """h [..., D] -> sigmoid gates [..., kvh, G, 3] float32."""
    return jax.nn.sigmoid(jnp.einsum("...d,dhgc->...hgc", h, w.w_branch, preferred_element_type=jnp.float32))


def compress(config: Config, w: LayerWeights, blocks: jax.Array) -> jax.Array:
    """blocks [..., l, 2hd] (l consecutive tokens) -> compressed [..., 2hd] in config.dtype."""
    hd = config.head_dim
    k = jnp.einsum("...jk,jke->...e", blocks[..., :hd], w.cmp_k)
    v = jnp.einsum("...jk,jke->...e", blocks[..., hd:], w.cmp_v)
    return jnp.concatenate([k, v], axis=-1).astype(config.dtype)


def masked_softmax(logits: jax.Array, valid: jax.Array) -> jax.Array:
    """float32 softmax over the last axis; a row with nothing valid is all zeros (no NaN).

    The compressed branch needs this: before the first l tokens no block is complete.
    """
    logits = jnp.where(valid, logits, -jnp.inf)
    top = jnp.max(logits, axis=-1, keepdims=True)
    weights = jnp.where(valid, jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def block_scores(config: Config, probs: jax.Array) -> jax.Array:
    """Compressed-attention probabilities [..., n] -> selection-block scores [..., n_blocks].

    Compressed block i covers the d-token chunks i .. i + l/d - 1; its probability is spread
    evenly over them, and a selection block (l'/d chunks) sums its chunks. n compressed blocks
    span n + l/d - 1 chunks, a whole number of selection blocks when n = (T - l) / d + 1 and
    l' divides T.
    """
    per_block = config.cmp_block // config.cmp_stride
    pad = [(0, 0)] * (probs.ndim - 1)
    chunks = sum(jnp.pad(probs, pad + [(i, per_block - 1 - i)]) for i in range(per_block)) / per_block
    per_page = config.page_size // config.cmp_stride
    return chunks.reshape(*chunks.shape[:-1], -1, per_page).sum(-1)


def forced_scores(scores: jax.Array, sealed: jax.Array) -> jax.Array:
    """scores [..., R] with the initial block and the latest sealed block (sealed [...] - 1) at +inf."""
    ids = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    forced = (ids == 0) | (ids == sealed[..., None] - 1)
    return jnp.where(forced, jnp.inf, scores)


# --------------------------------------------------------------------------- decode


def _compress_new_block(config: Config, w: LayerWeights, compressed, ring, pos):
    """Adds the compressed block that this step's token completed, if any.

    Args:
      compressed: [b, kvh, Nc, 2hd]; ring: [b, kvh, w, 2hd] holding this step's token; pos: [b].
    """
    l, d, Nc = config.cmp_block, config.cmp_stride, compressed.shape[2]
    n = pos + 1
    first = n - l  # position of the completed block's first token
    done = (first >= 0) & (first % d == 0)
    slots = (first[:, None] + jnp.arange(l)) % config.window  # [b, l]
    block = jnp.take_along_axis(ring, slots[:, None, :, None], axis=2)  # [b, kvh, l, 2hd]
    b, h = compressed.shape[:2]
    at = jnp.where(done, first // d, Nc)[:, None]  # Nc is out of range: dropped
    return compressed.at[jnp.arange(b)[:, None], jnp.arange(h)[None, :], at].set(
        compress(config, w, block), mode="drop"
    )


def _compressed_branch(config: Config, q, compressed, pos):
    """q [b, kvh, G, hd] -> (out [b, kvh, G, hd] f32, probs [b, kvh, G, Nc] f32)."""
    hd = config.head_dim
    keys, values = compressed[..., :hd], compressed[..., hd:]
    logits = jnp.einsum("bhgk,bhnk->bhgn", q, keys, preferred_element_type=jnp.float32) * gqa.scale(config)
    valid = jnp.arange(compressed.shape[2]) < _compressed_count(config, pos + 1)[:, None]  # [b, Nc]
    probs = masked_softmax(logits, valid[:, None, None, :])
    out = jnp.einsum("bhgn,bhnk->bhgk", probs, values.astype(jnp.float32))
    return out, probs


def _select(config: Config, store: RecordStore, probs, trace: traces.TraceState | None, layer) -> jax.Array:
    """Blocks the selected branch attends to: [b, kvh, k] ([b, kvh, R] in "dense" mode)."""
    if store.mode == "dense":
        return common.dense_selection(store.sealed, config.num_records)
    scores = traces.steer(lambda: block_scores(config, jnp.sum(probs, axis=2)), trace, layer, store.sealed)
    return common.select_topk(forced_scores(scores, store.sealed), store.sealed, config.top_k)


def trace_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a traces.TraceState for this model:
    every layer selects, per KV head."""
    return config.n_layers, (batch, config.n_kv_heads), config.num_records


def _decode_layer(config: Config, store: RecordStore, trace, pos, carry, layer, w: LayerWeights):
    """One layer of one decode step.

    Args:
      pos: [b] int32 position of this step's token.
      carry: (x [b, D], cache, tails, windows, compressed) with the [L, ...] buffers of State.
    Returns the new carry and (misses [b, kvh], selection [b, kvh, k']).
    """
    x, cache, tails, windows, compressed = carry
    hd, P = config.head_dim, config.page_size
    at = lambda a: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)
    pos_s = gqa.per_stream(pos, config.n_kv_heads)
    h = common.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("project"):
        q = gqa.query(h, w.w_q, pos, config.rope_theta)  # [b, kvh, G, hd]
        record = gqa.kv_record(h, w.w_k, w.w_v, pos, config.rope_theta, config.dtype)  # [b, kvh, 2hd]
        tail = common.tail_write(at(tails), record, pos_s)
        ring = common.tail_write(at(windows), record, pos_s)
    with jax.named_scope("compressed"):
        cmp = _compress_new_block(config, w, at(compressed), ring, pos)
        out_cmp, probs = _compressed_branch(config, q, cmp, pos)
    with jax.named_scope("selected"):
        selection = _select(config, store, probs, trace, layer)
        store = dataclasses.replace(store, cache=cache)
        kv, valid, misses, store = common.gather_with_tail(store, layer, selection, tail, common.tail_valid(pos_s, P))
        out_slc = common.attend(q, kv[..., :hd], kv[..., hd:], valid, gqa.scale(config))
    with jax.named_scope("window"):
        in_window = jnp.arange(config.window) <= pos_s[..., None]  # slot s holds position <= pos once pos >= s
        out_win = common.attend(q, ring[..., :hd], ring[..., hd:], in_window, gqa.scale(config))
    gates = _branch_gates(w, h)  # [b, kvh, G, 3]
    heads = gates[..., 0:1] * out_cmp + gates[..., 1:2] * out_slc + gates[..., 2:3] * out_win
    x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    with jax.named_scope("mlp"):
        x = x + common.mlp(w, x, config.norm_eps)
    put = lambda full, one: jax.lax.dynamic_update_index_in_dim(full, one, layer, 0)
    carry = (x, store.cache, put(tails, tail), put(windows, ring), put(compressed, cmp))
    return carry, (misses, selection)


def _decode(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """decode_step plus the blocks every layer selected, [L, b, kvh, k]."""
    pos = state.lengths
    trace = traces.advance(state.trace)
    with jax.named_scope("embed"):
        x = common.embed(weights.embed, tokens)

    def layer_step(carry, xs):
        layer, w = xs
        return _decode_layer(config, state.store, trace, pos, carry, layer, w)

    carry = (x, state.store.cache, state.tail, state.window, state.compressed)
    layers = jnp.arange(config.n_layers, dtype=jnp.int32)
    (x, cache, tails, windows, compressed), (misses, selections) = jax.lax.scan(
        layer_step, carry, (layers, weights.layers)
    )
    logits = common.lm_head(weights, x, config.norm_eps)
    with jax.named_scope("seal"):
        store = dataclasses.replace(state.store, cache=cache)
        store = common.seal_full_pages(store, tails, gqa.per_stream(pos + 1, config.n_kv_heads))
    return State(store, tails, windows, compressed, pos + 1, trace), logits, misses, selections


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
    Returns:
      (state, logits [b, V] float32, misses [L, b, kvh] int32: blocks RESOLVE fetched per layer
      and KV head, zeros outside "hisparse").
    """
    state, logits, misses, _ = _decode(config, weights, state, tokens)
    return state, logits, misses


def decode_step_with_selection(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """decode_step, plus the sealed blocks every layer selected: [L, b, kvh, k] int32
    ([L, b, kvh, max_context // l'] in "dense" mode), for tests and trace collection."""
    return _decode(config, weights, state, tokens)


# --------------------------------------------------------------------------- prefill


def _compress_prompt(config: Config, w: LayerWeights, records: jax.Array) -> jax.Array:
    """records [b, T, kvh, 2hd] -> every compressed block of the T tokens [b, kvh, (T - l) // d + 1, 2hd]."""
    l, d, T = config.cmp_block, config.cmp_stride, records.shape[1]
    n = _compressed_count(config, T)
    token = (jnp.arange(n) * d)[:, None] + jnp.arange(l)  # [n, l]
    blocks = jnp.moveaxis(records[:, token], 3, 1)  # [b, kvh, n, l, 2hd]
    return compress(config, w, blocks)


def _prefill_chunk(config: Config, mode: str, q, t, keys, values, compressed):
    """The three branches for queries q [b, C, kvh, G, hd] at positions t [C] over a prompt of T tokens.

    keys, values: [b, T, kvh, hd]; compressed: [b, kvh, n, 2hd]. Returns three [b, C, kvh, G, hd] f32.
    """
    hd, P, T = config.head_dim, config.page_size, keys.shape[1]
    f32, scale = jnp.float32, gqa.scale(config)
    # Compressed: block i is visible once its last token i d + l - 1 <= t.
    n = compressed.shape[2]
    logits = jnp.einsum("bchgk,bhnk->bhgcn", q, compressed[..., :hd], preferred_element_type=f32) * scale
    visible = jnp.arange(n) < _compressed_count(config, t + 1)[:, None]  # [C, n]
    probs = masked_softmax(logits, visible)
    out_cmp = jnp.einsum("bhgcn,bhnk->bchgk", probs, compressed[..., hd:].astype(f32))
    # Selected: per query, the blocks sealed before its own (t // P) ranked like decode, plus its own block.
    R, sealed = T // P, jnp.broadcast_to(t // P, (*probs.shape[:2], t.shape[0]))  # [b, kvh, C]
    if mode == "dense":
        chosen = jnp.arange(R) < sealed[..., None]
    else:
        scores = forced_scores(block_scores(config, jnp.sum(probs, axis=2)), sealed)
        short = max(config.top_k - R, 0)  # a prompt of fewer than k blocks: pad, never selected
        scores = jnp.pad(scores, [(0, 0)] * 3 + [(0, short)], constant_values=-jnp.inf)
        selection = common.select_topk(scores, sealed, config.top_k)  # [b, kvh, C, k]
        chosen = jnp.any(selection[..., None] == jnp.arange(R), axis=-2)  # [b, kvh, C, R]
    block = jnp.arange(T) // P
    own = block == (t // P)[:, None]  # [C, T]
    causal = jnp.arange(T) <= t[:, None]
    slc_mask = (chosen[..., block] | own) & causal  # [b, kvh, C, T]
    win_mask = causal & (jnp.arange(T) > t[:, None] - config.window)
    logits = jnp.einsum("bchgk,bshk->bhgcs", q, keys, preferred_element_type=f32) * scale
    attend = lambda mask: jnp.einsum(
        "bhgcs,bshk->bchgk", masked_softmax(logits, mask), values.astype(f32)
    )
    return out_cmp, attend(slc_mask[:, :, None]), attend(win_mask)


def _prefill_layer(config: Config, mode: str, positions, chunk, x, w: LayerWeights):
    """One layer over the whole prompt: x [b, T, D] -> (x, (records [b, T, kvh, 2hd], compressed))."""
    hd = config.head_dim
    h = common.rms_norm(x, w.attn_norm, config.norm_eps)
    records = gqa.kv_record(h, w.w_k, w.w_v, positions[None, :], config.rope_theta, config.dtype)
    compressed = _compress_prompt(config, w, records)

    def one_chunk(start):
        t = start + jnp.arange(chunk, dtype=jnp.int32)
        q = gqa.query(jax.lax.dynamic_slice_in_dim(h, start, chunk, axis=1), w.w_q, t[None, :], config.rope_theta)
        return _prefill_chunk(config, mode, q, t, records[..., :hd], records[..., hd:], compressed)

    T = x.shape[1]
    outs = jax.lax.map(one_chunk, jnp.arange(0, T, chunk, dtype=jnp.int32))  # 3 x [T/C, b, C, kvh, G, hd]
    out_cmp, out_slc, out_win = (jnp.moveaxis(o, 0, 1).reshape(x.shape[0], T, *o.shape[3:]) for o in outs)
    gates = _branch_gates(w, h)  # [b, T, kvh, G, 3]
    heads = gates[..., 0:1] * out_cmp + gates[..., 1:2] * out_slc + gates[..., 2:3] * out_win
    x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    x = x + common.mlp(w, x, config.norm_eps)
    return x, (records, compressed)


def _prompt_window(config: Config, records: jax.Array, lengths: jax.Array) -> jax.Array:
    """records [L, b, kvh, T, 2hd] -> the ring [L, b, kvh, w, 2hd] after lengths [b] tokens."""
    last = lengths - 1
    position = last[:, None] - jnp.mod(last[:, None] - jnp.arange(config.window), config.window)  # [b, w]
    ring = jnp.take_along_axis(records, jnp.clip(position, 0)[None, :, None, :, None], axis=3)
    return jnp.where((position >= 0)[None, :, None, :, None], ring, jnp.zeros((), records.dtype))


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """NSA prefill of ragged prompts into a fresh state (all three branches for every token).

    Args:
      prompts: [b, T] int32, row i valid up to lengths[i]; T <= max_context.
      lengths: [b] int32 in [1, T].
    Returns:
      (state, logits [b, V] float32 of each prompt's last token).
    """
    x, lengths, positions, chunk, keep = common.embed_prompts(config, weights.embed, prompts, lengths)
    layer = lambda x, w: _prefill_layer(config, state.store.mode, positions, chunk, x, w)
    x, (records, compressed) = jax.lax.scan(layer, x, weights.layers)
    records = jnp.swapaxes(records[:, :, :keep], 2, 3)  # [L, b, kvh, keep, 2hd]
    with jax.named_scope("write_sealed"):
        lengths_s = gqa.per_stream(lengths, config.n_kv_heads)
        pages, count, tails = common.prefill_pages(records, lengths_s, config.page_size)
        store = kv_store.write_sealed(state.store, pages, count)
    with jax.named_scope("compressed"):
        n = min(compressed.shape[3], config.num_compressed)
        done = jnp.arange(n) < _compressed_count(config, lengths)[:, None]  # [b, n]: complete in the prompt
        compressed = jnp.where(done[None, :, None, :, None], compressed[:, :, :, :n], jnp.zeros((), config.dtype))
        compressed = jax.lax.dynamic_update_slice(state.compressed, compressed, (0, 0, 0, 0, 0))
    window = _prompt_window(config, records, lengths)
    logits = common.lm_head(weights, common.last_token(x, lengths), config.norm_eps)
    return State(store, tails, window, compressed, lengths, state.trace), logits

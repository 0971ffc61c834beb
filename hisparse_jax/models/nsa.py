"""Native Sparse Attention (NSA) on GQA, its selected branch decoding through a HiSparse RecordStore.

Every layer mixes three attention branches per query head, gated by sigmoid(W_gate h)
(Yuan et al. 2025, "Native Sparse Attention"), all reading one set of rope'd keys and values:

- compressed: block i covers tokens [i d, i d + l) (l = cmp_block, d = cmp_stride); its key and
  value are a learned linear map of the block's l keys (values), one weight matrix per position
  in the block (so the map sees intra-block position), initialized to mean pooling. Compressed
  keys/values stay on device, one `[b, kvh, Nc, 2hd]` buffer per layer, Nc = (max_context - l) / d + 1. A block
  is compressed once its last token is written, from the sliding-window ring.
- selected: records are selection blocks of l' = page_size tokens of one KV head. The
  compressed attention probabilities are spread evenly over the d-token chunks of each
  compressed block, summed per selection block and over the query heads of the GQA group
  (one selection per KV head: streams are (batch, kv_heads)). The initial block and the most
  recent sealed block are always selected, then the best-scoring sealed blocks up to top_k;
  the open block (the tail) is always attended, so top_k + 1 = the paper's top-n blocks
  (1 initial + 2 local: the latest sealed block and the open one). Sealed blocks go through
  the RecordStore: host pool + hot buffer ("hisparse") or HBM ("device"); "dense" attends to
  every sealed block in place.
- sliding window: the last `window` tokens, in a device ring per layer, `[b, kvh, w, 2hd]`
  (slot = position % w).

Prefill runs the same three branches for every prompt token (per-query selection), a chunk of
queries at a time.

The feed-forward branch is a dense SwiGLU MLP, or with experts > 0 a mixture of experts
(hisparse_jax.models.moe) in every layer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .. import kv_store, layout
from ..kv_store import RecordStore
from ..topk import select_topk
from . import shapes
from .family import Family
from .paging import ForcedSelection
from . import gqa, layers, moe, paging
from .config import require
from .weights import init_normal, ones, split_layers

_BRANCHES = 3  # gate order: compressed, selected, window


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(gqa.GQAConfig):
    """Static NSA model configuration (hashable: a static jit argument). Shared fields: ModelConfig
    and GQAConfig.

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: l=8, d=4, l'=16, top-n=4 (k=3), w=32, context 256 (16 blocks), float32;
    "realistic", GPU benchmark shapes: NSA paper attention (64 q / 4 kv heads of 128, l=32,
    d=16, l'=64, top-n=16, w=512) in bf16, context 32K.

    Attributes:
      cmp_block, cmp_stride: l and d of the compressed branch (d divides l and page_size).
      page_size: l', tokens per selection block = per record.
      top_k: sealed blocks selected per (request, KV head) and step (>= 2: the initial and the
        latest sealed block are forced in); with the open block, top_n = top_k + 1.
      window: w, sliding-window tokens (>= cmp_block).
    """

    cmp_block: int = 32
    cmp_stride: int = 16
    page_size: int = 64
    window: int = 512

    PRESETS = shapes.FAMILY_PRESETS["nsa"]  # named shapes live in models/shapes.py
    POSITIVE = gqa.GQAConfig.POSITIVE + ("cmp_block", "cmp_stride", "window")

    def check(self) -> None:
        super().check()
        l, d, P = self.cmp_block, self.cmp_stride, self.page_size
        require(l % d == 0, self, "cmp_stride", f"cmp_stride d={d} must divide cmp_block l={l}")
        require(P % d == 0, self, "cmp_stride",
                f"cmp_stride d={d} must divide page_size l'={P}: compressed scores map onto selection "
                "blocks by d-token chunks")
        require(l <= P, self, "cmp_block", f"cmp_block l={l} must be <= page_size l'={P}")
        require(self.window >= l, self, "window",
                f"window w={self.window} must be >= cmp_block l={l}: a block is compressed from the window ring")
        require(self.top_k >= 2, self, "top_k",
                f"top_k={self.top_k} must be >= 2: the initial and the latest sealed block are always selected")

    @property
    def top_n(self) -> int:
        """Blocks attended by the selected branch: top_k sealed + the open block."""
        return self.top_k + 1

    @property
    def num_compressed(self) -> int:
        """Nc: compressed blocks of a full context, (max_context - l) // d + 1."""
        return _compressed_count(self, self.max_context)


def _compressed_count(config: Config, tokens):
    """Compressed blocks complete among `tokens` tokens (int or int32 array): max(0, (n - l) // d + 1)."""
    l, d = config.cmp_block, config.cmp_stride
    if isinstance(tokens, int):
        return max(0, (tokens - l) // d + 1)
    return jnp.where(tokens >= l, (tokens - l) // d + 1, 0)


# --------------------------------------------------------------------------- weights and state

# weights.weight_bytes: the compression maps make the keys whose attention scores the selection blocks.
SELECTION_WEIGHTS = ("cmp_k", "cmp_v")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer's weights (h = KV heads, g = query heads per KV head)."""

    attn_norm: jax.Array  # [D]
    w_in: jax.Array  # [D, h, (g + 2) hd + 3 g]: per KV head its g query heads, key, value, then the
    #                  g x 3 branch gate logits (compressed, selected, window) of its query heads
    cmp_k: jax.Array  # [l, hd, hd] key compression, one matrix per position in the block
    cmp_v: jax.Array  # [l, hd, hd] value compression
    w_o: jax.Array  # [h, g, hd, D]
    mlp: layers.MLPWeights | None  # the dense MLP (experts = 0), else None
    moe: moe.MoEWeights | None  # the mixture of experts (experts > 0), else None


Weights = layers.ModelWeights


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams (streams = (b, kvh)).

    Attributes:
      store: sealed selection blocks [b, kvh, R, l', 2hd] of every layer, in `mode`.
      tail: L arrays [b, kvh, l', 2hd], the open selection block of each layer.
      window: L arrays [b, kvh, w, 2hd], rings of the last w tokens (slot = position % w).
      compressed: L arrays [b, kvh, Nc, 2hd], compressed keys then values, zeros until complete.
      lengths: [b] int32 tokens held per stream (the next token's position).
    """

    store: RecordStore
    tail: tuple[jax.Array, ...] = layout.field(layout.OPEN_PAGE, batch_axis=0)
    window: tuple[jax.Array, ...] = layout.field(layout.KV_RECORDS, batch_axis=0)
    compressed: tuple[jax.Array, ...] = layout.field(layout.KV_RECORDS, batch_axis=0)
    lengths: jax.Array = layout.field(layout.COUNTERS, batch_axis=0)


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal, 1/fan_in variance; norms at 1; compression near mean pooling)."""
    c, dt = config, config.dtype
    L, D, g, hd, l = c.num_layers, c.d_model, c.group_size, c.head_dim, c.cmp_block
    specs = {
        "embed": ((c.vocab, D), D),
        **gqa.layer_specs(c, L, extra=g * _BRANCHES),
        "cmp_k": ((L, l, hd, hd), l * hd),
        "cmp_v": ((L, l, hd, hd), l * hd),
        "unembed": ((D, c.vocab), D),
    }
    w = init_normal(seed, specs, dt)
    mean_pool = (jnp.eye(hd, dtype=jnp.float32) / l).astype(dt)  # + noise: a learned map near mean pooling
    stacked = {n: w[n] for n in gqa.ATTENTION}
    stacked.update(cmp_k=w["cmp_k"] + mean_pool, cmp_v=w["cmp_v"] + mean_pool, attn_norm=ones((L, D), dt))
    feed_forward = moe.feed_forward_weights(c, seed, w)
    layer_weights = tuple(LayerWeights(**a, **f) for a, f in zip(split_layers(stacked, L, dict), feed_forward))
    return Weights(w["embed"], layer_weights, ones((D,), dt), w["unembed"])


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` requests; `mode` is "hisparse", "device" or "dense"."""
    c = config
    buffers = lambda n: tuple(jnp.zeros((batch, c.n_kv_heads, n, c.record_width), c.dtype) for _ in range(c.num_layers))
    state = State(
        store=kv_store.init_store(mode, c.cache_config(batch), sharding, c.implementation, c.prefetch),
        tail=buffers(c.page_size),
        window=buffers(c.window),
        compressed=buffers(c.num_compressed),
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return layout.commit(state, sharding)


def selecting_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a selection trace: every layer selects,
    per KV head."""
    return config.num_layers, (batch, config.n_kv_heads), config.num_records


def metadata_bytes_read(config: Config, context: int) -> int:
    """Device bytes one decode step reads per request besides weights and selected blocks: the
    compressed keys and values of `context` tokens and the sliding window, every layer."""
    tokens = _compressed_count(config, context) + config.window
    return config.num_layers * config.n_kv_heads * tokens * config.record_width * config.dtype.itemsize


# --------------------------------------------------------------------------- branches


def _branch_gates(logits: jax.Array) -> jax.Array:
    """The extra columns of the input projection [..., kvh, 3G] -> sigmoid gates [..., kvh, G, 3] float32."""
    return jax.nn.sigmoid(logits.reshape(*logits.shape[:-1], -1, _BRANCHES))


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
    first = pos + 1 - l  # position of the completed block's first token
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


def _decode_layer(config: Config, w: LayerWeights, store: RecordStore, forced, pos, x, buffers, layer: int):
    """One layer of one decode step.

    Args:
      pos: [b] int32 position of this step's token.
      buffers: (tail, window ring, compressed) of this layer.
    Returns (x, buffers, store, misses [b, kvh], the selected ids [b, kvh, k] or None).
    """
    tail, ring, cmp = buffers
    pos_s = gqa.per_stream(pos, config.n_kv_heads)
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("project"):
        q, record, gate_logits = gqa.project(config, h, w.w_in, pos)  # q [b, kvh, G, hd], record [b, kvh, 2hd]
        tail = paging.tail_write(tail, record, pos_s)
        ring = paging.tail_write(ring, record, pos_s)
    with jax.named_scope("compressed"):
        cmp = _compress_new_block(config, w, cmp, ring, pos)
        out_cmp, probs = _compressed_branch(config, q, cmp, pos)
    with jax.named_scope("selected"):
        scores = lambda: forced_scores(block_scores(config, jnp.sum(probs, axis=2)), store.sealed)
        selection = paging.select(config, store, scores, forced, layer)
        located, store = paging.locate(store, layer, selection)
        parts, misses, store = paging.selected_parts(store, layer, located, tail, pos_s, gqa.split(config))
        out_slc = layers.attend(q, parts, gqa.scale(config))
    with jax.named_scope("window"):
        in_window = jnp.arange(config.window) <= pos_s[..., None]  # slot s holds position <= pos once pos >= s
        out_win = layers.attend(q, [layers.Part(*gqa.split(config)(ring), in_window)], gqa.scale(config))
    gates = _branch_gates(gate_logits)  # [b, kvh, G, 3]
    heads = gates[..., 0:1] * out_cmp + gates[..., 1:2] * out_slc + gates[..., 2:3] * out_win
    x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    x = moe.add_feed_forward(config, w, x)
    return x, (tail, ring, cmp), store, misses, selection


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array,
                forced: ForcedSelection | None = None, record_selection: bool = False) -> paging.StepOutput:
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
      forced: a trace's ids [L, b, kvh, k] for this step (benchmarks), or None.
      record_selection: also return the ids each layer selected ([L, b, kvh, k]).
    Returns:
      StepOutput(state, logits [b, V] float32, misses [L, b, kvh] int32: blocks RESOLVE fetched
      per layer and KV head, zeros outside "hisparse", selected).
    """
    pos, store = state.lengths, state.store
    tails, windows, compressed = list(state.tail), list(state.window), list(state.compressed)
    with jax.named_scope("embed"):
        x = layers.embed(weights.embed, tokens)
    misses, chosen = [], []
    for layer, w in enumerate(weights.layers):
        buffers = (tails[layer], windows[layer], compressed[layer])
        x, buffers, store, m, selection = _decode_layer(config, w, store, forced, pos, x, buffers, layer)
        tails[layer], windows[layer], compressed[layer] = buffers
        misses.append(m)
        chosen.append(selection)
    logits = layers.lm_head(weights, x, config.norm_eps)
    misses = jnp.stack(misses)
    with jax.named_scope("seal"):
        store = paging.seal_full_pages(store, tails, gqa.per_stream(pos + 1, config.n_kv_heads), misses)
    state = State(store, tuple(tails), tuple(windows), tuple(compressed), pos + 1)
    return paging.StepOutput(state, logits, misses, paging.stack_selected(chosen) if record_selection else None)


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
        selection = select_topk(scores, sealed, config.top_k, implementation=config.implementation)  # [b, kvh, C, k]
        chosen = jnp.any(selection[..., None] == jnp.arange(R), axis=-2)  # [b, kvh, C, R]
    block = jnp.arange(T) // P
    own = block == (t // P)[:, None]  # [C, T]
    causal = jnp.arange(T) <= t[:, None]
    slc_mask = (chosen[..., block] | own) & causal  # [b, kvh, C, T]
    win_mask = causal & (jnp.arange(T) > t[:, None] - config.window)
    logits = jnp.einsum("bchgk,bshk->bhgcs", q, keys, preferred_element_type=f32) * scale
    attend = lambda mask: jnp.einsum("bhgcs,bshk->bchgk", masked_softmax(logits, mask), values.astype(f32))
    return out_cmp, attend(slc_mask[:, :, None]), attend(win_mask)


def _prefill_layer(config: Config, w: LayerWeights, mode: str, positions, chunk, x):
    """One layer over the whole prompt: x [b, T, D] -> (x, records [b, T, kvh, 2hd], compressed)."""
    hd = config.head_dim
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    q_all, records, gate_logits = gqa.project(config, h, w.w_in, positions[None, :])
    compressed = _compress_prompt(config, w, records)

    def one_chunk(start):
        t = start + jnp.arange(chunk, dtype=jnp.int32)
        q = jax.lax.dynamic_slice_in_dim(q_all, start, chunk, axis=1)
        return _prefill_chunk(config, mode, q, t, records[..., :hd], records[..., hd:], compressed)

    T = x.shape[1]
    outs = jax.lax.map(one_chunk, jnp.arange(0, T, chunk, dtype=jnp.int32))  # 3 x [T/C, b, C, kvh, G, hd]
    out_cmp, out_slc, out_win = (jnp.moveaxis(o, 0, 1).reshape(x.shape[0], T, *o.shape[3:]) for o in outs)
    gates = _branch_gates(gate_logits)  # [b, T, kvh, G, 3]
    heads = gates[..., 0:1] * out_cmp + gates[..., 1:2] * out_slc + gates[..., 2:3] * out_win
    x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    x = moe.add_feed_forward(config, w, x)
    return x, records, compressed


def _prompt_window(config: Config, records: jax.Array, lengths: jax.Array) -> jax.Array:
    """records [b, kvh, T, 2hd] -> the ring [b, kvh, w, 2hd] after lengths [b] tokens."""
    last = lengths - 1
    position = last[:, None] - jnp.mod(last[:, None] - jnp.arange(config.window), config.window)  # [b, w]
    ring = jnp.take_along_axis(records, jnp.clip(position, 0)[:, None, :, None], axis=2)
    return jnp.where((position >= 0)[:, None, :, None], ring, jnp.zeros((), records.dtype))


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """The protocol's prefill (hisparse_jax.models: prompts [b, T], lengths [b] -> (state, logits
    [b, V] of each prompt's last token)), with all three NSA branches for every token."""
    c = config
    x, lengths, positions, chunk, keep = layers.embed_prompts(c, weights.embed, prompts, lengths)
    records, compressed = [], []
    for layer, w in enumerate(weights.layers):
        x, rec, cmp = _prefill_layer(c, w, state.store.mode, positions, chunk, x)
        records.append(jnp.swapaxes(rec[:, :keep], 1, 2))  # [b, kvh, keep, 2hd]
        with jax.named_scope("compressed"):
            n = min(cmp.shape[2], c.num_compressed)
            done = jnp.arange(n) < _compressed_count(c, lengths)[:, None]  # [b, n]: complete in the prompt
            cmp = jnp.where(done[:, None, :, None], cmp[:, :, :n], jnp.zeros((), c.dtype))
            compressed.append(jax.lax.dynamic_update_slice(state.compressed[layer], cmp, (0, 0, 0, 0)))
    with jax.named_scope("write_sealed"):
        lengths_s = gqa.per_stream(lengths, c.n_kv_heads)
        pages, count, tails = paging.prefill_pages(jnp.stack(records), lengths_s, c.page_size)
        store = kv_store.write_sealed(state.store, pages, count)
    windows = tuple(_prompt_window(c, r, lengths) for r in records)
    logits = layers.lm_head(weights, layers.last_token(x, lengths), c.norm_eps)
    return State(store, tuple(tails), windows, tuple(compressed), lengths), logits


FAMILY = Family(name="nsa", Config=Config, init_weights=init_weights, init_state=init_state, prefill=prefill,
                decode_step=decode_step, selecting_layout=selecting_layout,
                metadata_bytes_read=metadata_bytes_read, selection_weights=SELECTION_WEIGHTS)

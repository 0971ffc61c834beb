"""Quest (page-level query-aware sparsity) on GQA, decoding through a HiSparse RecordStore.

A record is one page of `page_size` (16) tokens of one KV head: its keys then its values,
`[P, 2 * head_dim]`. Selection is per KV head, so streams are (batch, kv_heads).

Indexer (Tang et al. 2024, "Quest"). When a page seals, the elementwise max M and min m of its
keys (post-rope, as attended) are kept on device, one `[b, kvh, R, hd]` buffer per sparse layer. A query head
scores page r with the upper bound U = sum_i max(q_i M_i, q_i m_i) of its dot products; the
query heads of a GQA group add their bounds, so one selection serves the group. Each step a
sparse layer attends to the top-k sealed pages (ids ascending, -1 padding) plus the open page
in the tail, which is always attended.

Dense layers. The first `dense_layers` (2) layers attend to every sealed page. Their KV stays
in HBM in every mode, in a second RecordStore of mode "dense" (`State.dense_store`): a dense
layer reads all its pages every step, so paging them through a hot buffer would need B >= R
slots (no HBM saved) or refetch the whole context per step. They attend to their KV in place
(no gather, no copy), through the same attention code as the sparse layers, and their bytes are
counted as KV records by the byte account.

Prefill is dense causal attention over the prompt (Quest only sparsifies decode).

The feed-forward branch is a dense SwiGLU MLP, or with experts > 0 a mixture of experts
(hisparse_jax.models.moe) in every layer, the dense-attention layers included: "dense" names how
those layers attend, not their MLP (Qwen3-30B-A3B, the MoE Quest is deployed with, has no
dense-MLP layer).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .. import kv_store, layout
from ..kv_store import RecordStore
from . import shapes
from .family import Family
from .paging import ForcedSelection
from . import gqa, layers, moe, paging
from .config import require
from .weights import init_normal, ones, split_layers


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(gqa.GQAConfig):
    """Static Quest model configuration (hashable: a static jit argument). Shared fields:
    ModelConfig and GQAConfig.

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: 2 dense + 2 sparse layers, 4 q / 2 kv heads of 16, context 256 (16 pages);
    "realistic", GPU benchmark shapes: Llama-3-8B GQA (32 q / 8 kv heads of 128) in bf16,
    k = 256 pages.

    Attributes:
      dense_layers: the first layers, attending to every page from HBM (Quest: 2).
      page_size: tokens per page (Quest: 16).
    """

    dense_layers: int = 2
    page_size: int = 16

    PRESETS = shapes.FAMILY_PRESETS["quest"]  # named shapes live in models/shapes.py

    def check(self) -> None:
        super().check()
        dense = self.dense_layers
        require(isinstance(dense, int) and not isinstance(dense, bool) and 0 <= dense < self.num_layers, self,
                "dense_layers",
                f"must be an int in [0, num_layers={self.num_layers}): at least one layer must be sparse, "
                f"got {dense!r}")

    @property
    def sparse_layers(self) -> int:
        return self.num_layers - self.dense_layers

    def cache_config(self, batch: int, num_layers: int | None = None):
        """The sparse layers' store (num_layers overrides the layer count: the dense store)."""
        return super().cache_config(batch, self.sparse_layers if num_layers is None else num_layers)


# --------------------------------------------------------------------------- weights and state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer's weights (h = KV heads, g = query heads per KV head)."""

    attn_norm: jax.Array  # [D]
    w_in: jax.Array  # [D, h, (g + 2) hd]: per KV head its g query heads, its key, its value
    w_o: jax.Array  # [h, g, hd, D]
    mlp: layers.MLPWeights | None  # the dense MLP (experts = 0), else None
    moe: moe.MoEWeights | None  # the mixture of experts (experts > 0), else None


Weights = layers.ModelWeights


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams (streams = (b, kvh)).

    Attributes:
      store: sealed pages of the sparse layers, [b, kvh, R, P, 2hd] each, in `mode`.
      dense_store: sealed pages of the dense layers, mode "dense" (HBM, read in place) whatever
        `mode` is; None without dense layers.
      tail: num_layers arrays [b, kvh, P, 2hd], the open page of each layer (dense first).
      page_max, page_min: L_sparse arrays [b, kvh, R, hd], key bounds of each sealed page.
      lengths: [b] int32 tokens held per stream (the next token's position).
    """

    store: RecordStore
    dense_store: RecordStore | None
    tail: tuple[jax.Array, ...] = layout.field(layout.OPEN_PAGE, batch_axis=0)
    page_max: tuple[jax.Array, ...] = layout.field(layout.INDEXER_METADATA, batch_axis=0)
    page_min: tuple[jax.Array, ...] = layout.field(layout.INDEXER_METADATA, batch_axis=0)
    lengths: jax.Array = layout.field(layout.COUNTERS, batch_axis=0)


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal, 1/fan_in variance; norms at 1)."""
    c, dt, L, D = config, config.dtype, config.num_layers, config.d_model
    w = init_normal(seed, {"embed": ((c.vocab, D), D), **gqa.layer_specs(c, L), "unembed": ((D, c.vocab), D)}, dt)
    stacked = {n: w[n] for n in gqa.ATTENTION}
    stacked.update(attn_norm=ones((L, D), dt))
    feed_forward = moe.feed_forward_weights(c, seed, w)
    layer_weights = tuple(LayerWeights(**a, **f) for a, f in zip(split_layers(stacked, L, dict), feed_forward))
    return Weights(w["embed"], layer_weights, ones((D,), dt), w["unembed"])


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` requests; `mode` is "hisparse", "device" or "dense"."""
    c, h, R = config, config.n_kv_heads, config.store_records
    bounds = lambda: tuple(jnp.zeros((batch, h, R, c.head_dim), c.dtype) for _ in range(c.sparse_layers))
    dense = c.cache_config(batch, c.dense_layers) if c.dense_layers else None
    state = State(
        store=kv_store.init_store(mode, c.cache_config(batch), sharding, c.implementation, c.prefetch),
        dense_store=kv_store.init_store("dense", dense, sharding) if dense else None,
        tail=tuple(jnp.zeros((batch, h, c.page_size, c.record_width), c.dtype) for _ in range(c.num_layers)),
        page_max=bounds(),
        page_min=bounds(),
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return layout.commit(state, sharding)


def selecting_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a selection trace: the sparse layers, per
    KV head."""
    return config.sparse_layers, (batch, config.n_kv_heads), config.num_records


def metadata_bytes_read(config: Config, context: int) -> int:
    """Device bytes one decode step reads per request besides weights and selected pages: the key
    bounds of the sealed pages of every sparse layer, and every token of the dense layers."""
    pages = context // config.page_size
    bounds = config.sparse_layers * config.n_kv_heads * pages * 2 * config.head_dim * config.dtype.itemsize
    dense = config.dense_layers * config.n_kv_heads * context * config.record_width * config.dtype.itemsize
    return bounds + dense


# --------------------------------------------------------------------------- Quest indexer


def page_bounds(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """keys [..., P, hd] of full pages -> (max [..., hd], min [..., hd]) over the page's tokens."""
    return jnp.max(keys, axis=-2), jnp.min(keys, axis=-2)


def page_scores(q: jax.Array, page_max: jax.Array, page_min: jax.Array) -> jax.Array:
    """Quest's bound U summed over a GQA group: q [b, h, g, hd], bounds [b, h, R, hd] -> [b, h, R] f32.

    sum_i max(q_i M_i, q_i m_i) = relu(q) . M + min(q, 0) . m because M_i >= m_i: the positive
    query coordinates take the max, the negative ones the min. Two einsums, no [.., R, hd] temporary.
    """
    f32 = jnp.float32
    q = q.astype(f32)
    upper = jnp.einsum("bhgk,bhrk->bhr", jnp.maximum(q, 0.0), page_max.astype(f32))
    lower = jnp.einsum("bhgk,bhrk->bhr", jnp.minimum(q, 0.0), page_min.astype(f32))
    return upper + lower


# --------------------------------------------------------------------------- decode


def _decode_layer(config: Config, w: LayerWeights, store: RecordStore, select, pos, x, tail, layer: int):
    """One layer of one decode step, dense or sparse.

    Args:
      store: the layer's store ("dense": read in place, every sealed page).
      select: (q [b, kvh, G, hd], tail with this step's token) -> selection [b, kvh, k] of
        `store`'s records (None: dense).
      pos: [b] int32 position of this step's token; layer: index of the layer in `store`.
    Returns (x, tail, store, misses [b, kvh]).
    """
    pos_s = gqa.per_stream(pos, config.n_kv_heads)
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("project"):
        q, record, _ = gqa.project(config, h, w.w_in, pos)  # q [b, kvh, G, hd]
        tail = paging.tail_write(tail, record, pos_s)
    with jax.named_scope("select"):
        selection = select(q, tail)
    with jax.named_scope("attention"):
        located, store = paging.locate(store, layer, selection)
        parts, misses, store = paging.selected_parts(store, layer, located, tail, pos_s, gqa.split(config))
        heads = layers.attend(q, parts, gqa.scale(config))  # [b, kvh, G, hd]
        x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    x = moe.add_feed_forward(config, w, x)
    return x, tail, store, misses


def _put_page(meta: jax.Array, new: jax.Array, index: jax.Array, write: jax.Array) -> jax.Array:
    """meta[b, h, index[b, h]] = new[b, h] where write[b, h]; meta [b, kvh, R, hd], new [b, kvh, hd]."""
    R = meta.shape[2]
    at = jnp.where(write, index, R)  # R is out of range: dropped
    put = lambda m, v, i: m.at[i].set(v, mode="drop")
    return jax.vmap(jax.vmap(put))(meta, new, at)


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array,
                forced: ForcedSelection | None = None, record_selection: bool = False) -> paging.StepOutput:
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
      forced: a trace's ids [L_sparse, b, kvh, k] for this step (benchmarks), or None.
      record_selection: also return the ids each sparse layer selected ([L_sparse, b, kvh, k]).
    Returns:
      StepOutput(state, logits [b, V] float32, misses [L_sparse, b, kvh] int32: pages RESOLVE
      fetched per sparse layer and KV head, zeros outside "hisparse", selected).
    """
    c, Ld, pos = config, config.dense_layers, state.lengths
    store, dense_store, tails = state.store, state.dense_store, list(state.tail)
    with jax.named_scope("embed"):
        x = layers.embed(weights.embed, tokens)
    page_max, page_min = list(state.page_max), list(state.page_min)
    sealing = gqa.per_stream(pos + 1, c.n_kv_heads) % c.page_size == 0
    misses, chosen = [], []
    for layer, w in enumerate(weights.layers):
        if layer < Ld:
            with jax.named_scope("dense_layer"):
                x, tails[layer], dense_store, _ = _decode_layer(c, w, dense_store, lambda q, tail: None, pos, x,
                                                                tails[layer], layer)
            continue
        s = layer - Ld

        def select(q, tail, s=s):
            # The bounds of a page this token fills are written before the scores read the
            # buffer (ids >= sealed are never selected): the read then follows the in-place
            # write, which XLA would otherwise order by copying the buffer.
            top, bottom = page_bounds(tail[..., : c.head_dim])  # [b, kvh, hd]
            page_max[s] = _put_page(page_max[s], top, store.sealed, sealing)
            page_min[s] = _put_page(page_min[s], bottom, store.sealed, sealing)
            scores = lambda: page_scores(q, page_max[s], page_min[s])
            chosen.append(paging.select(c, store, scores, forced, s))
            return chosen[-1]

        with jax.named_scope("sparse_layer"):
            x, tails[layer], store, m = _decode_layer(c, w, store, select, pos, x, tails[layer], s)
        misses.append(m)
    logits = layers.lm_head(weights, x, c.norm_eps)
    with jax.named_scope("seal"):
        new_lengths = gqa.per_stream(pos + 1, c.n_kv_heads)
        misses = jnp.stack(misses)
        store = paging.seal_full_pages(store, tails[Ld:], new_lengths, misses)
        if Ld:
            dense_store = paging.seal_full_pages(dense_store, tails[:Ld], new_lengths, misses)
    state = State(store, dense_store, tuple(tails), tuple(page_max), tuple(page_min), pos + 1)
    return paging.StepOutput(state, logits, misses, paging.stack_selected(chosen) if record_selection else None)


# --------------------------------------------------------------------------- prefill


def _prefill_layer(config: Config, w: LayerWeights, positions, chunk, x):
    """One layer over the whole prompt: x [b, T, D] -> (x, records [b, T, kvh, 2hd])."""
    h = layers.rms_norm(x, w.attn_norm, config.norm_eps)
    q, record, _ = gqa.project(config, h, w.w_in, positions[None, :])  # q [b, T, kvh, G, hd]
    keys, values = gqa.split(config)(record)

    def q_fn(q_pos):
        return jax.lax.dynamic_slice_in_dim(q, q_pos[0], chunk, axis=1)  # [b, C, kvh, G, hd]

    with jax.named_scope("attention"):
        heads = layers.causal_attention(q_fn, keys, values, gqa.scale(config), chunk)  # [b, T, kvh, G, hd]
        x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    x = moe.add_feed_forward(config, w, x)
    return x, record


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """The protocol's prefill (hisparse_jax.models: prompts [b, T], lengths [b] -> (state, logits
    [b, V] of each prompt's last token)), dense and causal: the dense layers' pages go to
    dense_store, the sparse layers' to the store with the key bounds of each sealed page."""
    c, Ld, hd = config, config.dense_layers, config.head_dim
    x, lengths, positions, chunk, keep = layers.embed_prompts(c, weights.embed, prompts, lengths)
    records = []
    for w in weights.layers:
        x, record = _prefill_layer(c, w, positions, chunk, x)
        records.append(jnp.swapaxes(record[:, :keep], 1, 2))  # [b, kvh, keep, 2hd]
    with jax.named_scope("write_sealed"):
        lengths_s = gqa.per_stream(lengths, c.n_kv_heads)
        pages, count, tails = paging.prefill_pages(jnp.stack(records), lengths_s, c.page_size)
        store = kv_store.write_sealed(state.store, pages[Ld:], count)
        dense_store = kv_store.write_sealed(state.dense_store, pages[:Ld], count) if Ld else None
    with jax.named_scope("page_bounds"):
        sealed = (jnp.arange(pages.shape[3]) < count[..., None])[..., None]  # [b, kvh, T/P, 1]
        page_max, page_min = [], []
        for s in range(c.sparse_layers):
            top, bottom = page_bounds(pages[Ld + s, ..., :hd])  # [b, kvh, T/P, hd]
            put = lambda meta, new: jax.lax.dynamic_update_slice(
                meta, jnp.where(sealed, new, jnp.zeros((), new.dtype)), (0, 0, 0, 0))
            page_max.append(put(state.page_max[s], top))
            page_min.append(put(state.page_min[s], bottom))
    logits = layers.lm_head(weights, layers.last_token(x, lengths), c.norm_eps)
    return State(store, dense_store, tuple(tails), tuple(page_max), tuple(page_min), lengths), logits


FAMILY = Family(name="quest", Config=Config, init_weights=init_weights, init_state=init_state, prefill=prefill,
                decode_step=decode_step, selecting_layout=selecting_layout,
                metadata_bytes_read=metadata_bytes_read)

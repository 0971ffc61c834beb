"""Quest (page-level query-aware sparsity) on GQA, decoding through a HiSparse RecordStore.

A record is one page of `page_size` (16) tokens of one KV head: its keys then its values,
`[P, 2 * head_dim]`. Selection is per KV head, so streams are (batch, kv_heads).

Indexer (DESIGN.md section 6). When a page seals, the elementwise max M and min m of its
keys (post-rope, as attended) are kept on device, `[L_sparse, b, kvh, R, hd]`. A query head
scores page r with the upper bound U = sum_i max(q_i M_i, q_i m_i) of its dot products; the
query heads of a GQA group add their bounds, so one selection serves the group. Each step a
sparse layer attends to the top-k sealed pages (ids ascending, -1 padding) plus the open page
in the tail, which is always attended.

Dense layers. The first `dense_layers` (2) layers attend to every sealed page. Their KV stays
in HBM in every mode, in a second RecordStore of mode "device" (`State.dense_store`): a dense
layer reads all its pages every step, so paging them through a hot buffer would need B >= R
slots (no HBM saved) or refetch the whole context per step. They go through the same gather
and attention code as the sparse layers with the "dense" selection, and their bytes are
counted in `Config.device_bytes` with the rest of what stays on device.

Prefill is dense causal attention over the prompt (Quest only sparsifies decode).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .. import kv_store, traces
from ..config import CacheConfig
from ..kv_store import RecordStore
from . import common, gqa

PRESETS = {
    "tiny": dict(
        vocab=256, d_model=64, n_layers=4, dense_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
        d_ff=128, top_k=4, hot_slots=8, max_context=256, prefill_chunk=64, dtype="float32",
    ),
    # Llama-3-8B attention and MLP shapes; 2 dense + 4 sparse layers; a 4096-token budget.
    "realistic": dict(
        vocab=32000, d_model=4096, n_layers=6, dense_layers=2, n_heads=32, n_kv_heads=8,
        head_dim=128, d_ff=14336, top_k=256, hot_slots=512, max_context=32768,
        prefill_chunk=256, dtype="bfloat16",
    ),
}


@dataclasses.dataclass(frozen=True)
class Config(gqa.GQAConfigMixin):
    """Static Quest model configuration (hashable: a static jit argument).

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: 2 dense + 2 sparse layers, 4 q / 2 kv heads of 16, context 256 (16 pages);
    "realistic", GPU benchmark shapes: Llama-3-8B GQA (32 q / 8 kv heads of 128) in bf16,
    k = 256 pages.

    Attributes:
      vocab, d_model, n_layers, d_ff: transformer sizes (SwiGLU MLP).
      dense_layers: the first layers, attending to every page from HBM (Quest: 2).
      n_heads, n_kv_heads, head_dim: GQA attention; G = n_heads // n_kv_heads.
      top_k: k pages selected per (request, KV head) and step; hot_slots: B >= k.
      max_context: tokens per stream; page_size: tokens per page (Quest: 16).
      pool_records: records per stream in the stores (None: max_context // P).
      prefill_chunk: queries per block of the dense prefill attention.
      dtype: weights, activations, records and page metadata (float32 or bfloat16).
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
    dense_layers: int = 2
    page_size: int = 16
    pool_records: int | None = None
    prefill_chunk: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: Any = "float32"

    PRESETS: ClassVar = PRESETS

    def __post_init__(self):
        common.check_model_fields(self, "n_heads", "n_kv_heads", "head_dim")
        gqa.check_heads(self)
        dense = self.dense_layers
        common.require(
            isinstance(dense, (int, np.integer)) and not isinstance(dense, bool) and 0 <= dense < self.n_layers,
            self, "dense_layers",
            f"must be an int in [0, n_layers={self.n_layers}): at least one layer must be sparse, got {dense!r}",
        )
        common.check_record_layout(self, "head_dim", "page_size x 2 x head_dim")

    @property
    def sparse_layers(self) -> int:
        return self.n_layers - self.dense_layers

    def cache_config(self, batch: int, num_layers: int | None = None) -> CacheConfig:
        """The sparse layers' store (num_layers overrides the layer count: the dense store)."""
        layers = self.sparse_layers if num_layers is None else num_layers
        return self.store_config(layers, (batch, self.n_kv_heads))

    def device_bytes(self, batch: int, mode: str = "hisparse") -> dict[str, int]:
        """HBM held by the decode state of `batch` requests, by part (weights excluded).

        sparse_kv: hot buffers + slot metadata ("hisparse") or every page ("device", "dense");
        dense_kv: every page of the dense layers (HBM in every mode); page_minmax: Quest's
        per-page key max and min of the sparse layers (grows with context); tail: open pages.
        """
        if mode not in kv_store.MODES:
            raise ValueError(f"mode must be one of {kv_store.MODES}, got {mode!r}")
        sparse, dense = self.cache_config(batch), self.cache_config(batch, max(self.dense_layers, 1))
        per_layer_stream = batch * self.n_kv_heads
        parts = {
            "sparse_kv": sparse.device_bytes if mode == "hisparse" else sparse.host_bytes,
            "dense_kv": dense.host_bytes if self.dense_layers else 0,
            "page_minmax": 2 * self.sparse_layers * per_layer_stream * sparse.pool_records
            * self.head_dim * self.dtype.itemsize,
            "tail": self.n_layers * per_layer_stream * self.record_bytes,
        }
        return {**parts, "total": sum(parts.values())}


# --------------------------------------------------------------------------- weights and state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """Per-layer weights stacked on a leading layer axis (h = KV heads, g = query heads per KV head)."""

    attn_norm: jax.Array  # [L, D]
    w_q: jax.Array  # [L, D, h, g, hd]
    w_k: jax.Array  # [L, D, h, hd]
    w_v: jax.Array  # [L, D, h, hd]
    w_o: jax.Array  # [L, h, g, hd, D]
    mlp_norm: jax.Array  # [L, D]
    w_gate: jax.Array  # [L, D, F]
    w_up: jax.Array  # [L, D, F]
    w_down: jax.Array  # [L, F, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    """Dense and sparse layers are two stacks, so each layer loop scans its own stack (no slicing)."""

    embed: jax.Array  # [V, D]
    dense_layers: LayerWeights  # [dense_layers, ...]
    sparse_layers: LayerWeights  # [sparse_layers, ...]
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Decode state of a batch of streams (streams = (b, kvh)).

    Attributes:
      store: sealed pages of the sparse layers, [L_sparse, b, kvh, R, P, 2hd], in `mode`.
      dense_store: sealed pages of the dense layers, mode "device" whatever `mode` is.
      tail: [n_layers, b, kvh, P, 2hd] the open page of every layer (dense first), on device.
      page_max, page_min: [L_sparse, b, kvh, R, hd] key bounds of each sealed page, on device.
      lengths: [b] int32 tokens held per stream (the next token's position).
      trace: a traces.TraceState over [L_sparse, b, kvh, R] that steers the selection
        (benchmarks), or None.
    """

    store: RecordStore
    dense_store: RecordStore
    tail: jax.Array
    page_max: jax.Array
    page_min: jax.Array
    lengths: jax.Array
    trace: traces.TraceState | None = None


def _layer_specs(config: Config, L: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """{name: (shape, fan_in)} of one layer stack of L layers."""
    D, h, g, hd, F = config.d_model, config.n_kv_heads, config.group_size, config.head_dim, config.d_ff
    return {
        "w_q": ((L, D, h, g, hd), D),
        "w_k": ((L, D, h, hd), D),
        "w_v": ((L, D, h, hd), D),
        "w_o": ((L, h, g, hd, D), config.n_heads * hd),
        "w_gate": ((L, D, F), D),
        "w_up": ((L, D, F), D),
        "w_down": ((L, F, D), F),
    }


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal, 1/fan_in variance; norms at 1)."""
    D, V, dt = config.d_model, config.vocab, config.dtype
    stacks = {"dense": config.dense_layers, "sparse": config.sparse_layers}
    specs = {"embed": ((V, D), D), "unembed": ((D, V), D)}
    for stack, L in stacks.items():
        specs.update({f"{stack}.{n}": spec for n, spec in _layer_specs(config, L).items()})
    w = common.init_normal(seed, specs, dt)

    def layers(stack: str) -> LayerWeights:
        ones = jnp.ones((stacks[stack], D), dt)
        mats = {n: w[f"{stack}.{n}"] for n in _layer_specs(config, 0)}
        return LayerWeights(attn_norm=ones, mlp_norm=ones, **mats)

    return Weights(w["embed"], layers("dense"), layers("sparse"), jnp.ones((D,), dt), w["unembed"])


def init_state(config: Config, batch: int, mode: kv_store.Mode, sharding=None) -> State:
    """An empty state for `batch` requests; `mode` is "hisparse", "device" or "dense"."""
    Ls, h, R = config.sparse_layers, config.n_kv_heads, common.pool_records(config)
    # A store needs >= 1 layer; with dense_layers == 0 the dense store is a 1-layer stub never read.
    dense = config.cache_config(batch, max(config.dense_layers, 1))
    bounds = lambda: jnp.zeros((Ls, batch, h, R, config.head_dim), config.dtype)  # two buffers: both donated
    state = State(
        store=kv_store.init_store(mode, config.cache_config(batch), sharding),
        dense_store=kv_store.init_store("device", dense, sharding),
        tail=jnp.zeros((config.n_layers, batch, h, config.page_size, config.record_width), config.dtype),
        page_max=bounds(),
        page_min=bounds(),
        lengths=jnp.zeros((batch,), jnp.int32),
    )
    return common.commit(state, sharding)


# --------------------------------------------------------------------------- layers


def _query(config: Config, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [b, ..., D] at positions [b, ...] -> rope(q) [b, ..., kvh, G, hd]."""
    return gqa.query(h, w.w_q, positions, config.rope_theta)


def _kv_record(config: Config, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [b, ..., D] at positions [b, ...] -> record [b, ..., kvh, 2hd] = [rope(k), v], config.dtype."""
    return gqa.kv_record(h, w.w_k, w.w_v, positions, config.rope_theta, config.dtype)


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


def _select(config: Config, store: RecordStore, q, page_max, page_min, trace: traces.TraceState | None,
            layer) -> jax.Array:
    """Pages sparse layer `layer` attends to: [b, kvh, k] ([b, kvh, R] in "dense" mode)."""
    if store.mode == "dense":
        return common.dense_selection(store.sealed, config.num_records)
    scores = traces.steer(lambda: page_scores(q, page_max, page_min), trace, layer, store.sealed)
    return common.select_topk(scores, store.sealed, config.top_k)


def trace_layout(config: Config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a traces.TraceState for this model:
    the sparse layers, per KV head."""
    return config.sparse_layers, (batch, config.n_kv_heads), config.num_records


# --------------------------------------------------------------------------- decode


def _decode_layer(config: Config, store: RecordStore, select, pos, carry, layer, w: LayerWeights):
    """One layer of one decode step.

    Args:
      select: fn(q [b, kvh, G, hd], layer) -> selection [b, kvh, k'] of `store`'s records.
      pos: [b] int32 position of this step's token.
      carry: (x [b, D], cache (the store's HotCache or None), tails [L', b, kvh, P, 2hd]).
    Returns the new carry and (misses [b, kvh], selection [b, kvh, k']).
    """
    x, cache, tails = carry
    hd, P = config.head_dim, config.page_size
    pos_s = gqa.per_stream(pos, config.n_kv_heads)
    h = common.rms_norm(x, w.attn_norm, config.norm_eps)
    with jax.named_scope("project"):
        q = _query(config, w, h, pos)  # [b, kvh, G, hd]
        tail = jax.lax.dynamic_index_in_dim(tails, layer, keepdims=False)
        tail = common.tail_write(tail, _kv_record(config, w, h, pos), pos_s)
    with jax.named_scope("select"):
        selection = select(q, layer)
    with jax.named_scope("gather"):
        store = dataclasses.replace(store, cache=cache)
        kv, valid, misses, store = common.gather_with_tail(
            store, layer, selection, tail, common.tail_valid(pos_s, P)
        )
    with jax.named_scope("attention"):
        heads = common.attend(q, kv[..., :hd], kv[..., hd:], valid, gqa.scale(config))  # [b, kvh, G, hd]
        x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    with jax.named_scope("mlp"):
        x = x + common.mlp(w, x, config.norm_eps)
    tails = jax.lax.dynamic_update_index_in_dim(tails, tail, layer, 0)
    return (x, store.cache, tails), (misses, selection)


def _layer_loop(config, store, select, pos, x, tails, stack: LayerWeights):
    """Scans _decode_layer over a layer stack.

    Returns (x, store with its new hot cache, tails, misses [L', b, kvh], selections [L', b, kvh, k']).
    """

    def step(carry, xs):
        layer, w = xs
        return _decode_layer(config, store, select, pos, carry, layer, w)

    layers = jnp.arange(tails.shape[0], dtype=jnp.int32)
    (x, cache, tails), (misses, selections) = jax.lax.scan(step, (x, store.cache, tails), (layers, stack))
    return x, dataclasses.replace(store, cache=cache), tails, misses, selections


def _put_page(meta: jax.Array, new: jax.Array, index: jax.Array, write: jax.Array) -> jax.Array:
    """meta[l, b, h, index[b, h]] = new[l, b, h] where write[b, h].

    Args: meta [L, b, kvh, R, hd]; new [L, b, kvh, hd]; index [b, kvh] int32; write [b, kvh] bool.
    """
    R = meta.shape[3]
    at = jnp.where(write, index, R)  # R is out of range: dropped
    put = lambda m, v, i: m.at[i].set(v, mode="drop")
    return jax.vmap(jax.vmap(jax.vmap(put)), in_axes=(0, 0, None))(meta, new, at)


def _seal(config: Config, state: State, store, dense_store, tails: jax.Array, trace):
    """Seals the open pages this step filled (both stores) and records the sparse pages' key bounds."""
    Ld = config.dense_layers
    new_lengths = gqa.per_stream(state.lengths + 1, config.n_kv_heads)
    sealing = new_lengths % config.page_size == 0
    page_max, page_min = page_bounds(tails[Ld:, ..., : config.head_dim])  # [Ls, b, kvh, hd]
    page_max = _put_page(state.page_max, page_max, store.sealed, sealing)
    page_min = _put_page(state.page_min, page_min, store.sealed, sealing)
    store = common.seal_full_pages(store, tails[Ld:], new_lengths)
    if Ld:
        dense_store = common.seal_full_pages(dense_store, tails[:Ld], new_lengths)
    return State(store, dense_store, tails, page_max, page_min, state.lengths + 1, trace)


def _decode(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """decode_step plus the selection of every sparse layer [L_sparse, b, kvh, k]."""
    Ld, pos = config.dense_layers, state.lengths
    trace = traces.advance(state.trace)
    with jax.named_scope("embed"):
        x = common.embed(weights.embed, tokens)
    dense_store, tails = state.dense_store, state.tail
    if Ld:
        with jax.named_scope("dense_layers"):
            select_all = lambda q, layer: common.dense_selection(dense_store.sealed, config.num_records)
            x, dense_store, dense_tails, _, _ = _layer_loop(
                config, dense_store, select_all, pos, x, tails[:Ld], weights.dense_layers
            )

    def select_pages(q, layer):
        at = lambda a: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)
        return _select(config, state.store, q, at(state.page_max), at(state.page_min), trace, layer)

    with jax.named_scope("sparse_layers"):
        x, store, sparse_tails, misses, selections = _layer_loop(
            config, state.store, select_pages, pos, x, tails[Ld:], weights.sparse_layers
        )
    logits = common.lm_head(weights, x, config.norm_eps)
    with jax.named_scope("seal"):
        tails = jnp.concatenate([dense_tails, sparse_tails], axis=0) if Ld else sparse_tails
        state = _seal(config, state, store, dense_store, tails, trace)
    return state, logits, misses, selections


def decode_step(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """One token per stream.

    Args:
      tokens: [b] int32, the token at position state.lengths.
    Returns:
      (state, logits [b, V] float32, misses [L_sparse, b, kvh] int32: pages RESOLVE fetched
      per sparse layer and KV head, zeros outside "hisparse").
    """
    state, logits, misses, _ = _decode(config, weights, state, tokens)
    return state, logits, misses


def decode_step_with_selection(config: Config, weights: Weights, state: State, tokens: jax.Array):
    """decode_step, plus the pages every sparse layer attended: [L_sparse, b, kvh, k] int32
    ([L_sparse, b, kvh, max_context // P] in "dense" mode), for tests and trace collection."""
    return _decode(config, weights, state, tokens)


# --------------------------------------------------------------------------- prefill


def _prefill_layer(config: Config, positions, chunk, x, w: LayerWeights):
    """One layer over the whole prompt: x [b, T, D] -> (x, records [b, T, kvh, 2hd])."""
    h = common.rms_norm(x, w.attn_norm, config.norm_eps)
    record = _kv_record(config, w, h, positions[None, :])
    keys, values = record[..., : config.head_dim], record[..., config.head_dim :]

    def q_fn(q_pos):
        h_chunk = jax.lax.dynamic_slice_in_dim(h, q_pos[0], chunk, axis=1)
        return _query(config, w, h_chunk, q_pos[None, :])  # [b, C, kvh, G, hd]

    with jax.named_scope("attention"):
        heads = common.causal_attention(q_fn, keys, values, gqa.scale(config), chunk)  # [b, T, kvh, G, hd]
        x = x + gqa.attention_out(heads, w.w_o, config.dtype)
    with jax.named_scope("mlp"):
        x = x + common.mlp(w, x, config.norm_eps)
    return x, record


def _all_layers(weights: Weights) -> LayerWeights:
    """Both stacks as one [n_layers] stack (prefill treats every layer alike: one scan body)."""
    return jax.tree.map(lambda d, s: jnp.concatenate([d, s]), weights.dense_layers, weights.sparse_layers)


def prefill(config: Config, weights: Weights, state: State, prompts: jax.Array, lengths: jax.Array):
    """Dense causal prefill of ragged prompts into a fresh state.

    Args:
      prompts: [b, T] int32, row i valid up to lengths[i]; T <= max_context.
      lengths: [b] int32 in [1, T].
    Returns:
      (state, logits [b, V] float32 of each prompt's last token).
    """
    Ld, hd = config.dense_layers, config.head_dim
    x, lengths, positions, chunk, keep = common.embed_prompts(config, weights.embed, prompts, lengths)
    layer = lambda x, w: _prefill_layer(config, positions, chunk, x, w)
    x, records = jax.lax.scan(layer, x, _all_layers(weights))  # records [L, b, T, kvh, 2hd]
    with jax.named_scope("write_sealed"):
        records = jnp.swapaxes(records[:, :, :keep], 2, 3)
        lengths_s = gqa.per_stream(lengths, config.n_kv_heads)
        pages, count, tails = common.prefill_pages(records, lengths_s, config.page_size)
        store = kv_store.write_sealed(state.store, pages[Ld:], count)
        dense_store = kv_store.write_sealed(state.dense_store, pages[:Ld], count) if Ld else state.dense_store
    with jax.named_scope("page_bounds"):
        page_max, page_min = page_bounds(pages[Ld:, ..., :hd])  # [Ls, b, kvh, T/P, hd]
        sealed = (jnp.arange(pages.shape[3]) < count[..., None])[None, ..., None]
        put = lambda meta, new: jax.lax.dynamic_update_slice(
            meta, jnp.where(sealed, new, jnp.zeros((), new.dtype)), (0, 0, 0, 0, 0)
        )
        page_max, page_min = put(state.page_max, page_max), put(state.page_min, page_min)
    logits = common.lm_head(weights, common.last_token(x, lengths), config.norm_eps)
    return State(store, dense_store, tails, page_max, page_min, lengths, state.trace), logits

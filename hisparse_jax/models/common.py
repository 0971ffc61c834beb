"""Pieces every model family shares: config checks, weight init, layers, paged
KV bookkeeping (tail buffer, sealing, selection), attention and sampling.

Conventions: b = batch, T = tokens, D = d_model, V = vocab, L = layers,
*S = stream dims (b, or b x kv_heads), P = page_size, W = record width,
R = records per stream (max_context // P), k = top_k, n = attended tokens.
Stream-shaped arguments ([*S]) must already be broadcast to the stream shape.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, ClassVar, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import kv_store
from ..config import CacheConfig
from ..kv_store import RecordStore

# --------------------------------------------------------------------------- config checks


def field_error(config: Any, field: str, message: str) -> ValueError:
    return ValueError(f"{type(config).__name__}.{field}: {message}")


def require(ok: bool, config: Any, field: str, message: str) -> None:
    """Raises a ValueError naming `Config.field` unless `ok`."""
    if not ok:
        raise field_error(config, field, message)


def normalize_dtypes(config: Any, *fields: str) -> None:
    """Stores each dtype field as a hashable np.dtype (call from __post_init__)."""
    for name in fields:
        try:
            dtype = np.dtype(getattr(config, name))
        except TypeError as err:
            raise field_error(config, name, f"not a dtype: {getattr(config, name)!r}") from err
        object.__setattr__(config, name, dtype)


def check_positive_ints(config: Any, *fields: str) -> None:
    for name in fields:
        value = getattr(config, name)
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1
        require(ok, config, name, f"must be a positive int, got {value!r}")


def context_records(config: Any) -> int:
    """Records a stream can ever seal: max_context // page_size."""
    return config.max_context // config.page_size


def pool_records(config: Any) -> int:
    """R: records per stream in the store (config.pool_records, default max_context // P)."""
    explicit = getattr(config, "pool_records", None)
    return explicit if explicit is not None else config.max_context // config.page_size


def check_dtype(config: Any) -> None:
    """config.dtype (already normalized) must be float32 or bfloat16."""
    require(
        config.dtype in (np.dtype(np.float32), np.dtype(jnp.bfloat16)), config, "dtype",
        f"must be float32 or bfloat16, got {config.dtype}",
    )


def check_model_fields(config: Any, *positive: str) -> None:
    """The checks every family's Config starts with (call first in __post_init__).

    Normalizes dtype (float32 or bfloat16), checks vocab, d_model, n_layers, d_ff,
    prefill_chunk and the `positive` family fields are positive ints, then the cache fields.
    """
    normalize_dtypes(config, "dtype")
    check_positive_ints(config, "vocab", "d_model", "n_layers", *positive, "d_ff", "prefill_chunk")
    check_cache_fields(config)
    check_dtype(config)


def check_record_layout(config: Any, field: str, layout: str) -> None:
    """prefill_chunk a multiple of page_size; record_bytes a multiple of 8 (else: adjust `field`).

    `layout` spells a record's shape for the message, e.g. "page_size x 2 x head_dim".
    """
    require(
        config.prefill_chunk % config.page_size == 0, config, "prefill_chunk",
        f"prefill_chunk={config.prefill_chunk} must be a multiple of page_size={config.page_size}",
    )
    require(
        config.record_bytes % 8 == 0, config, field,
        f"a record is {config.record_bytes} bytes ({layout} x itemsize); it must be a multiple "
        f"of 8: adjust {field}",
    )


def check_cache_fields(config: Any) -> None:
    """Checks top_k, hot_slots, max_context, page_size (and pool_records if present)."""
    check_positive_ints(config, "top_k", "hot_slots", "max_context", "page_size")
    P, T = config.page_size, config.max_context
    require(
        T % P == 0, config, "page_size",
        f"page_size={P} must divide max_context={T}: a stream holds whole pages",
    )
    if getattr(config, "pool_records", None) is not None:
        check_positive_ints(config, "pool_records")
    R, needed = pool_records(config), context_records(config)
    require(
        R >= needed, config, "max_context",
        f"max_context={T} tokens is {needed} pages of {P}, beyond the pool of "
        f"pool_records={R} records; raise pool_records or lower max_context",
    )
    require(
        config.top_k <= config.hot_slots, config, "top_k",
        f"top_k k={config.top_k} > hot_slots B={config.hot_slots}: every selected record "
        "needs a hot slot; raise hot_slots or lower top_k",
    )
    require(
        config.top_k <= needed, config, "top_k",
        f"top_k k={config.top_k} exceeds the {needed} pages of max_context={T}; "
        f"use top_k <= {needed} (top_k == {needed} selects every sealed page)",
    )


def make_preset(cls: type, name: str, presets: Mapping[str, Mapping[str, Any]], overrides: Mapping):
    """cls(**presets[name], **overrides), with errors naming the preset or field."""
    if name not in presets:
        raise ValueError(f"{cls.__name__}: unknown preset {name!r}; presets: {', '.join(presets)}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(fields))}"
        )
    return cls(**{**presets[name], **overrides})


class PresetMixin:
    """`preset`, `tiny` and `realistic` constructors for a frozen Config dataclass.

    The Config sets `PRESETS: ClassVar = {name: {field: value}}`; its docstring says what
    each preset is.
    """

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    @classmethod
    def preset(cls, name: str, **overrides):
        """cls(**PRESETS[name], **overrides), with errors naming the unknown preset or field."""
        return make_preset(cls, name, cls.PRESETS, overrides)

    @classmethod
    def tiny(cls, **overrides):
        """CPU-test shapes (PRESETS["tiny"]): a decode compiles and runs in seconds."""
        return cls.preset("tiny", **overrides)

    @classmethod
    def realistic(cls, **overrides):
        """GPU benchmark shapes (PRESETS["realistic"])."""
        return cls.preset("realistic", **overrides)

    @property
    def record_bytes(self) -> int:
        """Bytes of one record: page_size x record_width x itemsize."""
        return self.page_size * self.record_width * self.dtype.itemsize

    @property
    def num_records(self) -> int:
        """Records (pages) a stream can seal: max_context // page_size."""
        return context_records(self)

    def store_config(self, num_layers: int, stream_shape: tuple[int, ...]) -> CacheConfig:
        """The CacheConfig of a store of `num_layers` layers over streams of `stream_shape`."""
        return CacheConfig(
            num_layers=num_layers,
            stream_shape=stream_shape,
            pool_records=pool_records(self),
            hot_slots=self.hot_slots,
            top_k=self.top_k,
            record_width=self.record_width,
            page_size=self.page_size,
            dtype=self.dtype,
        )


# --------------------------------------------------------------------------- weight init


def init_normal(seed: int, specs: dict[str, tuple[tuple[int, ...], int]], dtype) -> dict[str, jax.Array]:
    """Normal(0, 1/fan_in) parameters from one seeded jax.random draw: {name: (shape, fan_in)} -> {name: array}.

    One flat draw instead of one per parameter: XLA:CPU compiles each threefry kernel for
    seconds, so a draw per parameter costs tens of seconds of compile in CPU tests. The jitted
    draw is keyed on the shapes alone, so configs that differ only in cache sizes share it.
    """
    names = tuple(specs)
    shapes = tuple(tuple(int(d) for d in specs[n][0]) for n in names)
    scales = tuple(1.0 / math.sqrt(specs[n][1]) for n in names)
    arrays = _draw(shapes, scales, np.dtype(dtype), seed)
    return dict(zip(names, arrays))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _draw(shapes, scales, dtype, seed):
    sizes = [math.prod(s) for s in shapes]
    flat = jax.random.normal(jax.random.key(seed), (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    return tuple(
        (flat[o : o + n] * scale).astype(dtype).reshape(s)
        for o, n, s, scale in zip(offsets, sizes, shapes, scales)
    )


def init_normal_host(seed: int, specs: dict[str, tuple[tuple[int, ...], int]], dtype) -> dict[str, jax.Array]:
    """init_normal's contract, drawn on the host with NumPy (no compile at all).

    Parameter i of `specs` comes from np.random.default_rng([seed, i]), so its values depend
    on its position in `specs`, not on the other parameters' shapes. (DSA's weights; the GQA
    families use init_normal. The two draw different values for one seed.)
    """
    out = {}
    for i, (name, (shape, fan_in)) in enumerate(specs.items()):
        rng = np.random.default_rng([int(seed), i])
        values = rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(fan_in))
        out[name] = jnp.asarray(values.astype(dtype))
    return out


def commit(tree, sharding=None):
    """Every array of `tree` committed: device-memory leaves to `sharding` (default: where
    they are), host-memory leaves (the pinned pool) where they are.

    Fresh jnp arrays are uncommitted while arrays out of a jitted prefill are
    committed; jit keys its cache on that, so a state built by init_state must
    match what prefill and generate return, or the first generate compiles twice.
    Tracers (init_state under jax.eval_shape, for byte accounts) pass through.
    """

    def place(x):
        if isinstance(x, jax.core.Tracer):
            return x
        stay = sharding is None or jax.typeof(x).memory_space == jax.memory.Space.Host
        return jax.device_put(x, x.sharding if stay else sharding)

    return jax.tree.map(place, tree)


def stack_for_scan(tree, groups: int):
    """Reshapes every leaf [L, ...] to [groups, L // groups, ...] (a nested layer scan)."""
    return jax.tree.map(lambda a: a.reshape(groups, a.shape[0] // groups, *a.shape[1:]), tree)


# --------------------------------------------------------------------------- layers


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x [..., d] * scale [d] / rms(x), computed in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
    """LayerNorm over the last dim, in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    centered = x32 - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    y = centered * jax.lax.rsqrt(var + eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotary embedding (rotate-half) of x [..., d] at positions broadcastable to x.shape[:-1]."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[..., None] * freq
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def embed(table: jax.Array, tokens: jax.Array) -> jax.Array:
    """table [V, D], tokens [...] int32 -> [..., D]."""
    return jnp.take(table, tokens, axis=0)


def unembed(x: jax.Array, table: jax.Array) -> jax.Array:
    """x [..., D] @ table [D, V] -> logits [..., V] float32."""
    return jnp.einsum("...d,dv->...v", x, table, preferred_element_type=jnp.float32)


def lm_head(weights: Any, x: jax.Array, eps: float) -> jax.Array:
    """x [..., D] -> logits [..., V] float32: weights.final_norm [D], then weights.unembed [D, V]."""
    with jax.named_scope("unembed"):
        return unembed(rms_norm(x, weights.final_norm, eps), weights.unembed)


def mlp(w: Any, x: jax.Array, eps: float) -> jax.Array:
    """The MLP branch of a layer: SwiGLU(rms_norm(x, w.mlp_norm)) with w.w_gate, w.w_up, w.w_down."""
    return swiglu(rms_norm(x, w.mlp_norm, eps), w.w_gate, w.w_up, w.w_down)


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """x [..., D]; w_gate, w_up [D, F]; w_down [F, D] -> [..., D]."""
    gate = jnp.einsum("...d,df->...f", x, w_gate)
    up = jnp.einsum("...d,df->...f", x, w_up)
    return jnp.einsum("...f,fd->...d", jax.nn.silu(gate) * up, w_down)


# --------------------------------------------------------------------------- paged KV bookkeeping


def tail_valid(positions: jax.Array, page_size: int) -> jax.Array:
    """[*S, P] bool: tail slots holding tokens of the open page once `positions` [*S] is written."""
    return jnp.arange(page_size, dtype=jnp.int32) <= (positions % page_size)[..., None]


def tail_write(tail: jax.Array, record: jax.Array, positions: jax.Array) -> jax.Array:
    """tail [*S, P, W] with record [*S, W] written at slot positions % P ([*S] int32)."""
    page_size = tail.shape[-2]
    at = jnp.arange(page_size, dtype=jnp.int32) == (positions % page_size)[..., None]
    return jnp.where(at[..., None], record[..., None, :].astype(tail.dtype), tail)


def seal_full_pages(store: RecordStore, tail: jax.Array, new_lengths: jax.Array) -> RecordStore:
    """Writes each stream's open page as its next sealed record when it just filled up.

    Args:
      tail: [L, *S, P, W] open pages of every layer.
      new_lengths: [*S] int32 tokens per stream after this step; a page seals
        when new_lengths % P == 0 (page_size 1: every step).
    """
    page_size = tail.shape[-2]
    count = (new_lengths % page_size == 0).astype(jnp.int32)
    return kv_store.write_sealed(store, tail[..., None, :, :], count)


def prefill_pages(kv: jax.Array, lengths: jax.Array, page_size: int):
    """Splits prefill KV into sealed pages and the open page.

    Args:
      kv: [L, *S, T, W] per-token records; T a multiple of page_size.
      lengths: [*S] int32 valid tokens per stream.
    Returns:
      records [L, *S, T // P, P, W], count [*S] int32 (= lengths // P, the sealed
      pages), tail [L, *S, P, W] (tokens of page lengths // P, zeros past lengths).
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


def select_topk(scores: jax.Array, sealed: jax.Array, k: int) -> jax.Array:
    """Top-k sealed records by score, in ascending id order, padded with -1 at the end.

    Args:
      scores: [*S, R] float, one score per record id.
      sealed: [*S] int32; only ids < sealed are selectable.
    Returns:
      [*S, k] int32. Ties go to the lower id (lax.top_k); with fewer than k
      sealed records the tail is -1. Ascending order makes the attention order
      position order, so a selection always produces the same bits.
    """
    ids = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    selectable = ids < sealed[..., None]
    masked = jnp.where(selectable, scores.astype(jnp.float32), -jnp.inf)
    _, top = jax.lax.top_k(masked, k)
    top = top.astype(jnp.int32)
    big = jnp.iinfo(jnp.int32).max
    ordered = jnp.sort(jnp.where(top < sealed[..., None], top, big), axis=-1)
    return jnp.where(ordered == big, -1, ordered)


def dense_selection(sealed: jax.Array, num_records: int) -> jax.Array:
    """[*S, R] int32: every sealed id in position order, -1 beyond `sealed` [*S]."""
    ids = jnp.arange(num_records, dtype=jnp.int32)
    return jnp.where(ids < sealed[..., None], ids, -1)


def gather_with_tail(
    store: RecordStore, layer: jax.Array, selection: jax.Array, tail: jax.Array, valid_tail: jax.Array
):
    """The tokens one layer attends to: the selected sealed pages, then the open page.

    Args:
      layer: int32 scalar (traced in a layer scan).
      selection: [*S, k] int32 record ids, -1 = padding.
      tail: [*S, P, W] open page; valid_tail: [*S, P] bool.
    Returns:
      tokens [*S, k * P + P, W] (zeros at padding), valid [*S, k * P + P] bool,
      misses [*S] int32 (0 outside "hisparse"), the updated store.
    """
    records, valid, result, store = kv_store.gather_selected(store, layer, selection)
    *streams, k, P, W = records.shape
    tokens = jnp.concatenate([records.reshape(*streams, k * P, W), tail.astype(records.dtype)], axis=-2)
    valid = jnp.concatenate([jnp.repeat(valid, P, axis=-1), valid_tail], axis=-1)
    misses = result.misses if result is not None else jnp.zeros(selection.shape[:-1], jnp.int32)
    return tokens, valid, misses, store


# --------------------------------------------------------------------------- attention


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, valid: jax.Array, scale: float) -> jax.Array:
    """Masked softmax attention in float32 with a fixed op order.

    Args:
      q: [*S, h, d]; keys: [*S, n, d]; values: [*S, n, dv]; valid: [*S, n] bool
        (at least one True per stream: the current token).
    Returns:
      [*S, h, dv] float32. Invalid entries get probability exactly 0.
    """
    f32 = jnp.float32
    scores = jnp.einsum("...hd,...nd->...hn", q.astype(f32), keys.astype(f32)) * scale
    scores = jnp.where(valid[..., None, :], scores, -jnp.inf)
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return jnp.einsum("...hn,...nv->...hv", probs, values.astype(f32))


def causal_attention(
    q_fn: Callable[[jax.Array], jax.Array],
    keys: jax.Array,
    values: jax.Array,
    scale: float,
    chunk: int,
) -> jax.Array:
    """Dense causal attention for prefill, a chunk of queries at a time.

    Args:
      q_fn: positions [C] int32 -> q [b, C, *G, h, d] for those query positions.
      keys: [b, T, *G, d]; values: [b, T, *G, dv]; T a multiple of `chunk`.
    Returns:
      [b, T, *G, h, dv] float32. Peak memory is one [b, *G, h, C, T] score block.
    """
    T = keys.shape[1]
    f32 = jnp.float32
    key_pos = jnp.arange(T, dtype=jnp.int32)

    def one_chunk(start):
        q_pos = start + jnp.arange(chunk, dtype=jnp.int32)
        q = q_fn(q_pos).astype(f32)
        scores = jnp.einsum("bc...hd,bt...d->b...hct", q, keys.astype(f32)) * scale
        causal = key_pos[None, :] <= q_pos[:, None]  # [C, T]
        scores = jnp.where(causal, scores, -jnp.inf)
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return jnp.einsum("b...hct,bt...v->bc...hv", probs, values.astype(f32))

    starts = jnp.arange(0, T, chunk, dtype=jnp.int32)
    out = jax.lax.map(one_chunk, starts)  # [T // C, b, C, *G, h, dv]
    out = jnp.moveaxis(out, 0, 1)
    return out.reshape(out.shape[0], T, *out.shape[3:])


def prefill_layout(T: int, page_size: int, chunk: int) -> tuple[int, int]:
    """(padded length, query chunk) for a prefill of T tokens.

    The padded length is a multiple of the chunk and of page_size (given a
    chunk that is a multiple of page_size); it may pass max_context, so callers
    keep only the first min(padded, max_context) positions of what they store.
    """
    pages = -(-T // page_size) * page_size
    chunk = min(chunk, pages)
    return -(-pages // chunk) * chunk, chunk


class Prompts(NamedTuple):
    """Embedded prompts, padded for a chunked prefill (see embed_prompts)."""

    x: jax.Array  # [b, T_pad, D] embedded tokens (padding included)
    lengths: jax.Array  # [b] int32 valid tokens per row
    positions: jax.Array  # [T_pad] int32
    chunk: int  # queries per block of the prefill attention
    keep: int  # positions a state stores: min(T_pad, max_context)


def embed_prompts(config: Any, table: jax.Array, prompts: jax.Array, lengths: jax.Array) -> Prompts:
    """Checks T <= max_context, pads prompts [b, T] to prefill_layout's length and embeds them."""
    T = prompts.shape[1]
    require(T <= config.max_context, config, "max_context", f"prompts of T={T} tokens exceed it")
    T_pad, chunk = prefill_layout(T, config.page_size, config.prefill_chunk)
    with jax.named_scope("embed"):
        x = embed(table, jnp.pad(prompts, ((0, 0), (0, T_pad - T))))
    positions = jnp.arange(T_pad, dtype=jnp.int32)
    return Prompts(x, lengths.astype(jnp.int32), positions, chunk, min(T_pad, config.max_context))


def last_token(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x [b, T, ...] at each row's last valid position lengths - 1 -> [b, ...]."""
    return jnp.take_along_axis(x, (lengths - 1).reshape(-1, *([1] * (x.ndim - 1))), axis=1)[:, 0]


# --------------------------------------------------------------------------- sampling

SAMPLING = ("greedy", "sample")


def next_tokens(logits: jax.Array, sampling: str, key: jax.Array) -> jax.Array:
    """logits [b, V] float32 -> [b] int32: argmax (lowest id on ties) or a seeded draw."""
    if sampling == "greedy":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if sampling == "sample":
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")

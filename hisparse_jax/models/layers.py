"""Transformer layers every family shares: norms, rope, embeddings, the MLP and attention.

Conventions: b = batch, T = tokens, D = d_model, V = vocab, *S = stream dims (b, or b x kv_heads),
n = attended tokens. Norms and attention compute in float32 and return the input dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from .config import require


def weight_einsum(spec: str, x: jax.Array, w: jax.Array, **kwargs) -> jax.Array:
    """jnp.einsum(spec, x, w, **kwargs) for activations x times a weight w, spec "...<x>,<w>-><out>"
    with x's leading axes under "...", the same values row for row.

    A decode step of one request has a single row, and XLA turns a one-row matmul into products
    and a reduce: on an H200 those read the weight at ~0.8 TB/s, a fifth of what its GEMMs reach
    (0.34 ms of a 3.3 ms full-KV step at batch 1). A single row is therefore computed as two, the
    second zero, and the first row kept: the weight is still read once, by a GEMM.
    """
    lhs = spec.split(",")[0]
    if not lhs.startswith("..."):
        raise ValueError(f"weight_einsum: the spec must start with '...' (the rows), got {spec!r}")
    lead = x.shape[: x.ndim - (len(lhs) - 3)]
    if math.prod(lead) != 1:
        return jnp.einsum(spec, x, w, **kwargs)
    row = x.reshape(1, *x.shape[len(lead):])
    y = jnp.einsum(spec, jnp.concatenate([row, jnp.zeros_like(row)]), w, **kwargs)
    return y[:1].reshape(*lead, *y.shape[1:])


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x [..., d] * scale [d] / rms(x), computed in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
    """LayerNorm over the last dim, in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    centered = x32 - jnp.mean(x32, axis=-1, keepdims=True)
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


def lm_head(weights: Any, x: jax.Array, eps: float) -> jax.Array:
    """x [..., D] -> logits [..., V] float32: weights.final_norm [D], then weights.unembed [D, V]."""
    with jax.named_scope("unembed"):
        h = rms_norm(x, weights.final_norm, eps)
        return weight_einsum("...d,dv->...v", h, weights.unembed, preferred_element_type=jnp.float32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MLPWeights:
    """A layer's dense SwiGLU MLP (its branch input norm included)."""

    norm: jax.Array  # [D]
    w_gate: jax.Array  # [D, F]
    w_up: jax.Array  # [D, F]
    w_down: jax.Array  # [F, D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelWeights:
    """A model's weights around its layers: nsa's and quest's Weights (dsa's adds its indexers,
    between the layers and the final norm, where its checkpoints have them)."""

    embed: jax.Array  # [V, D]
    layers: tuple[Any, ...]  # L, the family's LayerWeights (quest: dense_layers first)
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


def mlp_specs(config: Any, L: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """{name: (shape, fan_in)} of the dense MLP matrices of L layers; none when the config has
    experts (hisparse_jax.models.moe draws those)."""
    if config.experts:
        return {}
    D, F = config.d_model, config.d_ff
    return {"w_gate": ((L, D, F), D), "w_up": ((L, D, F), D), "w_down": ((L, F, D), F)}


def mlp(w: MLPWeights, x: jax.Array, eps: float) -> jax.Array:
    """The dense MLP branch of a layer: SwiGLU(rms_norm(x, w.norm)) -> [..., D]."""
    h = rms_norm(x, w.norm, eps)
    gate = weight_einsum("...d,df->...f", h, w.w_gate)
    up = weight_einsum("...d,df->...f", h, w.w_up)
    return weight_einsum("...f,fd->...d", jax.nn.silu(gate) * up, w.w_down)


# --------------------------------------------------------------------------- attention


class Part(NamedTuple):
    """One block of attended tokens: keys [*S, n, d], values [*S, n, dv], valid [*S, n] bool."""

    keys: jax.Array
    values: jax.Array
    valid: jax.Array


def attend(q: jax.Array, parts: Sequence[Part], scale: float) -> jax.Array:
    """Masked softmax attention in float32 over several blocks of tokens, with a fixed op order.

    The blocks (e.g. the selected records and the open page) are never concatenated: each
    block's scores are computed where it lies, one softmax spans them all.

    Args:
      q: [*S, h, d].
      parts: blocks of tokens; at least one token valid per stream overall (the current token).
    Returns:
      [*S, h, dv] float32. Invalid tokens get probability exactly 0.
    """
    with jax.named_scope("attend"):  # the step profile tells these matmuls (over KV) from the weights'
        return _attend(q, parts, scale)


def _attend(q: jax.Array, parts: Sequence[Part], scale: float) -> jax.Array:
    f32 = jnp.float32
    q = q.astype(f32)
    scores = [
        jnp.where(p.valid[..., None, :], jnp.einsum("...hd,...nd->...hn", q, p.keys.astype(f32)) * scale, -jnp.inf)
        for p in parts
    ]
    top = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores])
    weights = [jnp.exp(s - top) for s in scores]
    total = functools.reduce(jnp.add, [jnp.sum(w, axis=-1, keepdims=True) for w in weights])
    outs = [jnp.einsum("...hn,...nv->...hv", w / total, p.values.astype(f32)) for w, p in zip(weights, parts)]
    return functools.reduce(jnp.add, outs)


def causal_attention(
    q_fn: Callable[[jax.Array], jax.Array], keys: jax.Array, values: jax.Array, scale: float, chunk: int
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
        scores = jnp.where(key_pos[None, :] <= q_pos[:, None], scores, -jnp.inf)
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return jnp.einsum("b...hct,bt...v->bc...hv", probs, values.astype(f32))

    out = jax.lax.map(one_chunk, jnp.arange(0, T, chunk, dtype=jnp.int32))  # [T // C, b, C, *G, h, dv]
    out = jnp.moveaxis(out, 0, 1)
    return out.reshape(out.shape[0], T, *out.shape[3:])


# --------------------------------------------------------------------------- prompts


class Prompts(NamedTuple):
    """Embedded prompts, padded for a chunked prefill (see embed_prompts)."""

    x: jax.Array  # [b, T_pad, D] embedded tokens (padding included)
    lengths: jax.Array  # [b] int32 valid tokens per row
    positions: jax.Array  # [T_pad] int32
    chunk: int  # queries per block of the prefill attention
    keep: int  # positions a state stores: min(T_pad, max_context)


def embed_prompts(config: Any, table: jax.Array, prompts: jax.Array, lengths: jax.Array) -> Prompts:
    """Checks T <= max_context, pads prompts [b, T] to whole pages and prefill chunks, embeds them.

    The padded length is a multiple of the chunk and of page_size; it may pass max_context, so
    callers store only the first `keep` = min(padded, max_context) positions.
    """
    T = prompts.shape[1]
    require(T <= config.max_context, config, "max_context", f"prompts of T={T} tokens exceed it")
    pages = -(-T // config.page_size) * config.page_size
    chunk = min(config.prefill_chunk, pages)
    T_pad = -(-pages // chunk) * chunk
    with jax.named_scope("embed"):
        x = embed(table, jnp.pad(prompts, ((0, 0), (0, T_pad - T))))
    positions = jnp.arange(T_pad, dtype=jnp.int32)
    return Prompts(x, lengths.astype(jnp.int32), positions, chunk, min(T_pad, config.max_context))


def last_token(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x [b, T, ...] at each row's last valid position lengths - 1 -> [b, ...]."""
    return jnp.take_along_axis(x, (lengths - 1).reshape(-1, *([1] * (x.ndim - 1))), axis=1)[:, 0]

"""GQA transformer pieces shared by the page-granular families (Quest, NSA).

Heads are laid out [..., h, g, hd]: h = KV heads (the stream dim of the store), g = query heads
per KV head (G = n_heads // n_kv_heads). A token's record of one KV head is [rope(k), v],
2 * head_dim wide, in the model dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import common


class GQAConfigMixin(common.PresetMixin):
    """PresetMixin plus the GQA shape properties of a Config with n_heads, n_kv_heads, head_dim."""

    @property
    def group_size(self) -> int:
        """G: query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def record_width(self) -> int:
        """Keys then values of one token of one KV head: 2 * head_dim."""
        return 2 * self.head_dim


def check_heads(config) -> None:
    """n_kv_heads divides n_heads (GQA groups); head_dim is even (rope)."""
    common.require(
        config.n_heads % config.n_kv_heads == 0, config, "n_kv_heads",
        f"n_kv_heads={config.n_kv_heads} must divide n_heads={config.n_heads} (GQA groups)",
    )
    common.require(config.head_dim % 2 == 0, config, "head_dim", f"must be even (rope), got {config.head_dim}")


def scale(config) -> float:
    """Attention logit scale 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(config.head_dim)


def query(h: jax.Array, w_q: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """h [b, ..., D], w_q [D, h, g, hd], positions [b, ...] -> rope(q) [b, ..., h, g, hd] in h.dtype."""
    q = jnp.einsum("...d,dhgk->...hgk", h, w_q)
    return common.rope(q, positions[..., None, None], theta)


def kv_record(h: jax.Array, w_k: jax.Array, w_v: jax.Array, positions: jax.Array, theta: float, dtype):
    """h [b, ..., D], w_k/w_v [D, h, hd], positions [b, ...] -> [b, ..., h, 2hd] = [rope(k), v] in dtype."""
    k = common.rope(jnp.einsum("...d,dhk->...hk", h, w_k), positions[..., None], theta)
    v = jnp.einsum("...d,dhk->...hk", h, w_v)
    return jnp.concatenate([k, v], axis=-1).astype(dtype)


def attention_out(heads: jax.Array, w_o: jax.Array, dtype) -> jax.Array:
    """heads [..., h, g, hd] (float32), w_o [h, g, hd, D] -> [..., D] in dtype."""
    return jnp.einsum("...hgk,hgkd->...d", heads.astype(dtype), w_o)


def per_stream(x: jax.Array, kv_heads: int) -> jax.Array:
    """[b] -> [b, kv_heads]: a per-request value broadcast to the (b, kvh) stream shape."""
    return jnp.broadcast_to(x[:, None], (x.shape[0], kv_heads))

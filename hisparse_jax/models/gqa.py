"""GQA transformer pieces shared by the page-granular families (Quest, NSA).

Heads are laid out [..., h, g, hd]: h = KV heads (the stream dim of the store), g = query heads per
KV head (G = n_heads // n_kv_heads). A token's record of one KV head is [rope(k), v], 2 * head_dim
wide, in the model dtype.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ..config import CacheConfig
from . import layers
from .config import ModelConfig, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class GQAConfig(ModelConfig):
    """ModelConfig plus GQA attention: n_heads query heads over n_kv_heads KV heads of head_dim.

    Streams are (batch, kv_heads): selection is per KV head.
    """

    n_heads: int
    n_kv_heads: int
    head_dim: int

    POSITIVE = ("n_heads", "n_kv_heads", "head_dim")
    RECORD_FIELD = "head_dim"
    RECORD_SHAPE = "page_size x 2 x head_dim"

    def check(self) -> None:
        require(self.n_heads % self.n_kv_heads == 0, self, "n_kv_heads",
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} (GQA groups)")
        require(self.head_dim % 2 == 0, self, "head_dim", f"must be even (rope), got {self.head_dim}")

    @property
    def group_size(self) -> int:
        """G: query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def record_width(self) -> int:
        """Keys then values of one token of one KV head: 2 * head_dim."""
        return 2 * self.head_dim

    def cache_config(self, batch: int, num_layers: int | None = None) -> CacheConfig:
        """The store of `num_layers` (default: every layer) over streams (batch, kv_heads)."""
        return self.store_config(self.num_layers if num_layers is None else num_layers, (batch, self.n_kv_heads))


def layer_specs(config: GQAConfig, L: int, extra: int = 0) -> dict[str, tuple[tuple[int, ...], int]]:
    """{name: (shape, fan_in)} of the attention matrices (w_in, w_o) and dense MLP matrices (none
    with experts: layers.mlp_specs) of a stack of L GQA layers; the input projection has `extra`
    more columns per KV head (see `project`)."""
    D, h, g, hd = config.d_model, config.n_kv_heads, config.group_size, config.head_dim
    return {
        "w_in": ((L, D, h, (g + 2) * hd + extra), D),
        "w_o": ((L, h, g, hd, D), config.n_heads * hd),
        **layers.mlp_specs(config, L),
    }


ATTENTION = ("w_in", "w_o")  # the attention matrices of layer_specs


def scale(config: GQAConfig) -> float:
    """Attention logit scale 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(config.head_dim)


def project(config: GQAConfig, h: jax.Array, w_in: jax.Array, positions: jax.Array):
    """The attention input projection, one matmul for queries, keys, values (and extra columns).

    The projections that read h are one weight matrix w_in [D, kvh, (g + 2) hd + e], per KV head
    the g query heads, then the key, then the value, then e extra columns (NSA's branch gates):
    separate matrices sharing an input get merged by XLA on GPUs, which copies the weights into a
    concatenation every step.

    Args:
      h: [b, ..., D]; positions: [b, ...] int32.
    Returns:
      q [b, ..., kvh, g, hd] float32 (roped), record [b, ..., kvh, 2hd] = [rope(k), v] in
      config.dtype, extra [b, ..., kvh, e] float32.
    """
    g, hd = config.group_size, config.head_dim
    y = layers.weight_einsum("...d,dhn->...hn", h, w_in, preferred_element_type=jnp.float32)
    q = y[..., : g * hd].reshape(*y.shape[:-1], g, hd)
    q = layers.rope(q, positions[..., None, None], config.rope_theta)
    k = layers.rope(y[..., g * hd : (g + 1) * hd], positions[..., None], config.rope_theta)
    v = y[..., (g + 1) * hd : (g + 2) * hd]
    return q, jnp.concatenate([k, v], axis=-1).astype(config.dtype), y[..., (g + 2) * hd :]


def split(config: GQAConfig):
    """Record tokens [..., 2hd] -> (keys [..., hd], values [..., hd])."""
    hd = config.head_dim
    return lambda records: (records[..., :hd], records[..., hd:])


def attention_out(heads: jax.Array, w_o: jax.Array, dtype) -> jax.Array:
    """heads [..., h, g, hd] (float32), w_o [h, g, hd, D] -> [..., D] in dtype."""
    return layers.weight_einsum("...hgk,hgkd->...d", heads.astype(dtype), w_o)


def per_stream(x: jax.Array, kv_heads: int) -> jax.Array:
    """[b] -> [b, kv_heads]: a per-request value broadcast to the (b, kvh) stream shape."""
    return jnp.broadcast_to(x[:, None], (x.shape[0], kv_heads))

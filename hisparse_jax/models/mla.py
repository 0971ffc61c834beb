"""MLA (multi-head latent attention) in absorbed form: the attention of the research kit's model
(hisparse_jax.kit), so of DSA.

A token's KV record is its compressed latent c [kv_lora_rank] concatenated with a shared rope key
[qk_rope_dim]; queries are absorbed into latent space (q_nope @ w_uk), so attention scores are
q . record and the read-out projects the attended latent through w_uv and w_o. The decode
(hisparse_jax/kit/model.py) and the training forward (train/forward.py) share these pieces, so
the model they train is the model that decodes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from . import layers, products

if TYPE_CHECKING:
    from ..kit.config import MLAConfig
    from ..kit.weights import LayerWeights


def query(config: MLAConfig, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [..., D] at positions (broadcast to h.shape[:-1]) -> absorbed q [..., H, dc + dr] float32.
    w.w_q / w.w_q_a (and w.w_kv in kv_record) may be products.Product of h (kit.inputs.apply)."""
    if config.q_lora_rank:
        latent = layers.rms_norm(products.project("...d,dr->...r", h, w.w_q_a), w.q_norm, config.norm_eps)
        q = layers.weight_einsum("...r,rhe->...he", latent, w.w_q_b)
    else:
        q = products.project("...d,dhe->...he", h, w.w_q)
    q_nope, q_rope = q[..., : config.qk_nope_dim], q[..., config.qk_nope_dim :]
    q_rope = layers.rope(q_rope, positions[..., None], config.rope_theta)
    q_latent = layers.weight_einsum("...hn,hnc->...hc", q_nope, w.w_uk, preferred_element_type=jnp.float32)
    return jnp.concatenate([q_latent, q_rope.astype(jnp.float32)], axis=-1)


def kv_record(config: MLAConfig, w: LayerWeights, h: jax.Array, positions: jax.Array) -> jax.Array:
    """h [..., D] -> record [..., dc + dr] in config.dtype: [rms-normed latent c, rope key]."""
    kv = products.project("...d,dw->...w", h, w.w_kv)
    latent = layers.rms_norm(kv[..., : config.kv_lora_rank], w.kv_norm, config.norm_eps)
    k_rope = layers.rope(kv[..., config.kv_lora_rank :], positions, config.rope_theta)
    return jnp.concatenate([latent, k_rope], axis=-1).astype(config.dtype)


def attention_out(config: MLAConfig, w: LayerWeights, latent: jax.Array) -> jax.Array:
    """Attention read-out in latent space latent [..., H, dc] float32 -> [..., D]."""
    heads = layers.weight_einsum("...hc,hcv->...hv", latent.astype(config.dtype), w.w_uv)
    return layers.weight_einsum("...hv,hvd->...d", heads, w.w_o)


def scale(config: MLAConfig) -> float:
    """The softmax scale of MLA attention: 1 / sqrt of the full query-key head width (nope + rope)."""
    return 1.0 / math.sqrt(config.qk_nope_dim + config.qk_rope_dim)


def split_record(config: MLAConfig):
    """Record tokens [..., dc + dr] -> (keys: the whole record, values: the latent c)."""
    return lambda records: (records, records[..., : config.kv_lora_rank])

"""The kit model's weights: MLA layers (one buffer per layer), the indexer's parameters per group.

`Weights.indexers[g]` holds selecting group g's indexer parameters, whatever pytree the indexer
makes (`Indexer.init_params`); the family lists "indexers" as its selection weights, so
models.weights.weight_bytes counts them as the "indexer" component.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..models import layers, moe
from ..models.weights import init_normal, ones, split_layers
from . import checks

SELECTION_WEIGHTS = ("indexers",)  # weights.weight_bytes: the indexers select records


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer's weights: the query projection is w_q (q_lora_rank = 0) or w_q_a, q_norm, w_q_b
    (the others None); the feed-forward branch is mlp (experts = 0) or moe (the other None). In
    the decode layout (kit.inputs.merge) w_q / w_q_a and w_kv live in `inputs`."""

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
    # kit.inputs.MergedInputs: the input projections (w_q or w_q_a, w_kv, at an anchor layer the
    # indexer's input weights) in one matrix, those fields then None; None as drawn and in
    # checkpoints (a None field has no leaves: the checkpoint layout is unchanged).
    inputs: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    embed: jax.Array  # [V, D]
    layers: tuple[LayerWeights, ...]  # L
    indexers: tuple  # G: each group's indexer parameters
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, V]


def mla_specs(config) -> dict[str, tuple[tuple[int, ...], int]]:
    """{name: (shape [L, ...], fan_in)} of the embedding and every layer's MLA and dense-MLP
    matrices, in the order they are drawn (the unembedding, drawn last, is the caller's)."""
    c = config
    L, D, H, r = c.num_layers, c.d_model, c.n_heads, c.q_lora_rank
    dc, dn, dr, dv = c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim
    query = ({"w_q_a": ((L, D, r), D), "w_q_b": ((L, r, H, dn + dr), r)} if r else
             {"w_q": ((L, D, H, dn + dr), D)})
    return {
        "embed": ((c.vocab, D), D),
        **query,
        "w_kv": ((L, D, dc + dr), D),
        "w_uk": ((L, H, dn, dc), dn),
        "w_uv": ((L, H, dc, dv), dc),
        "w_o": ((L, H, dv, D), H * dv),
        **layers.mlp_specs(c, L),
    }


def unembed_spec(config) -> dict[str, tuple[tuple[int, ...], int]]:
    return {"unembed": ((config.d_model, config.vocab), config.d_model)}


def assemble(config, seed: int, drawn: dict[str, jax.Array], indexers: tuple) -> Weights:
    """Weights from the draw of mla_specs + unembed_spec (norms at 1) and the groups' indexer
    parameters."""
    c, dt = config, config.dtype
    L, D = c.num_layers, c.d_model
    query = ("w_q_a", "w_q_b") if c.q_lora_rank else ("w_q",)
    attention = {n: drawn[n] for n in (*query, "w_kv", "w_uk", "w_uv", "w_o")}
    attention.update(attn_norm=ones((L, D), dt), kv_norm=ones((L, c.kv_lora_rank), dt))
    if c.q_lora_rank:
        attention.update(q_norm=ones((L, c.q_lora_rank), dt))
    absent = dict.fromkeys({"w_q", "w_q_a", "q_norm", "w_q_b"} - set(attention))
    feed_forward = moe.feed_forward_weights(c, seed, drawn)
    return Weights(
        embed=drawn["embed"],
        layers=tuple(LayerWeights(**a, **absent, **f) for a, f in zip(split_layers(attention, L, dict), feed_forward)),
        indexers=tuple(indexers), final_norm=ones((D,), dt), unembed=drawn["unembed"],
    )


def group_seed(seed: int, group: int) -> int:
    """Selecting group `group`'s seed for Indexer.init_params: independent of the model's draw
    and of the other groups', the same for every config of the same seed."""
    return int(np.random.SeedSequence([int(seed), 25, int(group)]).generate_state(1)[0] & 0x7FFFFFFF)


def init_weights(config, seed: int = 0) -> Weights:
    """Seeded random weights (normal with 1/fan_in variance, norms at 1) on the default device;
    each group's indexer parameters from `config.indexer.init_params(config, group_seed(...))`."""
    drawn = init_normal(seed, {**mla_specs(config), **unembed_spec(config)}, config.dtype)
    indexer = config.indexer
    groups = tuple(checks.params(indexer, config, group_seed(seed, g)) for g in range(config.groups))
    return assemble(config, seed, drawn, groups)


"""One registry of named model shapes: every preset a family, the trainer or a deployment slice names.

- FAMILY_PRESETS[family][preset]: each family's Config presets ("tiny": CPU tests in seconds;
  "realistic": GPU benchmark shapes), read as Config.PRESETS (Config.tiny(), Config.preset()).
- TRAINED_MODELS[name]: the DSA models hisparse_jax.train fits (`--model`).
- DEPLOYMENT_SLICES[deployment]: the family Config fields of one GPU's share of a deployment
  (hisparse_jax.bench.deployments; num_layers, vocab and max_context are derived per slice).
`named_shapes()` lists them all under one name each ("dsa/tiny", "train/trace-model",
"deployment/glm5-h200"). Plain data: this module imports no family.
"""

from __future__ import annotations

from typing import Any, Mapping

FAMILY_PRESETS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    "dsa": {
        "tiny": dict(
            vocab=256, d_model=64, num_layers=4, n_heads=4, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
            kv_lora_rank=32, d_ff=128, index_heads=4, index_dim=16, top_k=16, hot_slots=32, max_context=256,
            prefill_chunk=64, dtype="float32",
        ),
        "realistic": dict(
            vocab=32000, d_model=2048, num_layers=4, n_heads=16, qk_nope_dim=128, qk_rope_dim=64,
            v_head_dim=128, kv_lora_rank=512, d_ff=5632, index_heads=64, index_dim=128, top_k=2048,
            hot_slots=4096, max_context=32768, prefill_chunk=256, dtype="bfloat16",
        ),
    },
    "nsa": {
        "tiny": dict(
            vocab=256, d_model=64, num_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, cmp_block=8,
            cmp_stride=4, page_size=16, top_k=3, hot_slots=6, window=32, max_context=256, prefill_chunk=64,
            dtype="float32",
        ),
        # NSA paper attention: 64 query heads in 4 GQA groups, l = 32, d = 16, l' = 64, n = 16, w = 512.
        "realistic": dict(
            vocab=32000, d_model=4096, num_layers=4, n_heads=64, n_kv_heads=4, head_dim=128, d_ff=11008,
            cmp_block=32, cmp_stride=16, page_size=64, top_k=15, hot_slots=32, window=512, max_context=32768,
            prefill_chunk=128, dtype="bfloat16",
        ),
    },
    "quest": {
        "tiny": dict(
            vocab=256, d_model=64, num_layers=4, dense_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
            top_k=4, hot_slots=8, max_context=256, prefill_chunk=64, dtype="float32",
        ),
        # Llama-3-8B attention and MLP shapes; 2 dense + 4 sparse layers; a 4096-token budget.
        "realistic": dict(
            vocab=32000, d_model=4096, num_layers=6, dense_layers=2, n_heads=32, n_kv_heads=8, head_dim=128,
            d_ff=14336, top_k=256, hot_slots=512, max_context=32768, prefill_chunk=256, dtype="bfloat16",
        ),
    },
}


# The DSA models hisparse_jax.train fits (dsa.Config fields): the model the shipped trace comes
# from (docs/training.md), and a CPU-test size.
TRAINED_MODELS = {
    "trace-model": dict(
        vocab=256, d_model=384, num_layers=6, n_heads=8, qk_nope_dim=32, qk_rope_dim=32, v_head_dim=32,
        kv_lora_rank=128, d_ff=512, index_heads=4, index_dim=64, index_rope_dim=32, top_k=2048, hot_slots=4096, max_context=16384,
        prefill_chunk=256, rope_theta=500000.0, dtype="bfloat16",
    ),
    "tiny": dict(
        vocab=256, d_model=64, num_layers=2, n_heads=4, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=16,
        kv_lora_rank=32, d_ff=128, index_heads=2, index_dim=16, index_rope_dim=8, top_k=16, hot_slots=32, max_context=128,
        prefill_chunk=32, dtype="float32",
    ),
}

# What the DeepSeek-V3-style DSA deployments share: MLA records, the fp8 indexer's keys, k and B,
# and 256 fp8 routed experts (8 per token, one shared) over 8 GPUs: 32 on each.
MLA_DSA_EP8 = dict(kv_lora_rank=512, qk_rope_dim=64, index_dim=128, index_dtype="fp8", top_k=2048,
                   hot_slots=4096, dtype="bfloat16", prefill_chunk=256, experts=32, experts_per_token=8,
                   expert_d_ff=2048, shared_experts=1, expert_groups=8, expert_dtype="fp8", routed_scaling=2.5)

# Each deployment slice's family Config fields of one GPU's share (everything but num_layers,
# vocab and max_context, which the slice derives; hisparse_jax.bench.deployments).
DEPLOYMENT_SLICES = {
    "glm5-h200": dict(MLA_DSA_EP8, d_model=6144, n_heads=64, qk_nope_dim=192, v_head_dim=256, q_lora_rank=2048,
                       index_heads=32),
    "dsv32-h200": dict(MLA_DSA_EP8, d_model=7168, n_heads=128, qk_nope_dim=128, v_head_dim=128, q_lora_rank=1536,
                       index_heads=64),
    "qwen3-quest-h200": dict(
        d_model=2048, n_heads=32, n_kv_heads=4, head_dim=128, dense_layers=0,
        page_size=16, top_k=128, hot_slots=256, experts=128, experts_per_token=8, expert_d_ff=768,
        shared_experts=0, expert_groups=1, routed_scaling=1.0, dtype="bfloat16", prefill_chunk=256,
    ),
}

# The family of each trained model and deployment slice.
TRAINED_FAMILY = "dsa"
DEPLOYMENT_FAMILIES = {"glm5-h200": "dsa", "dsv32-h200": "dsa", "qwen3-quest-h200": "quest"}


def named_shapes() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Every named shape: "group/name" -> (family name, its Config fields)."""
    out: dict[str, tuple[str, Mapping[str, Any]]] = {}
    entries = [(f"{family}/{preset}", family, fields)
               for family, presets in FAMILY_PRESETS.items() for preset, fields in presets.items()]
    entries += [(f"train/{name}", TRAINED_FAMILY, fields) for name, fields in TRAINED_MODELS.items()]
    entries += [(f"deployment/{name}", DEPLOYMENT_FAMILIES[name], fields) for name, fields in DEPLOYMENT_SLICES.items()]
    for name, family, fields in entries:
        if name in out:
            raise ValueError(f"shapes: {name!r} is named twice")
        out[name] = (family, fields)
    return out


def get_shape(name: str) -> tuple[str, Mapping[str, Any]]:
    """(family name, Config fields) of the shape called `name` ("dsa/tiny", ...)."""
    shapes = named_shapes()
    if name not in shapes:
        raise ValueError(f"unknown shape {name!r}; shapes: {', '.join(shapes)}")
    return shapes[name]

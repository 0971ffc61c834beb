"""Kernel categories (hisparse_jax.bench.kernel_categories): HLO instructions carry their model
scope, and each kernel falls in its category."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from hisparse_jax import decode
from hisparse_jax.bench import kernel_categories
from hisparse_jax.models import dsa


def _compiled_step_hlo():
    config = dsa.Config.tiny(num_layers=2, top_k=8, hot_slots=10)
    weights = dsa.init_weights(config)
    state = dsa.init_state(config, 2, "device")
    traced = decode.trace_generate("dsa", config, weights, state, jnp.zeros((2,), jnp.int32), 2)
    return traced.lower().compile().as_text()


def test_instructions_carry_their_model_scope():
    instructions = kernel_categories.hlo_instructions(_compiled_step_hlo())
    scopes = " ".join(i.scope for i in instructions.values())
    for scope in ("decode_step", "indexer", "attention", "attend", "mlp"):
        assert f"/{scope}" in scopes, scope
    assert any(i.opcode == "fusion" and i.fused_ops for i in instructions.values())


@pytest.mark.parametrize(
    "kernel, instruction, category",
    [
        ("ResolveKernel<4096>", None, "resolve"),
        ("FetchKernel", None, "IO"),
        ("void hisparse::TopkKernel", kernel_categories.Instruction("custom-call", "x/indexer", "hisparse_topk", ()), "top-k"),
        ("loop_fusion_3", kernel_categories.Instruction("fusion", "jit(f)/decode_step/indexer/max", "", ("reduce",)), "indexer"),
        ("void hisparse::IndexScoresKernel<1>", None, "indexer"),
        ("gemm_fusion_dot_3", kernel_categories.Instruction("fusion", "jit(f)/decode_step/indexer/dot_general", "", ("dot",)),
         "weights/FFN"),
        ("gemm_fusion_dot_4", kernel_categories.Instruction("fusion", "jit(f)/decode_step/attention/attend/dot_general", "",
                                                  ("dot",)), "attention"),
        ("sm90_xmma_gemm_bf16", kernel_categories.Instruction("custom-call", "jit(f)/decode_step/mlp/dot", "__cublas$gemm", ()),
         "weights/FFN"),
        ("input_reduce_fusion", kernel_categories.Instruction("fusion", "jit(f)/decode_step/attention/reduce", "", ("reduce",)),
         "attention"),
        ("loop_dynamic_slice_fusion", kernel_categories.Instruction("fusion", "jit(f)/while/body", "",
                                                          ("parameter", "dynamic-slice")), "copies"),
        ("memcpy32_post", None, "copies"),
        ("loop_select_fusion", kernel_categories.Instruction("fusion", "jit(f)/decode_step/sample", "", ("select",)), "other"),
    ],
)
def test_kernels_fall_in_their_category(kernel, instruction, category):
    assert kernel_categories.classify(kernel, instruction) == category

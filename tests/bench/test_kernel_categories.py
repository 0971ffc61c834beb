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
        # the sparse attention custom call's kernels, named as the H200 profile names them
        ("void hisparse::(anonymous namespace)::ChunkKernel<4>(hisparse::(anonymous namespace)::ChunkArgs)", None,
         "attention"),
        ("hisparse::(anonymous namespace)::CombineKernel(unsigned short const*, unsigned short const*)", None,
         "attention"),
        ("ChunkKernel", None, "other"),  # another library's kernel of that name
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
        # a dot XLA rewrote as products and a reduce (MLA's query absorption at batch 1, H200)
        ("input_concatenate_fusion_7", kernel_categories.Instruction(
            "fusion", "jit(f)/decode_step/mla_project/concatenate", "", ("parameter", "convert", "multiply", "reduce"),
            ("jit(f)/decode_step/mla_project/...hn,hnc->...hc/dot_general",)), "weights/FFN"),
        ("input_reduce_fusion_65", kernel_categories.Instruction(
            "fusion", "jit(f)/decode_step/attention/x", "", ("multiply", "reduce"),
            ("jit(f)/decode_step/attention/attend/...hd,...nd->...hn/dot_general",)), "attention"),
        ("loop_select_fusion", kernel_categories.Instruction("fusion", "jit(f)/decode_step/sample", "", ("select",)), "other"),
    ],
)
def test_kernels_fall_in_their_category(kernel, instruction, category):
    assert kernel_categories.classify(kernel, instruction) == category


# The shape of the H200's compiled glm5-h200 full-KV step at batch 1 (256K), cut to one fusion: the
# query absorption's dot became products and a reduce in a fusion named after a concatenate.
_REWRITTEN_DOT_HLO = """HloModule jit__generate_program

%region_add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%a, %b)
}

%fused_concatenate.7 (param_0.1: bf16[64,192,512], param_1.1: f32[64,192]) -> f32[64,512] {
  %param_0.1 = bf16[64,192,512]{2,1,0} parameter(0)
  %convert.2 = f32[64,192,512]{2,1,0} convert(%param_0.1), metadata={op_name="jit(_generate_program)/decode_step/mla_project/...hn,hnc->...hc/dot_general"}
  %param_1.1 = f32[64,192]{1,0} parameter(1)
  %broadcast.1 = f32[64,192,512]{2,1,0} broadcast(%param_1.1), dimensions={0,1}
  %multiply.1 = f32[64,192,512]{2,1,0} multiply(%convert.2, %broadcast.1), metadata={op_name="jit(_generate_program)/decode_step/mla_project/...hn,hnc->...hc/dot_general"}
  %constant.1 = f32[] constant(0)
  ROOT %reduce.45 = f32[64,512]{1,0} reduce(%multiply.1, %constant.1), dimensions={1}, to_apply=%region_add, metadata={op_name="jit(_generate_program)/decode_step/mla_project/...hn,hnc->...hc/dot_general"}
}

ENTRY %main (w: bf16[64,192,512], q: f32[64,192]) -> f32[64,512] {
  %w = bf16[64,192,512]{2,1,0} parameter(0)
  %q = f32[64,192]{1,0} parameter(1)
  ROOT %input_concatenate_fusion.7 = f32[64,512]{1,0} fusion(%w, %q), kind=kInput, calls=%fused_concatenate.7, metadata={op_name="jit(_generate_program)/decode_step/mla_project/concatenate"}
}
"""


def test_a_dot_rewritten_as_a_reduce_reads_weights():
    instructions = kernel_categories.hlo_instructions(_REWRITTEN_DOT_HLO)
    found = instructions["input_concatenate_fusion_7"]
    assert found.fused_dot_scopes and "reduce" in found.fused_ops
    assert kernel_categories.classify("input_concatenate_fusion_7", found) == "weights/FFN"
    assert kernel_categories.classify("add", instructions["add.1"]) == "other"

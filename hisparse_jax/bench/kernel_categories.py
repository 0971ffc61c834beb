"""The categories a decode step's device time is summed in, and which category a kernel is.

  weights/FFN   matmuls that read weights (projections, MLP, read-out, unembedding, the
                indexer's projections)
  attention     the attention over the selected records and the open page (the `attend` scope,
                or the sparse attention custom call's kernels), and the rest of the attention
                scopes (gathers, softmax)
  indexer       the indexer's scoring (DSA's lightning indexer, Quest's page bounds)
  top-k         the selection of the top-k records
  resolve, IO   RESOLVE's resolve kernel and its record copy (the split plan's fetch kernel;
                the fused plan copies inside the resolve kernel, so IO shows under resolve)
  copies        copies, slices and pads the compiler materialized
  other         the rest (embedding, sampling, sealing, small fusions)

A kernel is known by its name and by the HLO instruction it ran for (`Instruction`, read from the
compiled program by `hlo_instructions`): the instruction's opcode, the named scope of the model
code it came from, its custom-call target and, for a fusion, what it fuses.

A matmul is a matmul whatever the compiler made of it: XLA may rewrite a dot whose batch leaves
one row (MLA's query absorption at batch 1: q [H, 192] x w_uk [H, 192, 512]) into elementwise
products and a reduce, fused into a kernel named after another op (`input_concatenate_fusion`).
Such a fusion still reads the weight, so a reduce fused from a `dot_general` counts as the dot.
"""

from __future__ import annotations

import dataclasses
import re

from .. import hlo

CATEGORIES = ("weights/FFN", "attention", "indexer", "top-k", "resolve", "IO", "copies", "other")

_GEMM = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|matmul|\bdot\b|sm\d+_", re.IGNORECASE)
_COPY_OPS = ("copy", "dynamic-slice", "slice", "pad", "concatenate", "transpose")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """What the compiled program says about one HLO instruction."""

    opcode: str
    scope: str  # the op_name metadata: jit(...)/while/body/decode_step/indexer/...
    target: str  # custom_call_target, or ""
    fused_ops: tuple[str, ...]  # opcodes inside a fusion
    fused_dot_scopes: tuple[str, ...] = ()  # scopes of the reduces inside a fusion that came from a dot_general


def hlo_instructions(program: str | hlo.Module) -> dict[str, Instruction]:
    """Instruction name -> Instruction, from compiled HLO text or its parsed Module (fusions know
    what they fuse)."""
    module = hlo.parse(program) if isinstance(program, str) else program
    out = {}
    for inst in module.instructions.values():
        body = inst.fusion_body
        fused, dots = (), ()
        if inst.opcode == "fusion" and body in module.computations:
            fused = tuple(i.opcode for i in module.computations[body])
            dots = tuple(i.scope for i in module.computations[body]
                         if i.opcode == "reduce" and i.scope.endswith("/dot_general"))
        found = Instruction(inst.opcode, inst.scope, inst.target, fused, dots)
        out[inst.name] = found
        out.setdefault(inst.name.replace(".", "_"), found)  # how kernels are named after instructions
    return out


def classify(kernel: str, instruction: Instruction | None) -> str:
    """The category of one kernel launch (CATEGORIES).

    Custom calls by their kernels; then copies; then matmuls: those over attended KV (the
    `attend` scope) are attention, every other one reads weights; the rest by model scope.
    """
    inst = instruction or Instruction("", "", "", ())
    scope = inst.scope.lower()
    name = kernel.lower()
    text = f"{name} {inst.target}".lower()
    if "hisparse_resolve" in text or "resolvekernel" in name or "fetchkernel" in name:
        return "IO" if "fetchkernel" in name else "resolve"
    if "hisparse_topk" in text or "topk" in name or "sort" in name:
        return "top-k"
    if "hisparse_index_scores" in text or "indexscores" in name:
        return "indexer"
    # the sparse attention custom call's kernels (ffi/sparse_attention_kernels.cu): a custom
    # call's kernels carry their CUDA names, not the instruction's
    if "hisparse_sparse_attention" in text or re.search(r"hisparse::.*\b(chunkkernel|combinekernel)\b", name):
        return "attention"
    if inst.opcode in _COPY_OPS or "memcpy" in name or "dynamic_slice" in name or (
        inst.opcode == "fusion" and inst.fused_ops
        and set(inst.fused_ops) <= {*_COPY_OPS, "parameter", "bitcast", "constant", "tuple"}
    ):
        return "copies"
    if "/attend" in scope or any("/attend" in s.lower() for s in inst.fused_dot_scopes):
        return "attention"
    if _GEMM.search(kernel) or inst.opcode == "dot" or "gemm" in inst.target.lower() or inst.fused_dot_scopes:
        return "weights/FFN"
    if "/indexer" in scope:
        return "indexer"
    if any(s in scope for s in ("/attention", "/selected", "/window", "/compressed", "/select")):
        return "attention"
    return "other"

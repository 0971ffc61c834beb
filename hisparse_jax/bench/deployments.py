"""Deployment slices: a few layers of a real model with one GPU's proportions.

HiSparse pays off when a GPU's decode step is dominated by work that does not grow with the
batch (weights) while HBM caps the batch of the full-KV baseline. A benchmark with few layers is
faithful only if each of its layers keeps one GPU's share of a real deployment: the weight bytes
a layer reads per step (routed experts under expert parallelism included), the attention heads,
the record and index-key formats, k and B, and the HBM a layer's KV may use.

A `Deployment` holds the public model configuration, the parallelism and the GPU, and derives
(`derive`) the slice: an L-layer Config of the family at one GPU's share, its device budget
(HBM minus weights, per layer, times L: the decode state and the compiled program's working
memory must fit in it), and the numbers behind them. `hisparse-bench decode --deployment NAME
--explain` prints the derivation; docs/deployments.md records the sources.

Modelling choices, each stated in the derivation it affects:
- Data-parallel attention: every GPU holds all attention heads and its own requests' KV, so a
  slice runs the whole attention of a layer for its local batch.
- Expert parallelism over G GPUs: a GPU holds experts / G routed experts per layer and computes
  the tokens every GPU of the group routed to them. The slice lets its local batch stand for each
  GPU's batch (hisparse_jax.models.moe): it computes batch x experts_per_token (token, expert)
  pairs on its local experts, so the expert bytes it reads grow with the batch as on the real GPU.
- The unembedding is shared by all layers of a step: the slice keeps L / num_layers of its
  vocabulary so that its per-step bytes stay in proportion, rounded to a multiple of 128 as the
  models' own vocabularies are (154880, 129280, 151936): an unembedding of an odd number of
  columns (15885 = 8/78 of GLM-5.1's) has rows no 16-byte load or TMA copy can align to, and on
  an H200 XLA's matmul read it at 50-56% of HBM, against 89-98% with 15936 columns
  (benchmarks/projection_bench.py, batch 2 and 17), a cost the deployment's own does not have.
- Everything but the routed experts is replicated on every GPU (attention, shared experts, dense
  layers, embeddings); weights are counted in the dtype the model ships.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ..models import shapes

GB = 1e9
VOCAB_MULTIPLE = 128  # a slice's vocabulary is a multiple of this, like the models' own


@dataclasses.dataclass(frozen=True)
class ModelCard:
    """A public model configuration, as its config.json / paper gives it.

    Attributes:
      params: total parameters; bytes_per_param: 1 (fp8 checkpoints) or 2 (bf16).
      layers: decoder layers; moe_layers: those with routed experts.
      experts: routed experts per MoE layer; expert_params: one expert's parameters
        (3 x d_model x expert_d_ff for SwiGLU).
    """

    name: str
    source: str
    params: float
    bytes_per_param: int
    layers: int
    moe_layers: int
    experts: int
    experts_per_token: int
    expert_d_ff: int
    d_model: int
    vocab: int

    @property
    def expert_params(self) -> int:
        return 3 * self.d_model * self.expert_d_ff

    @property
    def routed_params(self) -> float:
        return self.moe_layers * self.experts * self.expert_params


@dataclasses.dataclass(frozen=True)
class Deployment:
    """One GPU's share of a published deployment, and the slice that keeps its proportions.

    Attributes:
      name: the --deployment name; title: one line naming model, GPUs and parallelism.
      family: the model family of the slice; card: the public model configuration.
      gpus: GPUs of the deployment; expert_parallel: G, GPUs sharing the routed experts.
      gpu, hbm_bytes: the GPU and its HBM (NVIDIA's figure).
      slice_layers: L, the layers the slice runs (host memory must hold the HiSparse pools of
        every run timed together: see docs/deployments.md).
      fields: the family Config fields of one GPU's share (everything but num_layers, vocab and
        max_context, which the derivation and the bench set).
      published: the deployment's published figures, for the report.
      notes: what the slice leaves out, each with its effect.
    """

    name: str
    title: str
    family: str
    card: ModelCard
    gpus: int
    expert_parallel: int
    gpu: str
    hbm_bytes: float
    slice_layers: int
    fields: Mapping[str, Any]
    published: str
    notes: tuple[str, ...] = ()

    def derive(self, layers: int | None = None) -> "Derivation":
        """The slice of `layers` layers (default slice_layers)."""
        c = self.card
        L = self.slice_layers if layers is None else layers
        if not 1 <= L <= c.layers:
            raise ValueError(f"deployment {self.name}: a slice has 1 to {c.layers} layers, got {L}")
        routed_per_gpu = c.routed_params / self.expert_parallel * c.bytes_per_param
        replicated = (c.params - c.routed_params) * c.bytes_per_param
        weights = routed_per_gpu + replicated
        free = self.hbm_bytes - weights
        if free <= 0:
            raise ValueError(f"deployment {self.name}: weights of {weights / GB:.1f} GB exceed the "
                             f"{self.hbm_bytes / GB:.1f} GB of HBM")
        vocab = max(1, round(c.vocab * L / c.layers / VOCAB_MULTIPLE)) * VOCAB_MULTIPLE
        return Derivation(
            deployment=self, routed_weight_bytes_per_gpu=routed_per_gpu, replicated_weight_bytes=replicated,
            weight_bytes_per_gpu=weights, free_bytes_per_gpu=free, free_bytes_per_layer=free / c.layers,
            layers=L, device_budget=int(free * L / c.layers), vocab=vocab,
            overrides={**self.fields, "num_layers": L, "vocab": vocab},
        )


@dataclasses.dataclass(frozen=True)
class Derivation:
    """The numbers from a deployment to its slice.

    Attributes:
      weight_bytes_per_gpu: routed experts / G plus everything replicated, in the shipped dtype.
      free_bytes_per_gpu: HBM - weights: what KV, activations and CUDA graphs share.
      free_bytes_per_layer: that over the model's layers: one layer's device budget.
      layers: L, the slice's layers.
      device_budget: the slice's device budget (free_bytes_per_layer x L) for the decode state
        and the compiled decode's working memory together.
      vocab: the slice's vocabulary (L / layers of the model's: the unembedding's share, rounded to a
        multiple of VOCAB_MULTIPLE).
      overrides: the family Config fields of the slice (max_context is set per context).
    """

    deployment: Deployment
    routed_weight_bytes_per_gpu: float
    replicated_weight_bytes: float
    weight_bytes_per_gpu: float
    free_bytes_per_gpu: float
    free_bytes_per_layer: float
    layers: int
    device_budget: int
    vocab: int
    overrides: dict

    def lines(self, slice_weights: Mapping[str, float] | None = None) -> list[str]:
        """The derivation, one step per line (slice_weights: the slice's bytes per layer by
        component, hisparse_jax.models.weights.weight_bytes, when known)."""
        d, c = self.deployment, self.deployment.card
        G, L = d.expert_parallel, self.layers
        dtype = {1: "fp8", 2: "bf16"}[c.bytes_per_param]
        out = [
            f"{d.name}: {d.title}",
            f"model: {c.name} ({c.source}): {c.params / 1e9:.0f}B parameters in {dtype}, {c.layers} layers "
            f"({c.moe_layers} with {c.experts} routed experts of {c.expert_params / 1e6:.1f}M parameters, "
            f"{c.experts_per_token} per token), d_model {c.d_model}, vocab {c.vocab}",
            f"weights per GPU: routed experts {c.routed_params / 1e9:.1f}B / {G} GPUs = "
            f"{self.routed_weight_bytes_per_gpu / GB:.1f} GB + replicated (attention, shared experts, dense layers, "
            f"embeddings) {self.replicated_weight_bytes / GB:.1f} GB = {self.weight_bytes_per_gpu / GB:.1f} GB",
            f"HBM per GPU {d.hbm_bytes / GB:.1f} GB - weights = {self.free_bytes_per_gpu / GB:.1f} GB for KV, "
            f"activations and graphs = {self.free_bytes_per_layer / GB:.3f} GB per layer",
            f"deployment weights per layer per GPU (average): {self.weight_bytes_per_gpu / c.layers / GB:.2f} GB",
        ]
        if slice_weights:
            parts = ", ".join(f"{k} {v / GB:.3f}" for k, v in slice_weights.items() if k != "total" and v)
            out.append(f"slice weights per layer: {parts} = {slice_weights['total'] / GB:.2f} GB")
        out += [
            f"slice: {L} layers, vocab {self.vocab} ({L}/{c.layers} of {c.vocab}), device budget "
            f"{self.free_bytes_per_layer / GB:.3f} GB x {L} = {self.device_budget / GB:.2f} GB for the decode "
            "state and the compiled decode's working memory",
            f"published: {d.published}",
            *[f"note: {n}" for n in d.notes],
        ]
        return out


# --------------------------------------------------------------------------- the deployments

H200_HBM = 141e9  # NVIDIA H200 SXM: 141 GB HBM3e

GLM_5 = ModelCard(
    name="GLM-5.1-FP8", source="GLM-5 architecture, config.json of zai-org/GLM-5 (GlmMoeDsaConfig)",
    params=744e9, bytes_per_param=1, layers=78, moe_layers=75, experts=256, experts_per_token=8,
    expert_d_ff=2048, d_model=6144, vocab=154880,
)

DEEPSEEK_V32 = ModelCard(
    name="DeepSeek-V3.2", source="config.json of deepseek-ai/DeepSeek-V3.2 (DeepSeek-V3 body + DSA indexer)",
    params=671e9, bytes_per_param=1, layers=61, moe_layers=58, experts=256, experts_per_token=8,
    expert_d_ff=2048, d_model=7168, vocab=129280,
)

QWEN3_30B_A3B = ModelCard(
    name="Qwen3-30B-A3B", source="config.json of Qwen/Qwen3-30B-A3B",
    params=30.5e9, bytes_per_param=2, layers=48, moe_layers=48, experts=128, experts_per_token=8,
    expert_d_ff=768, d_model=2048, vocab=151936,
)

_MLA_DSA_NOTES = ("the slice's layers are MoE layers; the model's 3 dense-MLP layers are not in it",)


def _dsa_ep8_h200(name: str, card: ModelCard, title: str, published: str, *notes: str) -> Deployment:
    """An MLA + DSA model on 8 NVIDIA H200 with its experts over the 8 GPUs (EP8), sliced to 8
    layers; `notes` follow the notes every such slice shares."""
    return Deployment(
        name=name, family="dsa", card=card, gpus=8, expert_parallel=8, gpu="NVIDIA H200",
        hbm_bytes=H200_HBM, slice_layers=8, title=title, fields=shapes.DEPLOYMENT_SLICES[name],
        published=published, notes=(*_MLA_DSA_NOTES, *notes),
    )

DEPLOYMENTS = {
    d.name: d
    for d in (
        _dsa_ep8_h200(
            "glm5-h200", GLM_5,
            "GLM-5.1-FP8 + DSA on 8 NVIDIA H200, data-parallel attention, experts over 8 GPUs (EP8)",
            "HiSparse paper: 624 -> 1919 tok/s at 32K (3.1x), 232 -> 680 at 160K (2.9x); "
            "~240 GB of KV over 8 GPUs at 32K",
            "the indexer's query comes from the layer input, not from the q low-rank latent "
            "(its weights are 6144 x 32 x 128 instead of 2048 x 32 x 128)",
            "attention and indexer weights are bf16 (the checkpoint has fp8): the slice reads "
            "more attention bytes per layer than the deployment (listed above)",
        ),
        _dsa_ep8_h200(
            "dsv32-h200", DEEPSEEK_V32,
            "DeepSeek-V3.2 (fp8) on 8 NVIDIA H200, data-parallel attention, experts over 8 GPUs (EP8)",
            "no HiSparse figure published for this deployment; the paper's GLM-5.1 deployment "
            "is the closest",
            "the indexer's query comes from the layer input, not from the q low-rank latent",
            "attention and indexer weights are bf16 (the checkpoint has fp8)",
        ),
        Deployment(
            name="qwen3-quest-h200", family="quest", card=QWEN3_30B_A3B, gpus=1, expert_parallel=1,
            gpu="NVIDIA H200", hbm_bytes=H200_HBM, slice_layers=4,
            title="Qwen3-30B-A3B (bf16) + Quest on one NVIDIA H200 (the paper's Qwen3 + Quest ran on a GH200)",
            fields=shapes.DEPLOYMENT_SLICES["qwen3-quest-h200"],
            published="HiSparse paper (Qwen3 + Quest on a GH200): 511 -> 1824 tok/s at 32K (3.6x), "
                      "111 -> 520 at 200K (4.7x); the Qwen3 variant is assumed (30B-A3B)",
            notes=("a 2048-token budget: top_k 128 pages of 16 tokens, B = 256 pages (assumed)",
                   "Quest keeps its first 2 layers dense (full KV in HBM in both modes); the slice is of "
                   "sparse layers only, so HiSparse's batch does not pay for those 2 of 48 layers",
                   "page-level locality: the trace calibrations are token-level figures applied to pages "
                   "(uncalibrated)"),
        ),
    )
}


def get_deployment(name: str) -> Deployment:
    if name not in DEPLOYMENTS:
        raise ValueError(f"unknown deployment {name!r}; deployments: {', '.join(DEPLOYMENTS)}")
    return DEPLOYMENTS[name]


"""DeepSeek Sparse Attention (DSA) on MLA: the research kit's model with the lightning indexer.

The model (hisparse_jax.kit: MLA records, attention over the selected records plus the open
page, the three decode modes, prefill, index_share groups) is the kit's; this module is the
lightning indexer as a kit Indexer, DSA's Config, and DSA's weight draw.

Attention is MLA in absorbed form: a token's KV record is its compressed latent c [kv_lora_rank]
followed by its shared rope key [qk_rope_dim] (576 values in the realistic preset). The query is
a direct projection of the layer input h, or with q_lora_rank = r > 0 MLA's low-rank path
(DeepSeek-V3, GLM-5): q = rms_norm(h W_QA [D, r]) W_QB [r, H, qk_nope + qk_rope]. Query heads
score in the latent space,
  score[h, s] = (q_nope[h] W_UK[h]) . c[s] + q_rope[h] . k_rope[s],
and read out softmax @ c, then W_UV and W_O (models/mla.py).

The lightning indexer scores past tokens,
  I[t, s] = sum_j w[t, j] * relu(q_I[t, j] . k_I[s]),   k_I[s] = LayerNorm(W_k x_s),
with one index key per token kept on device (one [b, max_context, index_dim] buffer per indexer
group; fp8 e4m3 with a per-token scale when index_dtype="fp8", DeepSeek's 132 B per token). Each
step a layer attends to the top-k sealed records by I (ids in position order, -1 padding) plus
the open page in the tail. With page_size P > 1 a record is a page and its score is the max of
its tokens' scores.

Shared indexer (IndexShare): with index_share = n, layers form groups of n; the first layer of a
group (its anchor) selects and the other n - 1 reuse its selection. Every layer keeps and
resolves its own KV.

Modes: "hisparse" and "device" run the same program up to where records are read (RESOLVE + hot
slots vs the device copy) and agree bit for bit; "dense" attends to every sealed record in place,
so top_k == max_context // page_size reproduces it bit for bit.

The feed-forward branch is a dense SwiGLU MLP, or with experts > 0 a mixture of experts
(hisparse_jax.models.moe) in every layer.

Simplifications against DeepSeek-V3.2: the indexer's query is projected from the layer input h,
not from the query's low-rank latent; attention weights are in `dtype` (no fp8 attention).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from .. import fp8, layout
from .._dispatch import IMPLEMENTATIONS
from ..indexer import index_scores
from ..kit import Indexer, MLAConfig, make_family
from ..kit import weights as kit_weights
from ..kit.attention import attention_kernel_domain, uses_attention_kernel
from ..kit.model import decode_step, prefill
from ..kit.state import init_state, state_class
from ..kit.family import metadata_bytes_read, selecting_layout
from . import layers, products, shapes
from .config import require
from .weights import init_normal, ones, split_layers

INDEX_DTYPES = (None, "fp8")

LayerWeights = kit_weights.LayerWeights  # the MLA layer's weights (hisparse_jax.kit.weights)
Weights = kit_weights.Weights  # .indexers: one IndexerWeights per indexer group
SELECTION_WEIGHTS = kit_weights.SELECTION_WEIGHTS  # weights.weight_bytes: the lightning indexers select


# --------------------------------------------------------------------------- the lightning indexer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class IndexerWeights:
    """One indexer group's lightning indexer."""

    w_q: jax.Array  # [D, HI, dI]
    w_head: jax.Array  # [D, HI]
    w_k: jax.Array  # [D, dI]
    k_scale: jax.Array  # [dI]
    k_bias: jax.Array  # [dI]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LightningMetadata:
    """What the lightning indexer keeps per request: every token's index key."""

    index_keys: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)  # [b, T, dI]
    index_scale: jax.Array | None = layout.field(layout.INDEXER_METADATA, batch_axis=0)  # [b, T] f32 (fp8 keys)


@dataclasses.dataclass(frozen=True)
class LightningIndexer(Indexer):
    """DeepSeek-V3.2's lightning indexer as a kit Indexer (dsa.Config.indexer builds it from its
    index_* fields; `kit.family(LightningIndexer(...))` runs it on a kit Config).

    Attributes:
      heads, dim: index heads HI and key width dI.
      dtype: None (keys in the model's dtype) or "fp8" (e4m3 keys, a float32 scale per token).
      rope_dim: trailing dims of queries and keys rotated by position (0: none).
      implementation: the scores' kernel ("auto", "ffi": the fused CUDA kernel, "reference").
    """

    heads: int = 64
    dim: int = 128
    dtype: str | None = None
    rope_dim: int = 0
    implementation: str = "auto"

    # h's projections, which kit.inputs merges with the anchor layer's into one decode matmul
    input_weights: ClassVar[tuple[str, ...]] = ("w_q", "w_k", "w_head")

    @property
    def name(self) -> str:
        return "lightning"

    def check(self, config) -> None:
        for knob, ok, want in (
                ("heads", isinstance(self.heads, int) and self.heads > 0, "a positive int"),
                ("dim", isinstance(self.dim, int) and self.dim > 0, "a positive int"),
                ("dtype", self.dtype in INDEX_DTYPES, "None (keys in the model dtype) or 'fp8'"),
                ("rope_dim", isinstance(self.rope_dim, int) and 0 <= self.rope_dim <= self.dim
                 and self.rope_dim % 2 == 0, f"an even int in [0, dim={self.dim}]"),
                ("implementation", self.implementation in IMPLEMENTATIONS, f"one of {IMPLEMENTATIONS}"),
                ("dim", self.dtype != "fp8" or self.dim % 16 == 0, "a multiple of 16 for fp8 keys")):
            if not ok:
                raise ValueError(f"LightningIndexer.{knob}: must be {want}, got {getattr(self, knob)!r}")

    def init_params(self, config, seed: int) -> IndexerWeights:
        D, HI, dI, dt = config.d_model, self.heads, self.dim, config.dtype
        w = init_normal(seed, {"w_q": ((D, HI, dI), D), "w_head": ((D, HI), D), "w_k": ((D, dI), D)}, dt)
        return IndexerWeights(**w, k_scale=ones((dI,), dt), k_bias=jnp.zeros((dI,), dt))

    def init_metadata(self, config, batch: int) -> LightningMetadata:
        fp8_keys = self.dtype == "fp8"
        keys = jnp.zeros((batch, config.max_context, self.dim), jnp.float8_e4m3fn if fp8_keys else config.dtype)
        return LightningMetadata(keys, jnp.zeros((batch, config.max_context), jnp.float32) if fp8_keys else None)

    def _rope(self, config, x, positions):
        """Rope over the trailing rope_dim dims of x [..., dI] (x itself when 0)."""
        d = self.rope_dim
        if d == 0:
            return x
        if positions is None:
            raise ValueError("dsa: Config.index_rope_dim > 0 rotates index queries and keys by position; "
                             "pass positions")
        return jnp.concatenate([x[..., :-d], layers.rope(x[..., -d:], positions, config.rope_theta)], axis=-1)

    def key(self, config, iw: IndexerWeights, h, positions=None):
        """h [..., D] -> (k_I [..., dI] in the key dtype, scale [...] float32 or None)."""
        key = layers.layer_norm(products.project("...d,de->...e", h, iw.w_k), iw.k_scale, iw.k_bias,
                                config.norm_eps)
        key = self._rope(config, key, positions)
        if self.dtype == "fp8":
            return fp8.quantize_rows(key)  # one scale per token
        return key, None

    def query(self, config, iw: IndexerWeights, h, positions=None):
        """h [..., D] -> (q_I [..., HI, dI] in dtype, head weights [..., HI] float32, 1/sqrt(HI dI) in)."""
        q = products.project("...d,dje->...je", h, iw.w_q)
        q = self._rope(config, q, None if positions is None else jnp.asarray(positions)[..., None])
        head = products.project("...d,dj->...j", h, iw.w_head, preferred_element_type=jnp.float32)
        return q, head / math.sqrt(self.heads * self.dim)

    def write(self, config, params, metadata, h, positions, written):
        key, scale = self.key(config, params, h, positions)  # [b, T, dI], [b, T] | None
        rows = jnp.arange(h.shape[0])[:, None]
        at = jnp.where(written, positions, config.max_context)  # unwritten tokens: dropped
        keys = metadata.index_keys.at[rows, at].set(key, mode="drop")
        scales = None if scale is None else metadata.index_scale.at[rows, at].set(scale, mode="drop")
        return LightningMetadata(keys, scales)

    def score(self, config, params, metadata, h, positions, sealed):
        return _record_scores(self, config, params, h, metadata.index_keys, metadata.index_scale, sealed, positions)

    def train_features(self, config, params, h, positions):
        """(keys [b, T, dI], queries [b, T, HI, dI], head weights [b, T, HI]) of every token, once
        per layer as train/forward.py computes them (fp8 keys dequantized)."""
        keys, scale = self.key(config, params, h, positions)
        if scale is not None:
            keys = keys.astype(jnp.float32) * scale[..., None]
        return (keys, *self.query(config, params, h, positions))

    def train_scores(self, config, params, features, positions, start, chunk: int):
        """I [b, chunk, T] of the chunk's queries against every token (train/forward.py's math)."""
        keys, q, head = features
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1)
        index = jnp.einsum("bcjd,btd->bcjt", take(q), keys, preferred_element_type=jnp.float32)
        return jnp.einsum("bcjt,bcj->bct", jax.nn.relu(index), take(head))


def _record_scores(indexer: LightningIndexer, config, iw, h, keys, scale, sealed, positions):
    q, head = indexer.query(config, iw, h, positions)
    tokens = index_scores(q, head, keys, sealed * config.page_size, key_scale=scale,
                          implementation=indexer.implementation)  # [b, T]
    b = tokens.shape[0]
    return jnp.max(tokens.reshape(b, config.num_records, config.page_size), axis=-1)


# --------------------------------------------------------------------------- DSA's Config


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(MLAConfig):
    """Static DSA model configuration (hashable: a static jit argument). Shared fields:
    ModelConfig, then MLAConfig (hisparse_jax.kit.config: MLA shapes, q_lora_rank, index_share,
    attention_implementation); the lightning indexer's own fields below. `indexer` is the
    LightningIndexer they describe.

    Presets (`Config.preset(name)`, `Config.tiny()`, `Config.realistic()`): "tiny", CPU-test
    shapes: 4 layers, d_model 64, vocab 256, context 256, float32; "realistic", GPU benchmark
    shapes: MLA 512 + 64 records in bf16, 16 heads, k = 2048.

    Attributes:
      index_heads, index_dim: lightning indexer heads and key width.
      index_dtype: None (index keys in `dtype`) or "fp8" (e4m3 keys with a float32 scale per token).
      index_rope_dim: trailing dims of the indexer's queries and keys rotated by the token's
        position (rope, as DeepSeek-V3.2's indexer does), so that the indexer can rank by
        distance as well as content; 0 (the default): no position in the indexer.
      indexer_implementation: the lightning indexer's kernel, "auto", "ffi" (the fused CUDA kernel)
        or "reference" (XLA). Kept apart from `implementation`: RESOLVE and top-k give the same
        bits in every implementation, the indexer's scores agree within rounding only, so a
        comparison of implementations fixes this one.
    """

    index_heads: int
    index_dim: int
    index_dtype: str | None = None
    index_rope_dim: int = 0
    indexer_implementation: str = "auto"

    PRESETS = shapes.FAMILY_PRESETS["dsa"]  # named shapes live in models/shapes.py
    POSITIVE = (*MLAConfig.POSITIVE, "index_heads", "index_dim")

    def check(self) -> None:
        super().check()
        require(self.index_dtype in INDEX_DTYPES, self, "index_dtype",
                f"must be None (keys in dtype) or 'fp8', got {self.index_dtype!r}")
        require(self.indexer_implementation in IMPLEMENTATIONS, self, "indexer_implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.indexer_implementation!r}")
        d = self.index_rope_dim
        require(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= self.index_dim and d % 2 == 0, self,
                "index_rope_dim", f"must be an even int in [0, index_dim={self.index_dim}], got {d!r}")
        require(self.index_dtype != "fp8" or self.index_dim % 16 == 0, self, "index_dim",
                f"fp8 index keys need index_dim a multiple of 16, got {self.index_dim}")

    @property
    def indexer(self) -> LightningIndexer:
        return LightningIndexer(heads=self.index_heads, dim=self.index_dim, dtype=self.index_dtype,
                                rope_dim=self.index_rope_dim, implementation=self.indexer_implementation)

    @property
    def key_dtype(self):
        return jnp.float8_e4m3fn if self.index_dtype == "fp8" else self.dtype


# One State field per LightningMetadata field, a tuple over indexer groups (hisparse_jax.kit.state):
# store, tail, index_keys ([b, max_context, dI] per group), index_scale (fp8: [b, max_context]
# float32 per group, else None), lengths.
State = state_class(LightningMetadata)


# --------------------------------------------------------------------------- the lightning indexer's pieces


def index_key(config: Config, iw: IndexerWeights, h: jax.Array, positions=None):
    """h [..., D] -> (k_I [..., dI] in the key dtype, scale [...] float32 or None) = LayerNorm(W_k h),
    its last index_rope_dim dims rotated at `positions` (broadcast to h.shape[:-1])."""
    return config.indexer.key(config, iw, h, positions)


def index_query(config: Config, iw: IndexerWeights, h: jax.Array, positions=None):
    """h [..., D] -> (q_I [..., HI, dI] in dtype, head weights [..., HI] float32 with 1/sqrt(HI dI) folded in);
    q_I's last index_rope_dim dims rotated at `positions` (broadcast to h.shape[:-1])."""
    return config.indexer.query(config, iw, h, positions)


def record_scores(config: Config, iw: IndexerWeights, h: jax.Array, keys: jax.Array, scale, sealed: jax.Array,
                  positions=None):
    """Indexer scores of every record: [b, R] float32 (-inf past the sealed records).

    Args:
      h: [b, D] the anchor layer's normed input; keys: [b, T, dI] (scale [b, T] for fp8).
      sealed: [b] int32: only the sealed pages' tokens are scored.
      positions: [b] int32, the query token's position (read with index_rope_dim > 0).
    """
    return _record_scores(config.indexer, config, iw, h, keys, scale, sealed, positions)


# --------------------------------------------------------------------------- weights


def init_weights(config: Config, seed: int = 0) -> Weights:
    """Seeded random weights (normal with 1/fan_in variance, norms at 1), on the default device.

    DSA draws its indexers in the model's one draw, between the layers and the unembedding (as
    before the kit existed), so a seed gives the weights it always gave: published figures and
    recorded traces stay reproducible. kit.family's models draw each group's indexer apart.
    """
    c, G, D, HI, dI = config, config.groups, config.d_model, config.index_heads, config.index_dim
    indexer_specs = {"i_q": ((G, D, HI, dI), D), "i_head": ((G, D, HI), D), "i_k": ((G, D, dI), D)}
    w = init_normal(seed, {**kit_weights.mla_specs(c), **indexer_specs, **kit_weights.unembed_spec(c)}, c.dtype)
    indexer = dict(w_q=w["i_q"], w_head=w["i_head"], w_k=w["i_k"], k_scale=ones((G, dI), c.dtype),
                   k_bias=jnp.zeros((G, dI), c.dtype))
    return kit_weights.assemble(c, seed, w, split_layers(indexer, G, IndexerWeights))


FAMILY = make_family("dsa", Config, init_weights)

__all__ = ["FAMILY", "Config", "IndexerWeights", "LayerWeights", "LightningIndexer", "LightningMetadata", "State",
           "Weights", "attention_kernel_domain", "decode_step", "index_key", "index_query", "init_state",
           "init_weights", "metadata_bytes_read", "prefill", "record_scores", "selecting_layout",
           "uses_attention_kernel"]

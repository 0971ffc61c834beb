"""The kit model's configuration: MLA shapes, index_share, and the indexer.

`MLAConfig` holds every field of an MLA model that selects records with some indexer (DSA's
Config without the lightning indexer's own fields); its `indexer` is abstract. Two kinds of
model build on it:
- `Config`, the research kit's: the indexer is a field (`Config.indexer`), so a sweep is a
  `dataclasses.replace(config, indexer=PageMinMax(page=32))`; `kit.family(indexer)` gives a
  subclass whose `indexer` defaults to that indexer, so `Config.tiny()` works unchanged;
- hisparse_jax.models.dsa.Config, whose indexer is the lightning indexer read from its own
  index_* fields (a property, so DSA's fields and checkpoints stay what they were).
"""

from __future__ import annotations

import dataclasses

from .._dispatch import IMPLEMENTATIONS
from ..config import CacheConfig
from ..models import shapes
from ..models.config import MAX_SIZE, ModelConfig, require
from . import checks
from .protocol import Indexer

# dsa.Config's fields that belong to its lightning indexer, not to the MLA model around it.
LIGHTNING_FIELDS = ("index_heads", "index_dim", "index_dtype", "index_rope_dim", "indexer_implementation")


def _without_lightning(presets):
    return {name: {k: v for k, v in fields.items() if k not in LIGHTNING_FIELDS} for name, fields in presets.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLAConfig(ModelConfig):
    """An MLA model selecting records with an indexer (hashable: a static jit argument). Shared
    fields: models.config.ModelConfig.

    Attributes:
      n_heads: H query heads; qk_nope_dim / qk_rope_dim / v_head_dim per head.
      kv_lora_rank: dc, the latent width; record_width = dc + qk_rope_dim.
      q_lora_rank: r, the query's low-rank latent width (0: a direct [D, H, qk_nope + qk_rope]
        query projection).
      index_share: n layers per indexer group: the group's first layer (its anchor) selects and
        the other n - 1 reuse its ids (IndexCache); 1 = every layer selects.
      attention_implementation: the decode attention over the selected records and the open
        page: "auto" (the sparse attention CUDA kernel on a CUDA backend when the layer is in
        its domain, kit.attention.attention_kernel_domain; else XLA), "ffi" (the kernel; an
        error where it cannot run) or "reference" (XLA: a gather, then layers.attend). Kept
        apart from `implementation`: the kernel's bits are the same in every mode, not XLA's.
      overlap_groups: "hisparse" mode with prefetch: the decode splits the batch into this many
        groups of equal size and runs each layer's RESOLVE and attention group by group, so
        that one group's record copy overlaps the other groups' RESOLVE and attention (kit
        .overlap; docs/prefetch.md). 1 = the whole-batch step. Must divide the batch; the same
        bits whatever the value; "device" and "dense" (no copy to hide) run the whole batch.
    """

    n_heads: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    kv_lora_rank: int
    q_lora_rank: int = 0
    index_share: int = 1
    attention_implementation: str = "auto"
    overlap_groups: int = 1

    PRESETS = _without_lightning(shapes.FAMILY_PRESETS["dsa"])  # DSA's shapes, any indexer
    POSITIVE = ("n_heads", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "kv_lora_rank", "index_share",
                "overlap_groups")
    RECORD_FIELD = "kv_lora_rank"
    RECORD_SHAPE = "page_size x (kv_lora_rank + qk_rope_dim)"

    def check(self) -> None:
        r = self.q_lora_rank
        require(isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_SIZE, self, "q_lora_rank",
                f"must be an int in [0, 2^31) (0: a direct query projection), got {r!r}")
        require(self.qk_rope_dim % 2 == 0, self, "qk_rope_dim", f"must be even, got {self.qk_rope_dim}")
        require(self.num_layers % self.index_share == 0, self, "index_share",
                f"index_share={self.index_share} must divide num_layers={self.num_layers}")
        require(self.attention_implementation in IMPLEMENTATIONS, self, "attention_implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.attention_implementation!r}")
        require(self.overlap_groups == 1 or self.prefetch, self, "overlap_groups",
                f"overlap_groups={self.overlap_groups} overlaps the record copies that prefetch moves off the "
                "compute stream; set prefetch=True too (or overlap_groups=1)")

    @property
    def indexer(self) -> Indexer:
        """The indexer every selecting group runs (hisparse_jax.kit.Indexer)."""
        raise NotImplementedError

    @property
    def record_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def groups(self) -> int:
        """G: indexer groups (anchor layers), each with its own indexer parameters and metadata."""
        return self.num_layers // self.index_share

    def cache_config(self, batch: int) -> CacheConfig:
        return self.store_config(self.num_layers, (batch,))

    def index_cache_config(self, batch: int) -> CacheConfig | None:
        """The store of the indexer's own records (a kit.RecordKind; None without one): one
        "layer" per selecting group, ceil(max_context / page) records of `page` tokens per stream,
        the kind's hot slots, `fetch` records selected per step."""
        kind = checks.record_kind(self.indexer, self)
        if kind is None:
            return None
        return CacheConfig(num_layers=self.groups, stream_shape=(batch,), pool_records=-(-self.max_context // kind.page),
                           hot_slots=kind.hot_slots, top_k=kind.fetch, record_width=kind.width, page_size=kind.page,
                           dtype=kind.dtype or self.dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(MLAConfig):
    """The research kit's model: MLAConfig plus the indexer as a field.

    Attributes:
      indexer: a hisparse_jax.kit.Indexer value (frozen, hashable); its own knobs are its
        fields, and its `check(config)` runs here.
    """

    indexer: Indexer = None

    def check(self) -> None:
        super().check()
        if self.indexer is None:
            raise ValueError(f"{type(self).__name__}.indexer: no indexer; pass indexer=MyIndexer(...) or build the "
                             "Config from kit.family(MyIndexer(...)).Config")
        checks.check_indexer(self.indexer)
        self.indexer.check(self)
        try:  # a record kind of its own must make a store (e.g. records of whole 8-byte words)
            self.index_cache_config(1)
        except checks.IndexerError:
            raise
        except ValueError as err:
            raise ValueError(f"{type(self.indexer).__name__}.record_kind: {err}") from None


def config_class(indexer: Indexer) -> type:
    """A Config subclass whose `indexer` defaults to `indexer` (its presets then work as is)."""
    checks.check_indexer(indexer)
    cls = dataclasses.make_dataclass(
        "Config", [("indexer", Indexer, dataclasses.field(default=indexer, kw_only=True))], bases=(Config,),
        frozen=True, namespace={"__doc__": f"The kit model with indexer {indexer!r} (hisparse_jax.kit.Config)."})
    cls.__module__ = __name__
    return cls

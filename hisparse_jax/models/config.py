"""The configuration every model family shares: one base dataclass, its checks and presets.

A family's Config subclasses `ModelConfig` (frozen, keyword-only, hashable: a static jit
argument), adds its own fields, lists its positive-int fields in `POSITIVE`, its presets in
`PRESETS`, and checks its own rules in `check()`. Every error names the field
(`Config.top_k: ...`) and says how to fix it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax.numpy as jnp
import numpy as np

from .._dispatch import IMPLEMENTATIONS
from ..config import CacheConfig

# The shared expert's matmuls (ModelConfig.shared_expert_implementation).
SHARED_EXPERT_IMPLEMENTATIONS = ("grouped", "dot")
# How the MoE picks a token's experts and groups the pairs (ModelConfig.routing_implementation).
ROUTING_IMPLEMENTATIONS = ("count", "sort", "fused")


def field_error(config: Any, field: str, message: str) -> ValueError:
    return ValueError(f"{type(config).__name__}.{field}: {message}")


def require(ok: bool, config: Any, field: str, message: str) -> None:
    """Raises a ValueError naming `Config.field` unless `ok`."""
    if not ok:
        raise field_error(config, field, message)


# The largest size field: ids, counts and lengths are int32 in the kernels, and XLA truncated a
# larger dimension to 32 bits in a reshape (--set d_model=99999999999999 aborted the process).
MAX_SIZE = 2**31 - 1
# The most layers: the decode unrolls its layers in Python (a trace and a compile cost per
# layer), so --set num_layers=2147483647 ran for minutes before any check; real models have
# fewer than 200.
MAX_LAYERS = 1024


def is_positive_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 1 <= value <= MAX_SIZE


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields and checks every family shares.

    Attributes:
      vocab, d_model, num_layers: transformer sizes.
      d_ff: the width of the dense SwiGLU MLP; unused (any value) when experts > 0.
      top_k: k records selected per stream and step; hot_slots: B >= k slots per stream.
      max_context: tokens per stream; page_size: tokens per record.
      pool_records: records per stream in the store (None: max_context // page_size).
      prefill_chunk: queries per block of the dense prefill attention (a multiple of page_size).
      rope_theta, norm_eps: rotary base and normalization epsilon.
      dtype: weights, activations and records (float32 or bfloat16).
      implementation: the kernels RESOLVE and top-k run: "ffi" (C++ on CPU, CUDA on GPU),
        "reference" (pure JAX) or "auto" (the handler when one is registered). Both give the
        same bits in every implementation.
      prefetch: "hisparse" mode: each layer's RESOLVE copies its misses on a stream of its own
        (hisparse_jax.prefetch), joined right before the layer reads them, so the copy overlaps
        the compute in between. A group that shares one selection (DSA's index_share > 1)
        resolves all its layers at the anchor: the copies of its later layers overlap the
        earlier layers. Same bits as without; on CPU nothing overlaps. The kit's models (DSA)
        also overlap layers that select their own records with `overlap_groups` (kit.overlap).

    Mixture of experts (hisparse_jax.models.moe), in place of the dense MLP when experts > 0:
      experts: routed experts of a layer this GPU holds (0: the dense SwiGLU MLP of width d_ff).
      experts_per_token: experts a token is routed to (top-k of the sigmoid router scores).
      expert_d_ff: F, the SwiGLU width of one expert.
      shared_experts: a shared SwiGLU expert of width shared_experts * expert_d_ff every token
        goes through (0: none).
      expert_groups: G, GPUs of the expert-parallel group: the router scores experts * G
        experts, and this GPU computes every choice on its local expert (choice mod experts);
        see moe.py for why that reads one EP GPU's expert bytes per step.
      expert_dtype: None (expert weights in `dtype`) or "fp8" (routed and shared expert weights
        float8_e4m3fn with a float32 scale per expert and output channel).
      expert_implementation: the grouped matmul's kernel ("auto", "ffi": the CUDA kernel,
        "reference": XLA's ragged dot). Kept apart from `implementation` like DSA's indexer:
        the kernel and the reference agree within rounding, not bit for bit.
      shared_expert_implementation: the shared expert's matmuls: "grouped" (the grouped matmul
        with one expert, its kernel by expert_implementation) or "dot" (XLA's matmuls, fp8 codes
        widened inside the dot; moe.dense_swiglu). Within rounding of each other, not bit for bit.
      routing_implementation: how a token's experts are picked and the pairs grouped by expert:
        "count" (comparison counts XLA fuses into a few reductions where models/routing.py's
        limits say they pay: the grouping up to 2048 (token, choice) pairs, the top-k up to
        T x N^2 <= 2^18 for T tokens of N router scores, i.e. 4 tokens of 256; sorts elsewhere)
        or "sort" (lax.top_k and a stable argsort everywhere), or "fused" (the whole routing in
        one custom call, hisparse_jax.moe_route: C++ on CPU, one CUDA kernel on GPU; "count"'s
        XLA ops where no handler runs). The same bits every way: an A/B of the step's kernels.
      routed_scaling: factor on the routing weights, which sum to 1 over a token's choices.
    """

    vocab: int
    d_model: int
    num_layers: int
    d_ff: int
    top_k: int
    hot_slots: int
    max_context: int
    page_size: int = 1
    pool_records: int | None = None
    prefill_chunk: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: Any = "float32"
    implementation: str = "auto"
    prefetch: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_d_ff: int = 0
    shared_experts: int = 0
    expert_groups: int = 1
    expert_dtype: str | None = None
    expert_implementation: str = "auto"
    shared_expert_implementation: str = "grouped"
    routing_implementation: str = "count"
    routed_scaling: float = 1.0

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    POSITIVE: ClassVar[tuple[str, ...]] = ()  # the family's own positive-int fields
    RECORD_FIELD: ClassVar[str] = "record_width"  # the field to adjust when a record's bytes are off
    RECORD_SHAPE: ClassVar[str] = "page_size x record_width"

    def __post_init__(self):
        try:
            object.__setattr__(self, "dtype", np.dtype(self.dtype))
        except TypeError as err:
            raise field_error(self, "dtype", f"not a dtype: {self.dtype!r}") from err
        require(self.dtype in (np.dtype(np.float32), np.dtype(jnp.bfloat16)), self, "dtype",
                f"must be float32 or bfloat16, got {self.dtype}")
        dense_mlp = ("d_ff",) if self.experts == 0 else ()  # d_ff is unused with experts
        for name in ("vocab", "d_model", "num_layers", *dense_mlp, *self.POSITIVE, "prefill_chunk", "top_k",
                     "hot_slots", "max_context", "page_size"):
            value = getattr(self, name)
            require(is_positive_int(value), self, name, f"must be a positive int up to 2^31 - 1, got {value!r}")
        require(self.num_layers <= MAX_LAYERS, self, "num_layers",
                f"must be at most {MAX_LAYERS} (the decode unrolls its layers), got {self.num_layers}")
        if self.pool_records is not None:
            require(is_positive_int(self.pool_records), self, "pool_records",
                    f"must be a positive int up to 2^31 - 1 or None, got {self.pool_records!r}")
        require(self.implementation in IMPLEMENTATIONS, self, "implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.implementation!r}")
        for name in ("rope_theta", "norm_eps"):  # a NaN or a negative one runs, and every logit is NaN
            value = getattr(self, name)
            require(isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
                    and np.isfinite(value) and value > 0, self, name, f"must be a finite number > 0, got {value!r}")
        require(isinstance(self.prefetch, bool), self, "prefetch", f"must be True or False, got {self.prefetch!r}")
        self._check_experts()
        self.check()
        self._check_paging()

    def _check_paging(self) -> None:
        P, T, k, B = self.page_size, self.max_context, self.top_k, self.hot_slots
        require(T % P == 0, self, "page_size", f"page_size={P} must divide max_context={T}: a stream holds whole pages")
        require(self.prefill_chunk % P == 0, self, "prefill_chunk",
                f"prefill_chunk={self.prefill_chunk} must be a multiple of page_size={P}")
        R, needed = self.store_records, self.num_records
        require(R >= needed, self, "max_context",
                f"max_context={T} tokens is {needed} pages of {P}, beyond the pool of pool_records={R} "
                "records; raise pool_records or lower max_context")
        require(k <= B, self, "top_k",
                f"top_k k={k} > hot_slots B={B}: every selected record needs a hot slot; raise hot_slots "
                "or lower top_k")
        require(k <= needed, self, "top_k",
                f"top_k k={k} exceeds the {needed} pages of max_context={T}; use top_k <= {needed} "
                f"(top_k == {needed} selects every sealed page)")
        require(self.record_bytes % 8 == 0, self, self.RECORD_FIELD,
                f"a record is {self.record_bytes} bytes ({self.RECORD_SHAPE} x itemsize); it must be a "
                f"multiple of 8: adjust {self.RECORD_FIELD}")
        try:  # the store's own limits (int32 ids, the CUDA kernel's B and k), at construction
            self.store_config(1, (1,))
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None

    def _check_experts(self) -> None:
        E, k, G = self.experts, self.experts_per_token, self.expert_groups
        require(isinstance(E, (int, np.integer)) and not isinstance(E, bool) and 0 <= E <= MAX_SIZE, self, "experts",
                f"must be an int in [0, 2^31) (0: the dense MLP), got {E!r}")
        require(self.expert_implementation in IMPLEMENTATIONS, self, "expert_implementation",
                f"must be one of {IMPLEMENTATIONS}, got {self.expert_implementation!r}")
        require(self.shared_expert_implementation in SHARED_EXPERT_IMPLEMENTATIONS, self, "shared_expert_implementation",
                f"must be one of {SHARED_EXPERT_IMPLEMENTATIONS}, got {self.shared_expert_implementation!r}")
        require(self.routing_implementation in ROUTING_IMPLEMENTATIONS, self, "routing_implementation",
                f"must be one of {ROUTING_IMPLEMENTATIONS}, got {self.routing_implementation!r}")
        if E == 0:
            moe_fields = dict(experts_per_token=0, expert_d_ff=0, shared_experts=0, expert_groups=1,
                              expert_dtype=None, shared_expert_implementation="grouped", routing_implementation="count",
                              routed_scaling=1.0)
            for name, default in moe_fields.items():
                require(getattr(self, name) == default, self, name,
                        f"={getattr(self, name)!r} is a mixture-of-experts field, but experts=0 (the dense "
                        f"MLP): set experts > 0 or leave {name} at {default!r}")
            return
        for name in ("experts_per_token", "expert_d_ff", "expert_groups"):
            value = getattr(self, name)
            require(is_positive_int(value), self, name, f"must be a positive int with experts > 0, got {value!r}")
        require(k <= E * G, self, "experts_per_token",
                f"experts_per_token={k} > experts x expert_groups = {E} x {G} = {E * G} experts to route to")
        shared = self.shared_experts
        require(isinstance(shared, (int, np.integer)) and not isinstance(shared, bool) and 0 <= shared <= MAX_SIZE,
                self, "shared_experts", f"must be an int in [0, 2^31), got {shared!r}")
        require(self.expert_dtype in (None, "fp8"), self, "expert_dtype",
                f"must be None (expert weights in dtype) or 'fp8', got {self.expert_dtype!r}")
        scaling = self.routed_scaling
        require(isinstance(scaling, (int, float, np.floating)) and not isinstance(scaling, bool)
                and np.isfinite(scaling) and scaling > 0, self, "routed_scaling",
                f"must be a finite number > 0, got {scaling!r}")

    def check(self) -> None:
        """The family's own rules (override; call require)."""

    # ------------------------------------------------------------------ derived sizes

    @property
    def record_width(self) -> int:
        raise NotImplementedError

    @property
    def record_bytes(self) -> int:
        """Bytes of one record: page_size x record_width x itemsize."""
        return self.page_size * self.record_width * self.dtype.itemsize

    @property
    def num_records(self) -> int:
        """Records (pages) a stream can seal: max_context // page_size."""
        return self.max_context // self.page_size

    @property
    def store_records(self) -> int:
        """R: records per stream in the store (pool_records, default max_context // page_size)."""
        return self.pool_records if self.pool_records is not None else self.num_records

    def store_config(self, num_layers: int, stream_shape: tuple[int, ...]) -> CacheConfig:
        """The CacheConfig of a store of `num_layers` layers over streams of `stream_shape`."""
        return CacheConfig(
            num_layers=num_layers, stream_shape=stream_shape, pool_records=self.store_records,
            hot_slots=self.hot_slots, top_k=self.top_k, record_width=self.record_width,
            page_size=self.page_size, dtype=self.dtype,
        )

    # ------------------------------------------------------------------ presets

    @classmethod
    def preset(cls, name: str, **overrides):
        """cls(**PRESETS[name], **overrides), with errors naming the unknown preset or field."""
        if name not in cls.PRESETS:
            raise ValueError(f"{cls.__name__}: unknown preset {name!r}; presets: {', '.join(cls.PRESETS)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(
                f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(fields))}"
            )
        return cls(**{**cls.PRESETS[name], **overrides})

    @classmethod
    def tiny(cls, **overrides):
        """CPU-test shapes (PRESETS["tiny"]): a decode compiles and runs in seconds."""
        return cls.preset("tiny", **overrides)

    @classmethod
    def realistic(cls, **overrides):
        """GPU benchmark shapes (PRESETS["realistic"])."""
        return cls.preset("realistic", **overrides)

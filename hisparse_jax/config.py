"""Static configuration of a HiSparse cache, validated once at construction."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# The most the CUDA RESOLVE kernel holds in one block (kMaxResolveHotSlots and
# kMaxResolveTopK of ffi/resolve_cuda.h); enforced for every backend so that a
# config runs wherever the cache is moved.
MAX_HOT_SLOTS = 16384
MAX_TOP_K = 8192


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Shapes of one HiSparse KV cache.

    A *stream* owns `hot_slots` slots of the device hot buffer; every leading
    dim in `stream_shape` is a stream dim (batch, or batch x kv_heads when
    selection is per KV head). A *record* is `page_size` tokens x
    `record_width` elements of `dtype` (fp8 records are stored as uint8 bytes).

    Attributes:
      num_layers: L, sparse layers sharing this cache (one pool slab each).
      stream_shape: leading stream dims, e.g. (batch,) or (batch, kv_heads).
      pool_records: R, records per stream in the host pool (context / page_size).
      hot_slots: B, hot buffer slots per stream; top_k <= B <= MAX_HOT_SLOTS (16384).
      top_k: k, records selected per stream per step; k <= MAX_TOP_K (8192).
      record_width: elements per token in a record (576 for MLA 512+64).
      page_size: tokens per record (1 for DSA, 16 for Quest pages).
      dtype: element dtype of records.
    """

    num_layers: int
    stream_shape: tuple[int, ...]
    pool_records: int
    hot_slots: int
    top_k: int
    record_width: int
    page_size: int = 1
    dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        object.__setattr__(self, "stream_shape", tuple(int(d) for d in self.stream_shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        for name in ("num_layers", "pool_records", "hot_slots", "top_k", "record_width", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"CacheConfig.{name} must be a positive int, got {value!r}")
        if any(d < 1 for d in self.stream_shape):
            raise ValueError(
                f"CacheConfig.stream_shape must hold positive dims, got {self.stream_shape}"
            )
        if self.hot_slots < self.top_k:
            raise ValueError(
                f"CacheConfig.hot_slots (B={self.hot_slots}) must be >= top_k (k={self.top_k}): "
                "every selected record needs a slot; raise hot_slots or lower top_k"
            )
        if self.hot_slots > MAX_HOT_SLOTS:
            raise ValueError(
                f"CacheConfig.hot_slots (B={self.hot_slots}) exceeds {MAX_HOT_SLOTS}, the most slots "
                "the CUDA RESOLVE kernel holds per stream; lower hot_slots (or split the stream, "
                "e.g. per KV head)"
            )
        if self.top_k > MAX_TOP_K:
            raise ValueError(
                f"CacheConfig.top_k (k={self.top_k}) exceeds {MAX_TOP_K}, the most records the "
                "CUDA RESOLVE kernel selects per stream; lower top_k"
            )
        if self.record_bytes % 8:
            raise ValueError(
                f"CacheConfig: a record is {self.record_bytes} bytes (page_size x record_width x "
                f"itemsize = {self.page_size} x {self.record_width} x {self.dtype.itemsize}); "
                "it must be a multiple of 8: pad record_width"
            )
        if max(self.pool_records, self.hot_slots) >= 2**31:
            raise ValueError("CacheConfig: pool_records and hot_slots must fit in int32")

    @property
    def record_shape(self) -> tuple[int, int]:
        return (self.page_size, self.record_width)

    @property
    def record_bytes(self) -> int:
        return self.page_size * self.record_width * self.dtype.itemsize

    @property
    def num_streams(self) -> int:
        return math.prod(self.stream_shape)

    @property
    def pool_shape(self) -> tuple[int, ...]:
        """[L, *streams, R, page_size, record_width]"""
        return (self.num_layers, *self.stream_shape, self.pool_records, *self.record_shape)

    @property
    def hot_shape(self) -> tuple[int, ...]:
        """[L, *streams, B, page_size, record_width]"""
        return (self.num_layers, *self.stream_shape, self.hot_slots, *self.record_shape)

    @property
    def slot_shape(self) -> tuple[int, ...]:
        """[L, *streams, B]: shape of slot_record and lru."""
        return (self.num_layers, *self.stream_shape, self.hot_slots)

    @property
    def device_bytes(self) -> int:
        """Device bytes of the hot buffers and their metadata (all layers)."""
        slots = self.num_layers * self.num_streams * self.hot_slots
        return slots * (self.record_bytes + 2 * 4)

    @property
    def host_bytes(self) -> int:
        """Pinned host bytes of the pool (all layers)."""
        return self.num_layers * self.num_streams * self.pool_records * self.record_bytes

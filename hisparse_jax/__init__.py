"""hisparse-jax: a hierarchical KV cache for sparse-attention decoding in JAX.

The authoritative KV lives in a pinned host pool; each stream keeps B hot
slots on device, managed by LRU. `resolve` makes one layer's selected records
resident and returns their slots; outputs stay bit-identical to keeping the
whole KV on device.
"""

from . import decode, fp8, models, selection, sharding, targets
from ._dispatch import IMPLEMENTATIONS, require_ffi
from ._ffi import built_with_cuda, extension_error as ffi_extension_error, ffi_platforms, ffi_registrations
from ._ffi import has_ffi, platform_of
from .cache import HotCache, alloc_host_pool, init_hot_cache, pinned_host_sharding, reset_streams
from .config import CacheConfig
from .grouped_matmul import grouped_matmul, grouped_matmul_reference, quantize_weights_fp8
from .indexer import index_scores, index_scores_reference, quantize_keys_fp8
from .moe_route import RoutedPairs, route_experts, route_experts_reference
from .prefetch import PendingFetch, join_prefetch, resolve_prefetch
from .pool import rows_outside_pool, write_records, write_records_inplace
from .resolve import ResolveResult, resolve, resolve_reference
from .sparse_attention import sparse_attention, sparse_attention_reference
from .topk import select_topk

__all__ = [
    "decode",
    "fp8",
    "models",
    "selection",
    "sharding",
    "targets",
    "IMPLEMENTATIONS",
    "CacheConfig",
    "HotCache",
    "PendingFetch",
    "ResolveResult",
    "RoutedPairs",
    "alloc_host_pool",
    "built_with_cuda",
    "ffi_extension_error",
    "ffi_platforms",
    "ffi_registrations",
    "grouped_matmul",
    "grouped_matmul_reference",
    "has_ffi",
    "index_scores",
    "index_scores_reference",
    "init_hot_cache",
    "join_prefetch",
    "pinned_host_sharding",
    "platform_of",
    "quantize_keys_fp8",
    "quantize_weights_fp8",
    "require_ffi",
    "reset_streams",
    "resolve",
    "resolve_prefetch",
    "resolve_reference",
    "route_experts",
    "route_experts_reference",
    "rows_outside_pool",
    "select_topk",
    "sparse_attention",
    "sparse_attention_reference",
    "write_records",
    "write_records_inplace",
]

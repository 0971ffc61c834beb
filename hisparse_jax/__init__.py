"""hisparse-jax: a hierarchical KV cache for sparse-attention decoding in JAX.

The authoritative KV lives in a pinned host pool; each stream keeps B hot
slots on device, managed by LRU. `resolve` makes one layer's selected records
resident and returns their slots; outputs stay bit-identical to keeping the
whole KV on device.
"""

from . import _ffi, decode, models, selection, sharding
from ._ffi import built_with_cuda, ffi_platforms
from .cache import HotCache, alloc_host_pool, init_hot_cache, pinned_host_sharding, reset_streams
from .config import CacheConfig
from .grouped_matmul import grouped_matmul, grouped_matmul_reference, quantize_weights_fp8
from .indexer import index_scores, index_scores_reference, quantize_keys_fp8
from .prefetch import PendingFetch, join_prefetch, resolve_prefetch
from .pool import rows_outside_pool, write_records, write_records_inplace
from .reference import resolve_reference
from .resolve import ResolveResult, resolve
from .topk import select_topk

__all__ = [
    "decode",
    "models",
    "selection",
    "sharding",
    "CacheConfig",
    "HotCache",
    "PendingFetch",
    "ResolveResult",
    "alloc_host_pool",
    "built_with_cuda",
    "ffi_platforms",
    "grouped_matmul",
    "grouped_matmul_reference",
    "index_scores",
    "index_scores_reference",
    "init_hot_cache",
    "join_prefetch",
    "pinned_host_sharding",
    "quantize_keys_fp8",
    "quantize_weights_fp8",
    "reset_streams",
    "resolve",
    "resolve_prefetch",
    "resolve_reference",
    "rows_outside_pool",
    "select_topk",
    "write_records",
    "write_records_inplace",
]

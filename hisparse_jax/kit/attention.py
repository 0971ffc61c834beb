"""MLA decode attention over a layer's selected records plus its open page, and where the
sparse attention CUDA kernel can run it instead of XLA's gather (moved from models/dsa.py).

The kernel (hisparse_jax.sparse_attention) reads each selected record in place by index (the
hot buffer by slot, the device KV by record id) with a bf16 query: its bits are the same in
every mode (hisparse == device == dense) but not XLA's, so `attention_implementation` picks it
apart from `implementation`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import kv_store, targets
from .._dispatch import choose_implementation, require_handler
from ..models import layers, mla, paging
from ..sparse_attention import CHUNKS, HEAD_TILE, MAX_PAGE, MAX_TOP_K, STAGE, VALUE_WIDTH, WIDTH, sparse_attention


def attention_kernel_domain(config, mode: str, stream_axes: int = 1) -> str:
    """Why the sparse attention kernel cannot run this model's decode attention in `mode` ("" if
    it can). "dense" reads every record of the store: k = store_records."""
    P = config.page_size
    k = config.store_records if mode == "dense" else config.top_k
    if (config.kv_lora_rank, config.record_width) != (VALUE_WIDTH, WIDTH):
        return (f"records are {config.kv_lora_rank} latent + {config.qk_rope_dim} rope; the kernel reads "
                f"{VALUE_WIDTH} + {WIDTH - VALUE_WIDTH}")
    if config.dtype != np.dtype(jnp.bfloat16):
        return f"records are {config.dtype}; the kernel reads bfloat16"
    if config.n_heads % HEAD_TILE:
        return f"n_heads={config.n_heads} is not a multiple of {HEAD_TILE}"
    if stream_axes != 1:
        return f"streams have {stream_axes} axes; the kernel takes one batch axis"
    if P > MAX_PAGE or k > MAX_TOP_K or (k * P) % (CHUNKS * STAGE):
        return (f"k={k} records of page_size={P}: the kernel takes k <= {MAX_TOP_K}, P <= {MAX_PAGE}, "
                f"k * P a multiple of {CHUNKS * STAGE}")
    return ""


def uses_attention_kernel(config, mode: str, stream_axes: int = 1) -> bool:
    """Whether the decode attention runs the sparse attention kernel (config.attention_implementation:
    "auto" where it can run, "reference" never); "ffi" where it cannot run raises why."""
    domain = attention_kernel_domain(config, mode, stream_axes)
    impl = choose_implementation("sparse_attention", config.attention_implementation, targets.SPARSE_ATTENTION, domain)
    if impl == "reference":
        return False
    require_handler("sparse_attention", targets.SPARSE_ATTENTION, domain)
    return True


def attend_records(config, store, layer: int, located, tail, pos, q, after=None):
    """One layer's attention over its selected records and its open page (tail, this step's token
    written): (latent [b, H, dc] float32, misses [b], store). `after`: what a prefetched copy's
    join waits for (default: the tail, i.e. everything before the layer; kit.overlap passes the
    previous group's attention)."""
    if not uses_attention_kernel(config, store.mode, store.sealed.ndim):
        parts, misses, store = paging.selected_parts(store, layer, located, tail, pos, mla.split_record(config),
                                                     after=after)
        return layers.attend(q, parts, mla.scale(config)), misses, store
    # What selected_parts does before its gather: the open page written through ("device",
    # "dense"), a prefetched copy joined; then the kernel reads the records where they live.
    store = kv_store.write_open_page(store, layer, tail)
    located, store = kv_store.await_located(store, located, tail if after is None else after)
    source, source_layer, index = kv_store.read_in_place(store, layer, located)
    latent = sparse_attention(
        q.astype(jnp.bfloat16), source, index, tail.astype(jnp.bfloat16), paging.tail_valid(pos, config.page_size),
        mla.scale(config), layer=0 if source_layer is None else source_layer, implementation="ffi")
    misses = located.misses if located is not None else jnp.zeros(store.sealed.shape, jnp.int32)
    return latent, misses, store

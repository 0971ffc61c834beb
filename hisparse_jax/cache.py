"""Cache state: the device hot buffers (a registered pytree) and the pinned host pool."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding, Sharding

from . import layout
from .config import CacheConfig
from .layout import PINNED_HOST


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HotCache:
    """Device state of every stream of every layer.

    Attributes:
      hot: [L, *streams, B, page_size, record_width] cached records.
      slot_record: [L, *streams, B] int32, record id held by each slot, -1 = empty.
      lru: [L, *streams, B] int32, a permutation of slot ids, least recently used first.
    """

    hot: jax.Array = layout.field(layout.KV_RECORDS, batch_axis=1)
    slot_record: jax.Array = layout.field(layout.SLOT_METADATA, batch_axis=1)
    lru: jax.Array = layout.field(layout.SLOT_METADATA, batch_axis=1)

    @property
    def num_layers(self) -> int:
        return self.slot_record.shape[0]

    @property
    def hot_slots(self) -> int:
        return self.slot_record.shape[-1]

    @property
    def stream_shape(self) -> tuple[int, ...]:
        return tuple(self.slot_record.shape[1:-1])


def _device_sharding(sharding: Sharding | None) -> Sharding:
    return sharding if sharding is not None else SingleDeviceSharding(jax.devices()[0])


def pinned_host_sharding(sharding: Sharding | None = None) -> Sharding:
    """`sharding` (default: the first device) moved to the pinned_host memory kind."""
    return _device_sharding(sharding).with_memory_kind(PINNED_HOST)


def init_hot_cache(config: CacheConfig, sharding: Sharding | None = None) -> HotCache:
    """An empty cache: every slot -1, lru = 0..B-1, hot buffer zeroed, on device.

    Built straight into `sharding` (each device computes only its own shard).
    """
    return _hot_cache_builder(config.hot_shape, config.dtype, _device_sharding(sharding))()


# One jitted builder per (shape, dtype, sharding): states of the same cache shapes reuse its compiled
# program (a new closure per call was a new jit, compiled again for every state built).
@functools.lru_cache(maxsize=256)
def _hot_cache_builder(hot_shape: tuple[int, ...], dtype: np.dtype, sharding: Sharding):
    slot_shape, hot_slots = hot_shape[:-2], hot_shape[-3]  # hot: [L, *streams, B, page_size, width]

    @functools.partial(jax.jit, out_shardings=HotCache(sharding, sharding, sharding))
    def build():
        lru = jnp.broadcast_to(jnp.arange(hot_slots, dtype=jnp.int32), slot_shape)
        return HotCache(
            hot=jnp.zeros(hot_shape, dtype),
            slot_record=jnp.full(slot_shape, -1, jnp.int32),
            lru=lru,
        )

    return build


def alloc_host_pool(config: CacheConfig, sharding: Sharding | None = None) -> jax.Array:
    """A zeroed host pool [L, *streams, R, page_size, record_width] in pinned_host memory.

    Built from a lazily zeroed NumPy buffer, so no device memory of the pool's
    size is ever needed.
    """
    target = pinned_host_sharding(sharding)
    if isinstance(jnp.zeros((), config.dtype), jax.core.Tracer):
        # Under a trace (jax.eval_shape of a state, as the byte account and the working-memory
        # compile do), only the shape matters: a NumPy buffer would be allocated all the same.
        return jax.jit(lambda: jnp.zeros(config.pool_shape, config.dtype), out_shardings=target)()
    zeros = np.zeros(config.pool_shape, config.dtype)
    return jax.device_put(zeros, target)


def reset_streams(cache: HotCache, streams: jax.Array) -> HotCache:
    """Empties the chosen streams in every layer (a batch slot reused by a new request).

    Args:
      streams: [*streams] bool, True where the stream starts over.
    The hot bytes are left as they are: a slot with slot_record -1 is never read.
    """
    streams = jnp.asarray(streams, bool)
    if streams.shape != cache.stream_shape:
        raise ValueError(
            f"reset_streams: streams has shape {streams.shape}, expected the stream shape "
            f"{cache.stream_shape} of the cache"
        )
    mask = streams[None, ..., None]
    fresh_lru = jnp.broadcast_to(jnp.arange(cache.hot_slots, dtype=jnp.int32), cache.lru.shape)
    return HotCache(
        hot=cache.hot,
        slot_record=jnp.where(mask, -1, cache.slot_record),
        lru=jnp.where(mask, fresh_lru, cache.lru),
    )

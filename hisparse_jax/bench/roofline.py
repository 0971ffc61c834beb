"""The roofline of a decode step: the bytes it must move at bandwidths measured in the same run.

Weights, the family's per-request metadata read (index keys, page bounds, compressed KV) and the
records attention reads, at the HBM read bandwidth; the miss IO at the pinned-host gather
bandwidth of RESOLVE.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ..models.moe import expected_active_experts


def _median_seconds(fn, *args, reps: int = 5, calls: int = 20) -> float:
    """Median seconds per call of `reps` timings of `calls` back-to-back calls (dispatch overlaps
    the device work, as it does in a decode loop)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready([fn(*args) for _ in range(calls)])
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def hbm_bandwidth(nbytes: int | None = None) -> float:
    """Bytes/s the device reads weights at: the faster of a sum over `nbytes` (default 2 GiB, 4
    MiB on CPU, where the figure is the host's and only keeps --profile's plumbing running: 256
    MiB took half a minute there, 32 MiB 7 s of every --profile run in the test suite) and a
    matrix-vector product with a bf16 matrix of `nbytes` (what a decode step does with its
    weights). The roofline's bytes are reads (weights, keys, records)."""
    nbytes = nbytes or (2**22 if jax.default_backend() == "cpu" else 2**31)
    x = jnp.ones((nbytes // 4,), jnp.float32)
    summed = nbytes / _median_seconds(jax.jit(jnp.sum), x)
    del x
    w = jnp.ones((4096, nbytes // (2 * 4096)), jnp.bfloat16)
    v = jnp.ones((1, 4096), jnp.bfloat16)
    matvec = nbytes / _median_seconds(jax.jit(lambda v, w: v @ w), v, w)
    return max(summed, matvec)


def host_link_bandwidth(record_bytes: int, streams: int = 64, k: int = 2048, reps: int = 5) -> float:
    """Bytes/s RESOLVE fetches from pinned host memory when every selected record misses."""
    from .. import CacheConfig, alloc_host_pool, init_hot_cache, resolve

    config = CacheConfig(num_layers=1, stream_shape=(streams,), pool_records=4 * k, hot_slots=k, top_k=k,
                         record_width=record_bytes // 4, dtype=np.float32)
    pool = alloc_host_pool(config)
    sealed = jnp.full((streams,), 4 * k, jnp.int32)
    # The pool is an argument: a closed-over array would be a constant of the program, on device.
    call = jax.jit(lambda cache, pool, sel: resolve(cache, pool, sel, sealed, 0), donate_argnums=0)
    times = []
    for rep in range(reps + 1):
        cache = init_hot_cache(config)  # empty: every id misses
        sel = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32) + (rep % 4) * k, (streams, k))
        jax.block_until_ready((cache, sel))
        t0 = time.perf_counter()
        jax.block_until_ready(call(cache, pool, sel))
        if rep:
            times.append(time.perf_counter() - t0)
    return streams * k * record_bytes / float(np.median(times))


def weight_bytes(weights, batch: int, config=None) -> float:
    """Bytes of weights one step reads: every weight, but only `batch` rows of the embedding, and
    of a mixture of experts' routed experts (hisparse_jax.models.moe) only those a step is
    expected to use: batch x experts_per_token (token, expert) pairs land on the layer's local
    experts, which under uniform routing leave E (1 - 1/E)^pairs of them idle. The grouped
    matmul reads no idle expert, so a roofline that counted every expert would be too slow."""
    total = 0.0
    for path, leaf in jax.tree_util.tree_flatten_with_path(weights)[0]:
        names = {getattr(key, "name", None) for key in path}
        share = 1.0
        if config is not None and "moe" in names and "routed" in names and config.experts > 0:
            pairs = batch * config.experts_per_token
            share = expected_active_experts(config.experts, pairs) / config.experts
        total += leaf.nbytes * share
    embed = weights.embed
    return total - embed.nbytes + batch * embed.shape[1] * embed.dtype.itemsize


def step_bytes(family, config, weights, batch: int, context: int, misses_per_step: float,
               index_misses_per_step: float = 0.0) -> dict[str, float]:
    """Bytes one decode step must move: weights, the family's metadata, the attended records
    (HBM), and the miss IO (host link): the KV's, and a kit indexer's own records
    (`index_misses_per_step` of kit.RecordKind records, fetched by their own RESOLVE)."""
    cache = config.cache_config(batch)
    index = getattr(config, "index_cache_config", lambda b: None)(batch)
    index_io = 0.0 if index is None else index_misses_per_step * index.record_bytes
    streams = int(np.prod(cache.stream_shape))
    attended = cache.num_layers * streams * (config.top_k + 1) * config.record_bytes
    return {
        "weights": float(weight_bytes(weights, batch, config)),
        "metadata": float(batch * family.metadata_bytes_read(config, context)),
        "attended KV": float(attended),
        "miss IO": float(misses_per_step * config.record_bytes + index_io),
    }


def measure_bandwidths(record_bytes: int) -> dict[str, float]:
    """The roofline's bandwidths, measured now: "hbm" (reading 2 GiB), "host link" (RESOLVE
    fetching records of `record_bytes` from pinned host memory, every selected record a miss)."""
    return {"hbm": hbm_bandwidth(), "host link": host_link_bandwidth(record_bytes)}


def roofline_seconds(moved: dict[str, float], bandwidths: dict[str, float]) -> float:
    """Seconds a step of `moved` bytes (step_bytes) takes at `bandwidths` (measure_bandwidths)."""
    hbm = moved["weights"] + moved["metadata"] + moved["attended KV"]
    return hbm / bandwidths["hbm"] + moved["miss IO"] / bandwidths["host link"]

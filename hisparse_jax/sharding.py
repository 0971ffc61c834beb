"""Scale-out over a device mesh: streams sharded data-parallel, one pinned host pool per device.

Streams are independent (docs/contract.md): RESOLVE, the pool writes and a
model's whole decode step touch only their own streams. So the batch (stream)
axis is split over a mesh axis, every array of the state carries a
NamedSharding on that axis, each device keeps its shard of the host pool in
its own pinned_host memory, and the per-stream work runs under `jax.shard_map`:
every device runs its own RESOLVE custom call on its own streams and its own
pool shard, with no collective and no copy of the pool.

Two levels:

- Cache level: `shard_cache(config, mesh)` builds a HotCache and a pinned host
  pool sharded on the first stream dim ([L, *S, ...] arrays: P(None, axis));
  `sharded_resolve(mesh)` is `hisparse_jax.resolve` under shard_map.
- Model level: `sharded_family(family, mesh)` is a model family (same protocol,
  see hisparse_jax.models) whose `prefill` / `decode_step` run the original
  under shard_map; `hisparse_jax.decode.prefill/generate/decode_step` drive it
  unchanged. The step loop, sampling and donation are those of decode.generate,
  outside shard_map under jit's sharding propagation; the batch stays sharded
  through the loop, so greedy and sampled tokens equal the single-device
  decode's (threefry draws do not depend on the sharding).
  `init_sharded_state(family, config, batch, mode, mesh)` builds the family's
  empty state directly in its shards (each process materializes only the
  shards of its own devices: the multi-host path).

Rules: the stream axis size (batch) must be a multiple of the mesh axis size;
weights are replicated (`replicate`). Only the batch axis is sharded: NSA/Quest
select per KV head, but their KV-head stream dim stays whole on each device.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import _checks, layout
from .cache import HotCache, alloc_host_pool, init_hot_cache
from .config import CacheConfig
from .models import Family, get_family
from .models.paging import StepOutput
from .resolve import ResolveResult, resolve

DEFAULT_AXIS = "data"

__all__ = [
    "DEFAULT_AXIS",
    "cache_spec",
    "init_sharded_state",
    "replicate",
    "shard_cache",
    "shard_state",
    "sharded_family",
    "sharded_resolve",
    "state_batch_dims",
    "state_shardings",
    "state_specs",
    "stream_mesh",
]


# --------------------------------------------------------------------------- mesh and checks


def stream_mesh(devices=None, axis: str = DEFAULT_AXIS) -> Mesh:
    """A 1-D mesh over `devices` (default: every device of every process) named `axis`."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis,))


def _axis_size(mesh: Mesh, axis: str) -> int:
    if axis not in mesh.shape:
        raise ValueError(f"mesh has axes {tuple(mesh.shape)}, no axis named {axis!r}")
    return int(mesh.shape[axis])


def _check_divisible(what: str, streams: int, mesh: Mesh, axis: str) -> None:
    n = _axis_size(mesh, axis)
    if streams % n:
        raise ValueError(
            f"{what}: {streams} streams on the sharded dim do not split over the {n} devices of mesh "
            f"axis {axis!r}; use a batch that is a multiple of {n} (pad it with idle streams) or a "
            "smaller mesh"
        )


def _spec(dim: int, axis: str) -> P:
    """P with `axis` at `dim` and None before it."""
    return P(*([None] * dim), axis)


# --------------------------------------------------------------------------- cache level


def cache_spec(axis: str = DEFAULT_AXIS) -> P:
    """PartitionSpec of every [L, *S, ...] cache array (hot, slot_record, lru, host_pool)."""
    return _spec(1, axis)


def shard_cache(config: CacheConfig, mesh: Mesh, axis: str = DEFAULT_AXIS) -> tuple[HotCache, jax.Array]:
    """An empty HotCache and a zeroed pinned_host pool, sharded on the first stream dim.

    Returns (cache, host_pool): cache arrays on NamedSharding(mesh, P(None, axis)) in
    device memory, the pool on the same sharding with memory_kind="pinned_host": each
    device holds stream_shape[0] / mesh.shape[axis] streams and the pool shard of
    those streams in its own pinned host memory. Nothing of the whole batch is ever
    built on one device.
    """
    _check_divisible("shard_cache", config.stream_shape[0], mesh, axis)
    sharding = NamedSharding(mesh, cache_spec(axis))
    return init_hot_cache(config, sharding), alloc_host_pool(config, sharding)


def sharded_resolve(
    mesh: Mesh,
    axis: str = DEFAULT_AXIS,
    *,
    implementation: str = "auto",
    fetch: bool = True,
    launch: str = "auto",
):
    """`hisparse_jax.resolve` under shard_map over `axis`: each device resolves its own streams.

    Returns fn(cache, host_pool, selection, sealed, layer) -> (ResolveResult, HotCache) taking
    the arrays of `shard_cache` (cache and pool P(None, axis), selection and sealed P(axis),
    layer replicated). Each device runs one RESOLVE custom call on its shard with its own
    pinned_host pool shard as a read-only S(5) operand; the program has no collective.
    Jit it with the cache donated for in-place updates:
    `jax.jit(sharded_resolve(mesh), donate_argnums=0)`, or call it inside your own jit.
    """
    _axis_size(mesh, axis)
    specs = cache_spec(axis)
    cache_specs = HotCache(specs, specs, specs)
    stream = P(axis)
    result_specs = ResolveResult(stream, stream, stream, stream, stream, stream)

    def body(cache, host_pool, selection, sealed, layer):
        return resolve(
            cache, host_pool, selection, sealed, layer, implementation=implementation, fetch=fetch,
            launch=launch,
        )

    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=(cache_specs, specs, stream, stream, P()),
        out_specs=(result_specs, cache_specs),
    )

    def call(cache, host_pool, selection, sealed, layer):
        _check_divisible("sharded_resolve", jnp.shape(selection)[0], mesh, axis)
        for name, value in (("selection", selection), ("sealed", sealed), ("layer", layer)):
            _checks.check_int32("sharded_resolve", name, value)  # before shard_map's and our casts
        return mapped(cache, host_pool, selection, sealed, jnp.asarray(layer, jnp.int32))

    return call


# --------------------------------------------------------------------------- model state


def _local_sharding():
    """This process's first device: jax.devices()[0] (the default of init_state) may belong
    to another process under jax.distributed."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _one_stream_state(family, config, mode: str):
    """The family's empty state of one stream, on this process's first device."""
    return family.init_state(config, 1, mode, sharding=_local_sharding())


@functools.lru_cache(maxsize=None)
def _template(family: Family, config, mode: str):
    """The shapes of the family's one-stream state (jax.eval_shape: nothing is allocated)."""
    return jax.eval_shape(lambda: family.init_state(config, 1, mode, sharding=_local_sharding()))


def state_batch_dims(family, config, mode: str):
    """The family's State pytree with, at every array, the index of its batch dim (the layout
    each state field declares, hisparse_jax.layout)."""
    return layout.map_arrays(lambda leaf: leaf.layout.batch_axis, _template(get_family(family), config, mode))


def state_specs(family, config, mode: str, axis: str = DEFAULT_AXIS):
    """The family's State pytree of PartitionSpecs: every array split on its batch dim."""
    return layout.map_arrays(lambda leaf: _spec(leaf.layout.batch_axis, axis),
                             _template(get_family(family), config, mode))


def state_shardings(family, config, mode: str, mesh: Mesh, axis: str = DEFAULT_AXIS):
    """NamedShardings of the family's State: split on the batch dim, in the memory kind each
    array declares (the host pool in pinned_host)."""
    return layout.map_arrays(
        lambda leaf: NamedSharding(mesh, _spec(leaf.layout.batch_axis, axis), memory_kind=leaf.layout.memory),
        _template(get_family(family), config, mode),
    )


def _is_host(x) -> bool:
    return jax.typeof(x).memory_space == jax.memory.Space.Host


def host_values(x) -> np.ndarray:
    """x as NumPy; pinned_host arrays are read through a device copy (on GPU a direct
    np.asarray keeps a zero-copy view on x)."""
    if _is_host(x):
        x = jax.device_put(x, x.sharding.with_memory_kind("device"))
    return np.asarray(jax.device_get(x))


def init_sharded_state(family, config, batch: int, mode: str, mesh: Mesh, axis: str = DEFAULT_AXIS):
    """The family's empty State for `batch` streams, built directly in its shards.

    Every stream of an empty state starts the same (no tokens, empty slots, lru
    0..B-1), so the state of one stream is built once and each device's shard is
    that stream repeated: every process materializes only its own devices' shards
    (host pool shards straight into pinned_host memory), never the whole batch.
    """
    family = get_family(family)
    _check_divisible("init_sharded_state", batch, mesh, axis)
    one = _one_stream_state(family, config, mode)
    shardings = state_shardings(family, config, mode, mesh, axis)

    def build(leaf, sharding):
        row, d = host_values(leaf.value), leaf.layout.batch_axis
        shape = (*row.shape[:d], batch, *row.shape[d + 1 :])

        def shard(index):
            local = tuple(len(range(*i.indices(n))) for i, n in zip(index, shape))
            return np.broadcast_to(row, local)

        return jax.make_array_from_callback(shape, sharding, shard)

    return layout.map_arrays(build, one, shardings)


def shard_state(family, config, state, mesh: Mesh, axis: str = DEFAULT_AXIS):
    """An existing State (e.g. built or prefilled on one device) moved onto the mesh,
    split on the batch; host pools stay pinned_host. Single-process only (it reads
    the whole state)."""
    family = get_family(family)
    _check_divisible("shard_state", state.lengths.shape[0], mesh, axis)
    return jax.device_put(state, state_shardings(family, config, state.store.mode, mesh, axis))


def replicate(tree, mesh: Mesh):
    """Every array of `tree` (weights) replicated on every device of the mesh.

    With several processes every process must pass the same values (e.g. the same
    init_weights seed or checkpoint); each builds only its own devices' copies.
    """
    sharding = NamedSharding(mesh, P())
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def place(x):
        values = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])

    return jax.tree.map(place, tree)


# --------------------------------------------------------------------------- model family


def _misses_spec(axis: str) -> P:
    return P(None, axis)  # misses [L, *streams]


_SINGLE_DEVICE_ONLY = (
    "selection traces (forced selections) and no-IO stores (store.fetch=False) are single-device "
    "benchmark features: run them with the base family, not a sharded one"
)


def _check_single_device_features(op: str, state, forced=None) -> None:
    if forced is not None or not state.store.fetch:
        raise ValueError(f"{op}: {_SINGLE_DEVICE_ONLY}")


def _no_selecting_layout(config, batch):
    raise ValueError(f"selecting_layout: {_SINGLE_DEVICE_ONLY}")


@functools.lru_cache(maxsize=None)
def sharded_family(family, mesh: Mesh, axis: str = DEFAULT_AXIS) -> Family:
    """A model family whose streams are split over `axis` of `mesh`.

    Same protocol as the family (hisparse_jax.models): `prefill` and `decode_step`
    run the family's under jax.shard_map (weights replicated, state split on its
    batch dims, tokens/prompts/lengths/logits split on the batch), `init_state`
    is init_sharded_state. Pass it to hisparse_jax.decode.prefill / generate /
    decode_step like any family: generate's lax.scan over steps, its sampling and
    its state donation run around the shard_mapped step, and every device runs
    its own RESOLVE and pool-write calls on its own streams and pool shard.
    Cached per (family, mesh, axis), so jit's cache (keyed on the family) is reused.
    """
    base = get_family(family)
    _axis_size(mesh, axis)
    stream = P(axis)

    def init_state(config, batch: int, mode: str, sharding=None):
        if sharding is not None:
            raise ValueError("a sharded family places its state on its mesh; pass no sharding")
        return init_sharded_state(base, config, batch, mode, mesh, axis)

    def prefill(config, weights, state, prompts, lengths):
        _check_divisible("prefill", lengths.shape[0], mesh, axis)
        _check_single_device_features("prefill", state)
        specs = state_specs(base, config, state.store.mode, axis)
        fn = jax.shard_map(
            functools.partial(base.prefill, config), mesh=mesh,
            in_specs=(P(), specs, stream, stream), out_specs=(specs, stream),
        )
        return fn(weights, state, prompts, lengths)

    def decode_step(config, weights, state, tokens, forced=None, record_selection=False):
        _check_divisible("decode_step", tokens.shape[0], mesh, axis)
        _check_single_device_features("decode_step", state, forced)
        if record_selection:
            _no_selecting_layout(config, tokens.shape[0])  # refuses, with its reason
        specs = state_specs(base, config, state.store.mode, axis)

        def local_step(weights, state, tokens):
            out = base.decode_step(config, weights, state, tokens)
            return out.state, out.logits, out.misses

        fn = jax.shard_map(local_step, mesh=mesh, in_specs=(P(), specs, stream),
                           out_specs=(specs, stream, _misses_spec(axis)))
        return StepOutput(*fn(weights, state, tokens))

    return dataclasses.replace(base, name=f"{base.name}[sharded over {axis!r}]", init_state=init_state,
                               prefill=prefill, decode_step=decode_step, selecting_layout=_no_selecting_layout)

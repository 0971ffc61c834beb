"""Realistic top-k selection traces without trained weights (calibration: docs/traces.md).

Random weights give an indexer no locality: consecutive steps select nearly disjoint records,
and every cache misses far more than under a trained model. This generator replaces the
indexer's ranking by a calibrated synthetic score, per stream, selecting layer and record id i
among the n sealed records:

  s_t(i) = bias [i < sink] + bias [n - i <= local]
           + sqrt(beta) u_t(i) + sqrt(1 - beta) e_t(i)

u is a slow AR(1) salience (rho_u = 0.9997) shared by the layers; e an AR(1) flicker
(rho_e = 0.8) per layer whose innovations are chained across layers (rho_layer = 0.9), since
adjacent layers select alike. Both are stationary N(0, 1). The first `memoryless_layers` layers
use beta = 0 and rho_e = 0, as the first layers of real models barely repeat themselves.

Two calibrations are named (CALIBRATIONS): "glm-5.1" (beta 0.75, rho_e 0.8) reproduces the
HiSparse paper's GLM-5.1 LRU misses (13.4% at B = 2k, k = 2048); "deepseek-v3.2" (beta 0.55,
rho_e 0.5) its ~44% consecutive-step top-k overlap.

The ids are generated before a timed decode (`selections`: [steps, layers, *S, k]) and fed to
it as a ForcedSelection (hisparse_jax.models.paging) per step; the model still computes its own indexer scores and top-k, and
a runtime select replaces their ids, so a step costs what a real step costs and no generator
work runs inside the timed step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..topk import select_topk  # the models' own selection rule (ties, order, padding)


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """Parameters of the generator (hashable: a static jit argument).

    Attributes:
      beta: weight of the slow salience u against the flicker e, in [0, 1].
      rho_u, rho_e, rho_layer: AR(1) coefficients in [0, 1): u across steps, e across steps, e's
        innovations across layers.
      sink, local: records always selected (score + bias): the first `sink` ids and the last
        `local` sealed ids (attention sinks, recent context).
      memoryless_layers: leading selecting layers with beta = rho_e = 0.
      bias: score added to sink and local records (far above the N(0, 1) noise).
      name: the calibration this config reproduces ("glm-5.1", "deepseek-v3.2"), or "custom".
    """

    beta: float = 0.75
    rho_u: float = 0.9997
    rho_e: float = 0.80
    rho_layer: float = 0.9
    sink: int = 4
    local: int = 64
    memoryless_layers: int = 0
    bias: float = 100.0
    name: str = "glm-5.1"

    def __post_init__(self):
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"TraceConfig.beta must lie in [0, 1], got {self.beta}")
        for name in ("rho_u", "rho_e", "rho_layer"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"TraceConfig.{name} must lie in [0, 1), got {value}")
        for name in ("sink", "local", "memoryless_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TraceConfig.{name} must be an int >= 0, got {value!r}")

    @classmethod
    def for_page_size(cls, page_size: int, sink_tokens: int = 4, local_tokens: int = 64, **fields):
        """The config with sink and local given in tokens, for records of `page_size` tokens."""
        pages = lambda tokens: -(-tokens // page_size)
        return cls(sink=pages(sink_tokens), local=pages(local_tokens), **fields)

    @classmethod
    def calibration(cls, name: str, page_size: int = 1, **fields):
        """A named calibration (CALIBRATIONS) for records of `page_size` tokens; `fields` that
        change its beta or rho_e make it a "custom" one (it no longer reproduces the source)."""
        if name not in CALIBRATIONS:
            raise ValueError(f"unknown trace calibration {name!r}; calibrations: {', '.join(CALIBRATIONS)}")
        changed = any(fields.get(k, v) != v for k, v in CALIBRATIONS[name].items())
        return cls.for_page_size(page_size, **{**CALIBRATIONS[name], "name": "custom" if changed else name, **fields})


# The calibrations and what each reproduces (docs/traces.md has the sources and the measurements).
CALIBRATIONS = {
    "glm-5.1": dict(beta=0.75, rho_e=0.80),  # GLM-5.1 LRU misses (HiSparse paper)
    "deepseek-v3.2": dict(beta=0.55, rho_e=0.50),  # DeepSeek-V3.2 ~44% step overlap
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TraceState:
    """The generator's state for `layers` selecting layers over streams [*S] of R record ids.

    Attributes:
      slow: [*S, R] float32, u.
      flicker: [layers, *S, R] float32, e of each selecting layer.
      key: PRNG key; step: int32 scalar, steps taken (the key is folded with it).
      config: static TraceConfig.
    """

    slow: jax.Array
    flicker: jax.Array
    key: jax.Array
    step: jax.Array
    config: TraceConfig = dataclasses.field(metadata=dict(static=True))


def init_trace(config: TraceConfig, layers: int, stream_shape: tuple[int, ...], num_records: int,
               seed: int = 0) -> TraceState:
    """A stationary trace state (u, e ~ N(0, 1)) for `layers` selecting layers.

    Args:
      layers: selecting layers (e.g. DSA's indexer groups, Quest's sparse layers).
      stream_shape: [*S], the streams of one layer's selection.
      num_records: R, the record ids a selection ranges over.
    """
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(f"init_trace: layers must be an int >= 1, got {layers!r}")
    if config.memoryless_layers > layers:
        raise ValueError(
            f"init_trace: TraceConfig.memoryless_layers={config.memoryless_layers} exceeds the "
            f"{layers} selecting layers"
        )
    return _init(config, layers, tuple(stream_shape), num_records, jax.random.key(seed))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _init(config, layers, stream_shape, num_records, key):
    shape = (*stream_shape, num_records)
    k_slow, k_flicker, key = jax.random.split(key, 3)
    return TraceState(
        slow=jax.random.normal(k_slow, shape, jnp.float32),
        flicker=jax.random.normal(k_flicker, (layers, *shape), jnp.float32),
        key=key, step=jnp.zeros((), jnp.int32), config=config,
    )


def _ar1(previous: jax.Array, innovation: jax.Array, rho) -> jax.Array:
    """rho * previous + sqrt(1 - rho^2) * innovation: keeps N(0, 1) stationary."""
    return rho * previous + jnp.sqrt(1.0 - rho * rho) * innovation


def advance(trace: TraceState) -> TraceState:
    """One decode step: new u, and new e for every selecting layer."""
    c = trace.config
    layers = trace.flicker.shape[0]
    key = jax.random.fold_in(trace.key, trace.step)
    k_slow, k_layers = jax.random.split(key)
    slow = _ar1(trace.slow, jax.random.normal(k_slow, trace.slow.shape, jnp.float32), c.rho_u)
    fresh = jax.random.normal(k_layers, trace.flicker.shape, jnp.float32)

    def chain(previous, z):  # innovations chained across layers: eta_l = AR(eta_{l-1})
        eta = _ar1(previous, z, c.rho_layer)
        return eta, eta

    _, later = jax.lax.scan(chain, fresh[0], fresh[1:])
    eta = jnp.concatenate([fresh[:1], later], axis=0)
    rho_e = jnp.where(jnp.arange(layers) < c.memoryless_layers, 0.0, c.rho_e)
    rho_e = rho_e.reshape(layers, *([1] * (trace.flicker.ndim - 1)))
    flicker = _ar1(trace.flicker, eta, rho_e)
    return dataclasses.replace(trace, slow=slow, flicker=flicker, step=trace.step + 1)


def scores(trace: TraceState, layer, sealed: jax.Array) -> jax.Array:
    """[*S, R] float32 trace scores of one selecting layer (`layer` may be traced).

    Args:
      sealed: [*S] int32 sealed records per stream (n): the local bias covers ids n - local .. n - 1.
    """
    c = trace.config
    R = trace.slow.shape[-1]
    ids = jnp.arange(R, dtype=jnp.int32)
    n = sealed[..., None]
    pinned = (ids < c.sink) | ((ids >= n - c.local) & (ids < n))
    beta = jnp.where(layer < c.memoryless_layers, 0.0, c.beta)
    noise = jnp.sqrt(beta) * trace.slow + jnp.sqrt(1.0 - beta) * jax.lax.dynamic_index_in_dim(
        trace.flicker, layer, keepdims=False
    )
    return jnp.where(pinned, c.bias, 0.0) + noise


# --------------------------------------------------------------------------- forced selections


def selections(config: TraceConfig, layers: int, stream_shape: tuple[int, ...], num_records: int, k: int,
               lengths: jax.Array, steps: int, page_size: int = 1, seed: int = 0) -> jax.Array:
    """The ids a trace selects at each of `steps` decode steps: [steps, layers, *S, k] int32.

    Args:
      lengths: tokens each stream holds at the first step ([*S] int32, or [b] broadcast over
        trailing stream dims); step t ranks the (lengths + t) // page_size records sealed then.
      page_size: tokens per record.
    Generated by one jitted scan, before anything is timed. Ids are ascending per stream with
    -1 padding, the top-k of the trace scores among the sealed records (ties to the lower id).
    """
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"selections: steps must be a positive int, got {steps!r}")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= num_records:
        raise ValueError(f"selections: k must be an int in [1, num_records={num_records}], got {k!r}")
    trace = init_trace(config, layers, stream_shape, num_records, seed)
    lengths = jnp.asarray(lengths, jnp.int32)
    lengths = lengths.reshape(*lengths.shape, *([1] * (len(stream_shape) - lengths.ndim)))
    tokens = jnp.broadcast_to(lengths, tuple(stream_shape))
    return _selections(trace, tokens, int(steps), int(k), int(page_size))


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _selections(trace, tokens, steps, k, page_size):
    layers = trace.flicker.shape[0]

    def step(trace, t):
        trace = advance(trace)
        sealed = (tokens + t) // page_size
        ids = jnp.stack([select_topk(scores(trace, l, sealed), sealed, k) for l in range(layers)])
        return trace, ids

    _, ids = jax.lax.scan(step, trace, jnp.arange(steps, dtype=jnp.int32))
    return ids


def describe(config: TraceConfig) -> str:
    """One line naming the generator's parameters, for benchmark output."""
    label = "uncalibrated custom parameters" if config.name == "custom" else f"{config.name}-like calibration"
    return (
        f"trace selection ({label}, docs/traces.md): beta={config.beta}, "
        f"rho_u={config.rho_u}, rho_e={config.rho_e}, rho_layer={config.rho_layer}, sink={config.sink} "
        f"and local={config.local} records, memoryless_layers={config.memoryless_layers}"
    )

"""Times the jitted decode of one family at one batch and context, in one mode.

The state holds `context` tokens per stream, from the family's own dense
prefill of random prompts ("prefill") or from a synthetic fill
("synthetic", hisparse_jax.bench.synthetic: no O(T^2) prefill, for long
contexts). A TraceConfig makes the selection follow the calibrated synthetic
trace (hisparse_jax.traces) instead of the indexer on random weights.

The decode is `hisparse_jax.decode.generate` (one jitted lax.scan over
`steps`, state donated). The first generate call compiles and warms the hot
caches; it is not timed. The median of `reps` further calls is.
"""

from __future__ import annotations

import dataclasses
import time
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from .. import decode, traces
from .synthetic import synthetic_state, with_trace, without_fetch

FILLS = ("prefill", "synthetic")


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    """One measured decode run.

    Attributes:
      step_seconds: median wall time of one decode step over all streams (TPOT).
      tokens_per_second: batch / step_seconds.
      misses_per_step: mean records fetched from the host pool per step (all
        layers and streams) over the timed calls; 0 outside "hisparse".
      selected_per_step: records selected per step (all layers and streams).
      fetch: False for a no-IO run (RESOLVE without the record copy).
      tokens: [steps, batch] tokens of the last timed call (for equality checks).
    """

    mode: str
    batch: int
    context: int
    steps: int
    step_seconds: float
    step_seconds_all: tuple[float, ...]
    tokens_per_second: float
    misses_per_step: float
    selected_per_step: float
    fetch: bool
    tokens: np.ndarray


def initial_state(family: ModuleType, config, weights, mode: str, batch: int, context: int, *,
                  fill: str = "prefill", trace: traces.TraceConfig | None = None, seed: int = 0):
    """(state holding `context` tokens per stream, first tokens [batch] int32) to decode from."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    rng = np.random.default_rng(seed)
    if fill == "prefill":
        prompts = jnp.asarray(rng.integers(0, config.vocab, (batch, context)), jnp.int32)
        state = family.init_state(config, batch, mode)
        state, logits = decode.prefill(family, config, weights, state, prompts,
                                       jnp.full((batch,), context, jnp.int32))
        first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        state = synthetic_state(family, config, batch, mode, context, seed=seed)
        first = jnp.asarray(rng.integers(0, config.vocab, (batch,)), jnp.int32)
    if trace is not None:
        state = with_trace(family, config, state, trace, seed=seed)
    return state, first


def tokens_needed(context: int, steps: int, reps: int, no_io: bool = False) -> int:
    """Tokens a stream holds by the end of decode_timings: the context, then every decode call
    (warm-up and timed; twice with no_io). Config.max_context must exceed it."""
    return context + steps * (reps + 1) * (2 if no_io else 1)


def time_decode(family: ModuleType, config, weights, state, first_tokens, context: int, steps: int,
                reps: int):
    """(DecodeTiming, state after the last call) of decoding from `state` (holding `context` tokens)."""
    out, _, misses, state = decode.generate(family, config, weights, state, first_tokens, steps)  # compiles
    jax.block_until_ready(out)
    times, fetched = [], []
    for _ in range(reps):
        # The next call's first tokens are ready before the clock starts (slicing them out
        # compiles once per shape, which must not be timed).
        first = jax.block_until_ready(out[-1])
        t0 = time.perf_counter()
        out, _, misses, state = decode.generate(family, config, weights, state, first, steps)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / steps)
        fetched.append(float(np.asarray(misses).sum()) / steps)
    step = float(np.median(times))
    batch = int(state.lengths.shape[0])
    streams_per_step = int(np.prod(np.asarray(misses).shape[1:]))  # layers x streams
    mode = state.store.mode
    timing = DecodeTiming(
        mode=mode,
        batch=batch,
        context=context,
        steps=steps,
        step_seconds=step,
        step_seconds_all=tuple(times),
        tokens_per_second=batch / step,
        misses_per_step=float(np.mean(fetched)) if mode == "hisparse" else 0.0,
        selected_per_step=float(streams_per_step * config.top_k),
        fetch=state.store.fetch,
        tokens=np.asarray(out),
    )
    return timing, state


def decode_timings(
    family: ModuleType, config, weights, mode: str, batch: int, context: int, steps: int, reps: int, *,
    fill: str = "prefill", trace: traces.TraceConfig | None = None, no_io: bool = False, seed: int = 0,
) -> list[DecodeTiming]:
    """The timed decode of one state; with no_io (mode "hisparse"), then the same state
    decoded again with RESOLVE's record copy switched off (the pure resolve cost)."""
    state, first = initial_state(family, config, weights, mode, batch, context, fill=fill, trace=trace,
                                 seed=seed)
    timing, state = time_decode(family, config, weights, state, first, context, steps, reps)
    timings = [timing]
    if no_io and mode == "hisparse":
        quiet, state = time_decode(family, config, weights, without_fetch(state), jnp.asarray(timing.tokens[-1]),
                                   context, steps, reps)
        timings.append(quiet)
    return timings


def decode_timing(family: ModuleType, config, weights, mode: str, batch: int, context: int, steps: int,
                  reps: int, seed: int = 0, **options) -> DecodeTiming:
    """decode_timings' first (with-IO) timing."""
    return decode_timings(family, config, weights, mode, batch, context, steps, reps, seed=seed, **options)[0]

"""Times the jitted decode of one family at one batch and context, in one mode.

Prompts are random tokens of exactly `context` tokens, prefilled with the
family's own prefill; the decode is `hisparse_jax.decode.generate` (one jitted
lax.scan over `steps`, state donated). The first generate call compiles and is
not timed; the median of `reps` further calls of the same program is.
"""

from __future__ import annotations

import dataclasses
import time
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from .. import decode


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    """One measured decode run.

    Attributes:
      step_seconds: median wall time of one decode step over all streams (TPOT).
      tokens_per_second: batch / step_seconds.
      misses_per_step: mean records fetched from the host pool per step (all
        layers and streams); 0 outside "hisparse".
      selected_per_step: records selected per step (all layers and streams).
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
    tokens: np.ndarray


def decode_timing(
    family: ModuleType, config, weights, mode: str, batch: int, context: int, steps: int, reps: int, seed: int = 0
) -> DecodeTiming:
    rng = np.random.default_rng(seed)
    prompts = jnp.asarray(rng.integers(0, config.vocab, (batch, context)), jnp.int32)
    lengths = jnp.full((batch,), context, jnp.int32)
    state = family.init_state(config, batch, mode)
    state, logits = decode.prefill(family, config, weights, state, prompts, lengths)
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out, _, misses, state = decode.generate(family, config, weights, state, tokens, steps)  # compiles
    jax.block_until_ready(out)
    times, fetched = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        out, _, misses, state = decode.generate(family, config, weights, state, out[-1], steps)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / steps)
        fetched.append(float(np.asarray(misses).sum()) / steps)
    step = float(np.median(times))
    streams_per_step = int(np.prod(np.asarray(misses).shape[1:]))  # layers x streams
    return DecodeTiming(
        mode=mode,
        batch=batch,
        context=context,
        steps=steps,
        step_seconds=step,
        step_seconds_all=tuple(times),
        tokens_per_second=batch / step,
        misses_per_step=float(np.mean(fetched)) if mode == "hisparse" else 0.0,
        selected_per_step=float(streams_per_step * config.top_k),
        tokens=np.asarray(out),
    )

"""Helpers the model tests share: ragged prompts, cached end-to-end decode runs, bit equality.

Compiling a decode program is what costs time on CPU, so each (family, config, mode, steps)
run is prefilled and decoded once per session and shared by the tests that compare runs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from hisparse_jax import decode
from hisparse_jax.models import get_family


def make_prompts(seed: int = 0, lengths=(37, 20, 5), T: int = 40, vocab: int = 256):
    """[b, T] int32 prompts (random tokens past each length too) and lengths [b], as NumPy."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (len(lengths), T)).astype(np.int32)
    return prompts, np.asarray(lengths, np.int32)


@functools.cache
def weights_for(family: str, config: Any, seed: int = 0):
    """family.init_weights(config, seed), cached."""
    return get_family(family).init_weights(config, seed)


@dataclasses.dataclass(frozen=True)
class Run:
    """What one prefill + generate produced (arrays as NumPy) and the state after it."""

    prefill_logits: np.ndarray  # [b, V]
    tokens: np.ndarray  # [steps, b]
    logits: np.ndarray  # [steps, b, V]
    misses: np.ndarray  # [steps, L, *streams]
    state: Any  # the family's State after decoding

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.state.lengths)

    @property
    def pool_memory_kind(self):
        """Memory kind of the host pool after generate (None off "hisparse")."""
        pool = self.state.store.host_pool
        return None if pool is None else pool.sharding.memory_kind


@functools.cache
def decode_run(family: str, config: Any, mode: str, steps: int, lengths: tuple, T: int) -> Run:
    """Prefill make_prompts(0, lengths, T) and greedily decode `steps` tokens (cached)."""
    module = get_family(family)
    prompts, lens = make_prompts(0, lengths, T)
    weights = weights_for(family, config)
    state = module.init_state(config, len(lengths), mode)
    state, prefill_logits = decode.prefill(family, config, weights, state, jnp.asarray(prompts), jnp.asarray(lens))
    first = jnp.argmax(prefill_logits, axis=-1).astype(jnp.int32)
    tokens, logits, misses, state = decode.generate(family, config, weights, state, first, steps, return_logits=True)
    return Run(np.asarray(prefill_logits), np.asarray(tokens), np.asarray(logits), np.asarray(misses), state)


def assert_bitwise_equal(a: Run, b: Run) -> None:
    """Tokens and every logit bit equal, zero tolerance."""
    np.testing.assert_array_equal(a.prefill_logits.view(np.uint32), b.prefill_logits.view(np.uint32))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    differ = a.logits.view(np.uint32) != b.logits.view(np.uint32)
    assert not differ.any(), (
        f"logits differ in {int(differ.sum())} entries; first differing step {int(np.argmax(differ.any((1, 2))))}"
    )

"""Fixtures of the model tests: ragged prompts and cached end-to-end decode runs.

Compiling a decode program is what costs time here (seconds each on a small
CPU), so every (config, mode) pair is prefilled and decoded once per session
and shared by the tests that compare runs; the program tests use the same
shapes, so their lowering reuses those compilations.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.models import dsa

PROMPT_LENGTHS = (37, 20, 5)  # ragged batch of 3: long, middle, shorter than k
PROMPT_T = 40
STEPS = 64
K = 8


def small_cache_config(**overrides) -> dsa.Config:
    """Tiny DSA, k = 8 and B = 12: a few spare slots, so LRU evicts every step."""
    return dsa.Config.tiny(**{"n_layers": 2, "top_k": K, "hot_slots": K + 4, **overrides})


def make_prompts(seed: int = 0, lengths=PROMPT_LENGTHS, T: int = PROMPT_T, vocab: int = 256):
    """[b, T] int32 prompts (random tokens past each length too) and lengths [b]."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (len(lengths), T)).astype(np.int32)
    return jnp.asarray(prompts), jnp.asarray(lengths, jnp.int32)


@dataclasses.dataclass(frozen=True)
class Run:
    """What one prefill + generate produced, as NumPy."""

    prefill_logits: np.ndarray  # [b, V]
    tokens: np.ndarray  # [STEPS, b]
    logits: np.ndarray  # [STEPS, b, V]
    misses: np.ndarray  # [STEPS, L, b]
    lengths: np.ndarray  # [b] after decoding
    pool_memory_kind: Any  # memory kind of the host pool after generate (None off hisparse)


_WEIGHTS: dict = {}
_RUNS: dict = {}


def weights_for(config: dsa.Config, seed: int = 0):
    key = (config, seed)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = dsa.init_weights(config, seed)
    return _WEIGHTS[key]


def run_decode(config: dsa.Config, mode: str, *, steps: int = STEPS) -> Run:
    """Prefill the shared prompts and greedily decode `steps` tokens (cached)."""
    key = (config, mode, steps)
    if key in _RUNS:
        return _RUNS[key]
    weights = weights_for(config)
    prompts, lengths = make_prompts()
    state = dsa.init_state(config, len(PROMPT_LENGTHS), mode)
    state, prefill_logits = decode.prefill("dsa", config, weights, state, prompts, lengths)
    first = jnp.argmax(prefill_logits, axis=-1).astype(jnp.int32)
    tokens, logits, misses, state = decode.generate(
        "dsa", config, weights, state, first, steps, return_logits=True
    )
    pool = state.store.host_pool
    _RUNS[key] = Run(
        prefill_logits=np.asarray(prefill_logits),
        tokens=np.asarray(tokens),
        logits=np.asarray(logits),
        misses=np.asarray(misses),
        lengths=np.asarray(state.lengths),
        pool_memory_kind=None if pool is None else pool.sharding.memory_kind,
    )
    return _RUNS[key]


@pytest.fixture(scope="session")
def decode_run():
    """run_decode(config, mode, steps=STEPS) -> Run, cached for the session."""
    return run_decode


@pytest.fixture(scope="session")
def make_config():
    """small_cache_config(**overrides) -> dsa.Config (tiny, 2 layers, k = 8, B = 12)."""
    return small_cache_config


@pytest.fixture(scope="session")
def prompts():
    """(prompts [3, 40] int32, lengths [3] int32), the prompts every run prefills."""
    return make_prompts()


@pytest.fixture(scope="session")
def weights():
    """weights_for(config, seed=0) -> dsa.Weights, cached."""
    return weights_for


def assert_bitwise_equal(a: Run, b: Run) -> None:
    """Tokens and every logit bit equal, zero tolerance."""
    np.testing.assert_array_equal(a.prefill_logits.view(np.uint32), b.prefill_logits.view(np.uint32))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert np.array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32)), (
        f"logits differ in {int(np.sum(a.logits != b.logits))} entries; first differing step "
        f"{int(np.argmax(np.any(a.logits != b.logits, axis=(1, 2))))}"
    )


@pytest.fixture(scope="session")
def bitwise_equal():
    """assert_bitwise_equal(run_a, run_b): tokens and logits equal bit for bit."""
    return assert_bitwise_equal


@pytest.fixture(scope="session")
def ffi_backend() -> bool:
    """True when the default backend has the RESOLVE FFI handler (C++ on CPU, CUDA on GPU)."""
    import hisparse_jax

    platform = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())  # handlers register "CUDA"
    return platform in hisparse_jax.ffi_platforms()

"""Fixtures of the model tests: ragged prompts and cached end-to-end decode runs.

Compiling a decode program is what costs time here (seconds each on a small
CPU), so every (config, mode) pair is prefilled and decoded once per session
and shared by the tests that compare runs; the program tests use the same
shapes, so their lowering reuses those compilations.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # model_helpers, whatever pytest's import mode

from model_helpers import Run, assert_bitwise_equal, make_prompts, weights_for  # noqa: E402
from model_helpers import decode_run as _decode_run  # noqa: E402

from hisparse_jax.models import dsa  # noqa: E402

PROMPT_LENGTHS = (37, 20, 5)  # ragged batch of 3: long, middle, shorter than k
PROMPT_T = 40
STEPS = 64
K = 8

_FULL_OPT = os.environ.get("HISPARSE_TEST_FULL_OPT") == "1"


def pytest_configure(config):
    """XLA:CPU compile time dominates the model tests; most optimizations off halves it.

    Set once, before anything compiles, for the whole process: jit's cache is not keyed on
    jax_disable_most_optimizations, so flipping it per module would let one module reuse a
    program compiled under the other setting. Every compared run is thus compiled under one
    setting. HISPARSE_TEST_FULL_OPT=1 keeps the optimizations (the bitwise claims hold there too).
    """
    if not _FULL_OPT:
        jax.config.update("jax_disable_most_optimizations", True)
    # GPUs run float32 matmuls in TF32 by default; decode and prefill then round
    # differently by ~1e-3, past the float tolerance of the decode-vs-prefill tests
    # (seen on an H200). Full float32 makes those checks about the math. The bitwise
    # mode comparisons hold under either setting: both modes compile under this one.
    jax.config.update("jax_default_matmul_precision", "highest")


def small_cache_config(**overrides) -> dsa.Config:
    """Tiny DSA, k = 8 and B = 12: a few spare slots, so LRU evicts every step."""
    return dsa.Config.tiny(**{"n_layers": 2, "top_k": K, "hot_slots": K + 4, **overrides})


def run_decode(config: dsa.Config, mode: str, *, steps: int = STEPS) -> Run:
    """Prefill the shared prompts and greedily decode `steps` tokens (cached)."""
    return _decode_run("dsa", config, mode, steps, PROMPT_LENGTHS, PROMPT_T)


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
    return tuple(jnp.asarray(a) for a in make_prompts(0, PROMPT_LENGTHS, PROMPT_T))


@pytest.fixture(scope="session")
def weights():
    """weights(config, seed=0) -> dsa.Weights, cached."""
    return lambda config, seed=0: weights_for("dsa", config, seed)


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

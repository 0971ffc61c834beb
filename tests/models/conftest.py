"""Fixtures of the model tests: the family under test is injected (`case`), runs are cached.

Compiling a decode program is what costs time here (seconds each on a small CPU), so every
(config, mode) pair is prefilled and decoded once per session and shared by the tests that compare
runs; the program tests use the same shapes, so their lowering reuses those compilations.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # model_helpers, whatever pytest's import mode

from model_helpers import CASES  # noqa: E402

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
    # GPUs run float32 matmuls in TF32 by default; decode and prefill then round differently by
    # ~1e-3, past the float tolerance of the decode-vs-prefill tests (seen on an H200). Full
    # float32 makes those checks about the math. The bitwise mode comparisons hold under either
    # setting: both modes compile under this one.
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(params=sorted(CASES), scope="session")
def case(request):
    """The family under test: a model_helpers.Case (configs, prompts, cached runs)."""
    return CASES[request.param]


@pytest.fixture(scope="session")
def ffi_backend() -> bool:
    """True when the default backend has the RESOLVE FFI handler (C++ on CPU, CUDA on GPU)."""
    import hisparse_jax

    return hisparse_jax.has_ffi()

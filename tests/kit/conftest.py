"""The kit tests compile decode programs like the model tests: the same XLA settings
(tests/models/conftest.py says why), set once before anything compiles."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent))  # my_indexers, whatever pytest's import mode


def pytest_configure(config):
    if os.environ.get("HISPARSE_TEST_FULL_OPT") != "1":
        jax.config.update("jax_disable_most_optimizations", True)
    jax.config.update("jax_default_matmul_precision", "highest")

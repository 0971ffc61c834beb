"""Inspecting a family's compiled decode program with a model_helpers.Case: thin adapters from a
Case to hisparse_jax.testing (the one implementation of the program checks), shared by
test_decode_program.py and test_prefetch_decode.py. STEPS and the Case's batch match the session
runs of test_families.py, so lowering reuses their compilation.
"""

from __future__ import annotations

from model_helpers import STEPS

from hisparse_jax import testing
from hisparse_jax.testing import IN_PLACE, ffi_calls  # noqa: F401 (re-exported to the tests)


def traced(case, config, mode="hisparse"):
    return testing.trace_decode(case.family, config, case.weights(config), len(case.lengths), mode, STEPS)


def assert_no_big_copies(case, config, mode):
    """Asserts the step copies no weight-, key- or KV-sized array; returns the compiled program."""
    return testing.assert_no_big_copies(case.family, config, case.weights(config), mode, len(case.lengths), STEPS)

"""DSA rebuilt on the research kit decodes exactly as it did before: tokens, logits and the ids
every indexer group selected, bit for bit (zero tolerance), against the outputs main's DSA
wrote (tests/data/dsa_golden.npz; tests/models/dsa_golden.py says how)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import dsa_golden  # noqa: E402
from hisparse_jax.testing.runs import first_difference  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "data" / "dsa_golden.npz"
RUNS = [(name, mode) for name, (_, modes) in dsa_golden.CASES.items() for mode in modes]


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDEN)
    version = str(data["jax_version"])
    if version != jax.__version__:
        pytest.skip(f"the golden DSA outputs were written by jax {version}; this is jax {jax.__version__}, whose "
                    f"XLA may round differently: regenerate with `{data['command']}` on main's DSA to compare")
    if os.environ.get("HISPARSE_TEST_FULL_OPT") == "1" or jax.default_backend() != "cpu":
        pytest.skip("the golden DSA outputs are XLA:CPU's with most optimizations off (tests/models/conftest.py)")
    return data


@pytest.mark.parametrize("name,mode", RUNS, ids=[f"{n}-{m}" for n, m in RUNS])
def test_dsa_on_the_kit_reproduces_main_bit_for_bit(golden, name, mode):
    got = dsa_golden.run(name, mode)
    want = {key.rsplit("/", 1)[1]: golden[key] for key in golden.files if key.startswith(f"{name}/{mode}/")}
    assert sorted(got) == sorted(want)
    for key in ("prefill_logits", "logits", "selections", "tokens"):
        if key in want:
            line = first_difference(f"{name} {mode} {key}", got[key], want[key], ("step", "group", "stream"))
            assert line is None, line

"""DSA rebuilt on the research kit decodes exactly as it did before: tokens, logits and the ids
every indexer group selected, bit for bit (zero tolerance), against the outputs main's DSA
wrote on a host that rounds as this one does (tests/data/dsa_golden/; tests/models/dsa_golden.py
says how, tests/golden_hosts.py how a host finds its set)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

import dsa_golden  # noqa: E402
import golden_hosts  # noqa: E402
from hisparse_jax.testing.runs import first_difference  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "data" / "dsa_golden"
RUNS = [(name, mode) for name, (_, modes) in dsa_golden.CASES.items() for mode in modes]


@pytest.fixture(scope="module")
def golden() -> golden_hosts.Choice:
    if os.environ.get("HISPARSE_TEST_FULL_OPT") == "1" or jax.default_backend() != "cpu":
        pytest.skip("the golden DSA outputs are XLA:CPU's with most optimizations off (tests/models/conftest.py)")
    return golden_hosts.choose(dsa_golden.load_sets(GOLDEN), "DSA decode")


@pytest.mark.parametrize("name,mode", RUNS, ids=[f"{n}-{m}" for n, m in RUNS])
def test_dsa_on_the_kit_reproduces_main_bit_for_bit(golden, name, mode):
    got = dsa_golden.run(name, mode)
    want = {key.rsplit("/", 1)[1]: value for key, value in golden.recorded.items() if key.startswith(f"{name}/{mode}/")}
    assert sorted(got) == sorted(want)
    # The integer outputs first: every host must give them alike (golden_hosts.Choice.differs).
    for key in ("tokens", "selections", "prefill_logits", "logits"):
        if key in want:
            line = first_difference(f"{name} {mode} {key}", got[key], want[key], ("step", "group", "stream"))
            if line is not None:
                golden.differs(line, on_every_host=key in ("tokens", "selections"))

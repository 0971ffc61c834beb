"""DSA trains as it did before the training forward took any protocol indexer: the same bits.

The forward now reaches the indexer through `LightningIndexer.train_features` (its keys, queries
and head weights, once per layer, outside the blocks) and `train_scores` (the block's two
einsums): the losses, the KLs and the whole history of a short tiny plan are the float32 values
main's hisparse_jax.train gave before (tests/train/dsa_training_golden.py computes and records
them), compared exactly against the set recorded on a host that rounds as this one does
(tests/golden_hosts.py), under the XLA setting this process compiles with. A GPU rounds
differently again (the test is skipped there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

import dsa_training_golden as golden_lib  # noqa: E402
import golden_hosts  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "data" / "dsa_training_golden.json"
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="recorded on XLA:CPU")


@pytest.fixture(scope="module")
def golden() -> golden_hosts.Choice:
    return golden_hosts.choose(golden_lib.load_sets(GOLDEN), "DSA training")


def _compare(golden: golden_hosts.Choice, what: str, got, want) -> None:
    if got != want:
        golden.differs(f"{what}: {got} here, {want} recorded")


@pytest.mark.parametrize("attention", ["dense", "sparse"])
def test_the_forward_gives_mains_losses(golden, attention):
    want = golden_lib.recorded_figures(golden.recorded)["forward"][attention]
    _compare(golden, f"{attention} forward [loss, lm, KLs]", golden_lib.forward_figures(attention), want)


def test_fit_gives_mains_training_history(golden, tmp_path):
    want = golden_lib.recorded_figures(golden.recorded)
    got = golden_lib.fit_figures(tmp_path)
    _compare(golden, "history [lm, KL] per step", got["history"], want["history"])
    _compare(golden, "held-out [dense lm, sparse lm] per phase", got["held_out"], want["held_out"])

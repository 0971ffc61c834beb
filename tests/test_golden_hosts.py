"""How a golden test finds the set recorded on a host like this one (tests/golden_hosts.py): the
fingerprint is stable and names the rounding, a recorded host's difference fails, an unrecorded
host's difference skips, and a host with no set skips saying how to record one."""

from __future__ import annotations

import os
import re
import sys
import subprocess
from pathlib import Path

import jax
import pytest

import golden_hosts

TESTS = Path(__file__).parent


def _set(fingerprint, version=None):
    return {"fingerprint": fingerprint, "jax_version": version or jax.__version__}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="names XLA:CPU's rounding")
def test_the_fingerprint_is_the_same_under_either_optimization_setting():
    """The suite runs with most optimizations off or on; the probe compiles with fixed options,
    so a host has one fingerprint in every process."""
    def fingerprint_with(disabled: str) -> str:
        out = subprocess.run([sys.executable, str(TESTS / "golden_hosts.py")], capture_output=True, text=True,
                             check=True, env={**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": disabled,
                                              "JAX_PLATFORMS": "cpu"})
        return out.stdout.split()[0]

    here = golden_hosts.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{12}", here)
    assert fingerprint_with("1") == fingerprint_with("0") == here


def test_the_set_of_this_host_is_chosen_and_its_differences_fail(monkeypatch):
    monkeypatch.setattr(golden_hosts, "fingerprint", lambda: "aaaaaaaaaaaa")
    sets = [_set(None), _set("bbbbbbbbbbbb"), _set("aaaaaaaaaaaa")]
    choice = golden_hosts.choose(sets, "test")
    assert choice.recorded is sets[2] and choice.exact_host
    with pytest.raises(AssertionError, match="^logits differ$"):
        choice.differs("logits differ")


def test_a_host_without_a_set_compares_with_the_unrecorded_one_and_skips_on_a_difference(monkeypatch):
    monkeypatch.setattr(golden_hosts, "fingerprint", lambda: "cccccccccccc")
    sets = [_set("bbbbbbbbbbbb"), _set(None)]
    choice = golden_hosts.choose(sets, "test")
    assert choice.recorded is sets[1] and not choice.exact_host
    with pytest.raises(pytest.skip.Exception, match="fingerprint cccccccccccc.*logits differ.*tests/record_goldens.sh"):
        choice.differs("logits differ")


def test_integer_outputs_fail_on_every_host(monkeypatch):
    """Tokens and selected ids do not depend on a CPU's rounding (both kinds seen agree): a host
    without a set of its own still fails on them."""
    monkeypatch.setattr(golden_hosts, "fingerprint", lambda: "cccccccccccc")
    choice = golden_hosts.choose([_set(None)], "test")
    with pytest.raises(AssertionError, match="^tokens differ$"):
        choice.differs("tokens differ", on_every_host=True)


def test_this_hosts_set_of_another_jax_is_not_chosen(monkeypatch):
    """A set names the jax that wrote it: this host's set of another jax gives way to the
    unrecorded set of this one (compared, not exact)."""
    monkeypatch.setattr(golden_hosts, "fingerprint", lambda: "aaaaaaaaaaaa")
    sets = [_set("aaaaaaaaaaaa", "0.0.1"), _set(None)]
    choice = golden_hosts.choose(sets, "test")
    assert choice.recorded is sets[1] and not choice.exact_host


def test_no_set_for_this_host_or_this_jax_skips_with_the_command(monkeypatch):
    monkeypatch.setattr(golden_hosts, "fingerprint", lambda: "cccccccccccc")
    with pytest.raises(pytest.skip.Exception, match="no test golden set.*cccccccccccc.*tests/record_goldens.sh"):
        golden_hosts.choose([_set("bbbbbbbbbbbb")], "test")
    with pytest.raises(pytest.skip.Exception, match="written by jax 0.0.1; this is jax .*tests/record_goldens.sh"):
        golden_hosts.choose([_set("cccccccccccc", "0.0.1"), _set(None, "0.0.1")], "test")


def test_a_set_without_figures_under_this_setting_skips(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS / "train"))
    import dsa_training_golden

    with pytest.raises(pytest.skip.Exception, match="set aaaaaaaaaaaa has no figures under optimizations_.*"
                                                    "tests/record_goldens.sh"):
        dsa_training_golden.recorded_figures({"fingerprint": "aaaaaaaaaaaa"})


def test_the_recorded_sets_name_their_hosts(monkeypatch):
    """Every set but the first (written before sets named their host) carries a fingerprint and
    the CPU it was recorded on, and a decode set's file is named by both."""
    monkeypatch.syspath_prepend(str(TESTS / "models"))
    monkeypatch.syspath_prepend(str(TESTS / "train"))
    import dsa_golden
    import dsa_training_golden

    for sets in (dsa_golden.load_sets(TESTS / "data" / "dsa_golden"),
                 dsa_training_golden.load_sets(TESTS / "data" / "dsa_training_golden.json")):
        assert sum(s["fingerprint"] is None for s in sets) == 1
        for recorded in sets:
            if recorded["fingerprint"] is not None:
                assert re.fullmatch(r"[0-9a-f]{12}", recorded["fingerprint"]) and str(recorded["host"])
                if "path" in recorded:
                    assert recorded["path"].name == f"{recorded['fingerprint']}-jax{recorded['jax_version']}.npz"

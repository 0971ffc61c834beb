"""`hisparse-bench indexers` refuses what it cannot compare in one line, before any training (the
whole pipeline runs in tests/kit/test_example_pipeline.py)."""

from __future__ import annotations

import jax
import pytest

from hisparse_jax.bench import cli


@pytest.mark.parametrize("argv, message", [
    ([], "give indexers to compare: --indexer MODULE:NAME"),
    (["--indexer", "no_such_module_xyz:X"], "argument --indexer: --indexer 'no_such_module_xyz:X': no module named"),
    (["--indexer", "hisparse_jax.kit.page_minmax:NOPE"], "has no name 'NOPE'"),
    (["--checkpoint", "missing.npz"], "argument --checkpoint: checkpoint 'missing.npz': no such file"),
    (["--checkpoint", "=x.py:Y"], "expected PATH or PATH=MODULE:NAME"),
    (["--indexer", "dsa", "--out", "/dev/null/x"], "'/dev/null' is not a folder"),
    (["--indexer", "dsa", "--ratios", "0.5"], "ratio"),
    pytest.param(["--indexer", "dsa", "--model", "trace-model"], "XLA:CPU cannot train",
                 marks=pytest.mark.skipif(jax.default_backend() != "cpu", reason="a GPU trains bfloat16")),
])
def test_a_bad_comparison_is_one_line(argv, message, tmp_path, capsys):
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert cli.main(["indexers", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("hisparse-bench: error:"), err
    assert not (tmp_path / "out").exists()

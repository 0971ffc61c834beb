"""The benchmarks/ scripts that write files check where before any work: an unwritable output
or an unreadable input report is one line on stderr and exit 2, and nothing is timed or written."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _last_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("script, argv", [
    ("topk_xla_bench", ["/dev/null/x.json", "--records", "64", "--rows", "1"]),
    ("indexer_xla_bench", ["--out", "/dev/null/x.json"]),
])
def test_a_json_that_cannot_be_written_is_refused_before_timing(script, argv, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        _script(script).main()
    assert exit_.value.code == 2
    assert "'/dev/null' is not a folder" in _last_error_line(capsys)


def test_merge_refuses_an_unwritable_folder_and_unreadable_reports(tmp_path, capsys):
    merge = _script("merge_decode_reports")
    good = tmp_path / "a.json"
    good.write_text(json.dumps(dict(family="dsa", rows=[], ratios=[])))
    other = tmp_path / "b.json"
    other.write_text(json.dumps(dict(family="gqa", rows=[], ratios=[])))
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[]")
    out = tmp_path / "merged"
    for argv, says in [
        (["/dev/null/x", str(good)], "OUT_DIR '/dev/null/x': '/dev/null' is not a folder"),
        ([str(out), str(tmp_path / "missing.json")], "missing.json: not a readable decode.json (FileNotFoundError"),
        ([str(out), str(tmp_path / "bad.json")], "bad.json: not a readable decode.json (JSONDecodeError"),
        ([str(out), str(tmp_path / "list.json")], "list.json: not a hisparse-bench decode report"),
        ([str(out), str(good), str(other)], "reports differ in family: 'dsa' vs 'gqa'"),
    ]:
        assert merge.main(argv) == 2
        line = _last_error_line(capsys)
        assert line.startswith("merge_decode_reports: error: ") and says in line, line
    assert not out.exists()  # refused before anything was written

"""The benchmarks/ scripts that write files check where before any work: an unwritable output
or an unreadable input report is one line on stderr and exit 2, and nothing is timed or written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import load_script



def _script(name: str):
    return load_script(name)


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
    (tmp_path / "rows5.json").write_text(json.dumps(dict(family="dsa", rows=5, ratios=[])))
    (tmp_path / "nocontext.json").write_text(json.dumps(dict(family="dsa", rows=[dict(mode="device")], ratios=[])))
    out = tmp_path / "merged"
    for argv, says in [
        (["/dev/null/x", str(good)], "OUT_DIR '/dev/null/x': '/dev/null' is not a folder"),
        ([str(out), str(tmp_path / "missing.json")], "missing.json: cannot be read (FileNotFoundError"),
        ([str(out), str(tmp_path / "bad.json")], "bad.json: not JSON (JSONDecodeError"),
        ([str(out), str(tmp_path / "list.json")], "list.json: not a hisparse-bench decode report"),
        ([str(out), str(good), str(other)], "reports differ in family: 'dsa' vs 'gqa'"),
        ([str(out), str(tmp_path / "rows5.json")], "rows5.json: its rows is not a list of objects with an integer context"),
        ([str(out), str(tmp_path / "nocontext.json")], "nocontext.json: its rows is not a list of objects with an"),
    ]:
        assert merge.main(argv) == 2
        line = _last_error_line(capsys)
        assert line.startswith("merge_decode_reports: error: ") and says in line, line
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("script", ["byte_bounds", "launch_gaps"])
def test_report_readers_refuse_bad_reports_in_one_line(script, tmp_path, capsys, monkeypatch):
    from hisparse_jax.bench.decode import report

    module = _script(script)
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "rowless.json").write_text(json.dumps(dict(profiles=[dict(mode="device", tpot_seconds=1e-3)])))
    big = tmp_path / "big.json"
    big.write_text("{}")
    monkeypatch.setattr(report, "REPORT_MAX_BYTES", 1)  # a file past the bound is not read at all
    for path, says in [
        (tmp_path / "missing.json", "missing.json: cannot be read (FileNotFoundError"),
        (big, "big.json: more than 1 bytes, larger than a decode.json written by hisparse-bench decode --profile can be"),
    ]:
        assert module.main([str(path)]) == 2
        line = _last_error_line(capsys)
        assert line.startswith(f"{script}: error: ") and says in line, line
    monkeypatch.setattr(report, "REPORT_MAX_BYTES", 1 << 20)
    (tmp_path / "deep.json").write_text("[" * 200_000)
    (tmp_path / "noprofiles.json").write_text(json.dumps(dict(profiles=[])))
    zero = dict(mode="device", context=64, batch=1, step_seconds=1e-3, seconds={"other": 1e-3}, tpot_seconds=0.0)
    (tmp_path / "tpot0.json").write_text(json.dumps(dict(profiles=[zero])))
    (tmp_path / "strstep.json").write_text(json.dumps(dict(profiles=[dict(zero, tpot_seconds=1e-3, step_seconds="5ms")])))
    for path, says in [
        (tmp_path / "bad.json", "bad.json: not JSON (JSONDecodeError"),
        (tmp_path / "deep.json", "deep.json: not JSON (RecursionError"),
        (tmp_path / "list.json", "list.json: not a hisparse-bench decode report (no profiles)"),
        (tmp_path / "rowless.json", "rowless.json: "),
        (tmp_path / "noprofiles.json", "noprofiles.json: no GPU profile in it; pass a decode.json of a hisparse-bench "
                                       "decode --profile run on a GPU"),
        (Path("/dev/zero"), "/dev/zero: not a regular file (a directory, device or pipe)"),
        (tmp_path, "not a regular file"),
    ] + ([(tmp_path / "tpot0.json", "tpot0.json: "), (tmp_path / "strstep.json", "strstep.json: ")]
         if script == "launch_gaps" else []):
        assert module.main([str(path)]) == 2
        line = _last_error_line(capsys)
        assert line.startswith(f"{script}: error: ") and says in line, line


def test_launch_gaps_says_which_profiles_it_cannot_join(tmp_path, capsys):
    path = tmp_path / "decode.json"
    joined = dict(mode="hisparse", context=64, batch=2, step_seconds=1e-3, seconds={"other": 1e-3}, tpot_seconds=2e-3)
    row = dict(mode="device", context=64, trace=None, run="capacity", tpot_ms_median=1.0)
    profiles = [dict(mode="device", context=64, seconds={"other": 1e-3}), joined]
    path.write_text(json.dumps(dict(deployment="slice", rows=[], profiles=profiles)))
    assert _script("launch_gaps").main([str(path)]) == 0
    assert ("the device capacity profile at context 64 has no TPOT and no timing row to join: left out"
            in capsys.readouterr().err)
    path.write_text(json.dumps(dict(deployment="slice", rows=[row, row], profiles=profiles)))
    assert _script("launch_gaps").main([str(path)]) == 0
    assert "has no TPOT and 2 timing rows that match: left out" in capsys.readouterr().err


def test_merged_reports_keep_every_contexts_profiles(tmp_path, capsys):
    merge = _script("merge_decode_reports")
    base = dict(family="dsa", ratios=[])
    for context in (32768, 131072):
        (tmp_path / f"{context}.json").write_text(json.dumps(dict(
            base, rows=[dict(mode="device", context=context)], profiles=[dict(mode="device", context=context)],
            bandwidths=[dict(context=context, hbm_bytes_per_second=3e12, host_link_bytes_per_second=4e10)])))
    merged = merge.merge([merge.load_report(str(tmp_path / f"{c}.json")) for c in (131072, 32768)])
    assert [p["context"] for p in merged["profiles"]] == [32768, 131072]
    assert [r["context"] for r in merged["rows"]] == [32768, 131072]
    assert [b["context"] for b in merged["bandwidths"]] == [32768, 131072]
    # A report of a run without them (before they were recorded, or on a CPU) merges as before.
    (tmp_path / "old.json").write_text(json.dumps(dict(base, rows=[dict(mode="device", context=262144)])))
    merged = merge.merge([merge.load_report(str(tmp_path / f)) for f in ("32768.json", "old.json")])
    assert [b["context"] for b in merged["bandwidths"]] == [32768]

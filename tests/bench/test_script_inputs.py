"""Bad input to the analysis scripts under benchmarks/ (kernel_table, trace_calibration,
two_level_bytes, byte_bounds, launch_gaps, merge_decode_reports, ncu_stalls, sass_lines): one line
on stderr naming the argument or the file and what to give instead, exit status 2, nothing on
stdout; nothing clamped or passed on. Files are read within a bound (a gzip bomb is not decompressed whole)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from helpers import load_script

from hisparse_jax.bench import device_trace
from hisparse_jax.bench.errors import BenchError



def _script(name: str):
    return load_script(name)


def _one_line(capsys, script: str) -> str:
    """The one error line the script wrote (and nothing on stdout)."""
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, (out, err)
    assert err.count("\n") == 1 and err.startswith(f"{script}: error: "), err
    return err


def _refused(capsys, script: str, main, argv: list[str]) -> str:
    """Runs main(argv), which must refuse it with status 2 (returned, or argparse's SystemExit)."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    assert status == 2
    return _one_line(capsys, script)


# --------------------------------------------------------------------------- kernel_table.py

HLO = """HloModule m, is_scheduled=true

ENTRY %main (p: f32[16,64]) -> f32[16,64] {
  %p = f32[16,64]{1,0} parameter(0)
  ROOT %loop_fusion.3 = f32[16,64]{1,0} fusion(%p), kind=kLoop, calls=%c, metadata={op_name="jit(g)/x/attention/exp"}
}
"""
GPU = {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}}


def _kernel(**fields) -> dict:
    return {"ph": "X", "pid": 2, "tid": 7, "name": "loop_fusion_3", "ts": 100.0, "dur": 10.0,
            "args": {"hlo_op": "loop_fusion.3", "hlo_module": "m"}, **fields}


def _gz(data: bytes, level: int = 9) -> bytes:
    """gzip with a fixed header time: a test id built from the bytes is the same on every pytest
    worker (pytest-xdist refuses a collection that differs between workers)."""
    return gzip.compress(data, level, mtime=0)


def _profile(folder: Path, *, events=None, raw: bytes | None = None, hlo: str | None = HLO) -> str:
    """A profiled run's folder: program.hlo.txt and one trace (gzipped {"traceEvents": events}, or
    `raw` bytes as the trace file)."""
    run = folder / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    if hlo is not None:
        (folder / "program.hlo.txt").write_text(hlo)
    data = raw if raw is not None else _gz(json.dumps({"traceEvents": events}).encode())
    (run / "host.trace.json.gz").write_bytes(data)
    return str(folder)


def test_kernel_table_prints_a_good_profile(tmp_path, capsys):
    table = _script("kernel_table")
    folder = _profile(tmp_path / "ok", events=[GPU, _kernel(), _kernel(ts=200.0, dur=30.0)])
    assert table.main([folder, "2", "--category", "attention"]) == 0
    out = capsys.readouterr().out
    assert "| attention | loop_fusion_3 | 1.00 | 10.00 / 20.00 / 30.00 | 20.0 | 0.00 |" in out
    # A call of 0 us (below the trace's resolution) is a time, not an error: no rate at it.
    folder = _profile(tmp_path / "zero", events=[GPU, _kernel(dur=0)])
    assert table.main([folder, "1", "--category", "all"]) == 0
    assert "| attention | loop_fusion_3 | 1.00 | 0.00 / 0.00 / 0.00 | 0.0 | 0.00 |  |  | f32[16,64] -> f32[16,64] |" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("argv, says", [
    (["0"], "argument steps: expected the profiled call's decode steps, an integer >= 1, got 0"),
    (["-2"], "argument steps: expected the profiled call's decode steps, an integer >= 1, got -2"),
    (["abc"], "argument steps: invalid int value: 'abc'"),
    (["2", "--hbm", "0"], "argument --hbm: expected HBM bytes/s, a finite number > 0, got 0.0"),
    (["2", "--hbm", "nan"], "argument --hbm: expected HBM bytes/s, a finite number > 0, got nan"),
    (["2", "--hbm", "-1"], "argument --hbm: expected HBM bytes/s, a finite number > 0, got -1.0"),
    (["2", "--category", "bogus"], "argument --category: invalid choice: 'bogus' (choose from 'weights/FFN'"),
])
def test_kernel_table_refuses_bad_arguments(argv, says, tmp_path, capsys):
    folder = _profile(tmp_path / "ok", events=[GPU, _kernel()])
    assert says in _refused(capsys, "kernel_table", _script("kernel_table").main, [folder, *argv])


def test_kernel_table_refuses_a_folder_that_is_not_a_profiled_run(tmp_path, capsys, monkeypatch):
    table = _script("kernel_table")
    events = [GPU, _kernel()]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "hlo_dir" / "program.hlo.txt").mkdir(parents=True)
    (tmp_path / "devzero").mkdir()
    os.symlink("/dev/zero", tmp_path / "devzero" / "program.hlo.txt")
    cpu = {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}}
    cases = [
        (tmp_path / "missing", "PROFILE_DIR '" + str(tmp_path / "missing") + "': no such folder; pass one profiled run's"),
        (tmp_path / "afile", "': a file, not a folder; pass one profiled run's folder"),
        (_profile(tmp_path / "nohlo", events=events, hlo=None), "nohlo/program.hlo.txt: cannot be read (FileNotFoundError"),
        (tmp_path / "hlo_dir", "hlo_dir/program.hlo.txt: not a regular file"),
        (tmp_path / "devzero", "devzero/program.hlo.txt: not a regular file"),
        (_profile(tmp_path / "empty", events=events, hlo=""), "empty/program.hlo.txt: no 'HloModule NAME' line"),
        (_profile(tmp_path / "garbage", events=events, hlo="garbage \x01 not hlo\n"),
         "garbage/program.hlo.txt: no 'HloModule NAME' line at its top"),
        (_profile(tmp_path / "cpu", events=[cpu, dict(_kernel(), pid=1)]),
         "its trace has no device kernels of m (a CPU run's has none)"),
    ]
    notrace = tmp_path / "notrace"
    notrace.mkdir()
    (notrace / "program.hlo.txt").write_text(HLO)
    cases.append((notrace, "no trace in it (plugins/profile/<run>/*.trace.json.gz)"))
    for folder, says in cases:
        assert table.main([str(folder), "2"]) == 2
        assert says in _one_line(capsys, "kernel_table")
    # program.hlo.txt is read within a bound, not whole whatever its size.
    monkeypatch.setattr(table, "HLO_MAX_BYTES", 16)
    assert table.main([_profile(tmp_path / "big", events=events), "2"]) == 2
    assert "big/program.hlo.txt: more than 16 bytes" in _one_line(capsys, "kernel_table")


@pytest.mark.parametrize("name, trace, says", [
    ("notgz", b"not gzip", "not a readable gzip file (BadGzipFile"),
    ("trunc", _gz(json.dumps({"traceEvents": [GPU, _kernel()]}).encode())[:30],
     "not a readable gzip file (EOFError"),
    ("notjson", _gz(b"{not json"), "not JSON (JSONDecodeError"),
    ("deep", _gz(b"[" * 200_000 + b"]" * 200_000), "not JSON (RecursionError"),
    ("noevents", _gz(b'{"events": []}'), "its traceEvents is not a list of objects"),
    ("events_str", _gz(b'{"traceEvents": "x"}'), "its traceEvents is not a list of objects"),
    ("events_int", _gz(b'{"traceEvents": [1, 2]}'), "its traceEvents is not a list of objects"),
    ("args_list", [GPU, _kernel(args=[1])], "event 1's args is not an object"),
    ("dur_str", [GPU, _kernel(dur="x")], "event 1's dur is 'x', not a finite number of microseconds >= 0"),
    ("dur_nan", [GPU, _kernel(dur=float("nan"))], "event 1's dur is nan, not a finite number of microseconds"),
    ("dur_neg", [GPU, _kernel(dur=-5.0)], "event 1's dur is -5.0, not a finite number of microseconds >= 0"),
    ("dur_huge", [GPU, _kernel(dur=10**400)], "event 1's dur is 1000000000"),
    ("dur_bool", [GPU, _kernel(dur=True)], "event 1's dur is True, not a finite number"),
    ("ts_inf", [GPU, _kernel(ts=float("inf"))], "event 1's ts is inf, not a finite number of microseconds >= 0"),
    ("ts_neg", [GPU, _kernel(ts=-1)], "event 1's ts is -1, not a finite number of microseconds >= 0"),
])
def test_kernel_table_refuses_a_trace_that_is_not_one(name, trace, says, tmp_path, capsys):
    folder = (_profile(tmp_path / name, raw=trace) if isinstance(trace, bytes)
              else _profile(tmp_path / name, events=trace))
    line = _refused(capsys, "kernel_table", _script("kernel_table").main, [folder, "2"])
    assert f"{name}/plugins/profile/2026_01_01/host.trace.json.gz: {says}" in line, line
    assert line.rstrip().endswith("pass the trace of a profiled run (jax.profiler's plugins/profile/<run>/*.trace.json.gz)")


def test_the_trace_is_decompressed_within_a_bound(tmp_path, capsys, monkeypatch):
    # A megabyte of spaces in a 1 KB gzip: refused once the decompressed bytes pass the bound,
    # before the JSON is parsed; at the bound itself it is read.
    bomb = _gz(b"[" + b" " * (1 << 20) + b"]", 9)
    folder = _profile(tmp_path / "bomb", raw=bomb)
    monkeypatch.setattr(device_trace, "TRACE_MAX_BYTES", 4096)
    with pytest.raises(BenchError, match=r"host.trace.json.gz: more than 4096 bytes decompressed \(TRACE_MAX_BYTES"):
        device_trace.device_kernels(folder)
    assert "more than 4096 bytes decompressed" in _refused(capsys, "kernel_table", _script("kernel_table").main,
                                                           [folder, "2"])
    monkeypatch.setattr(device_trace, "TRACE_MAX_BYTES", (1 << 20) + 2)
    assert device_trace.device_kernels(folder) == []  # an empty list of events: no kernels


def test_a_trace_file_that_is_not_a_regular_file_is_refused(tmp_path):
    run = tmp_path / "plugins" / "profile" / "r"
    run.mkdir(parents=True)
    os.symlink("/dev/zero", run / "x.trace.json.gz")
    with pytest.raises(BenchError, match="x.trace.json.gz: not a regular file"):
        device_trace.device_kernels(str(tmp_path))


# --------------------------------------------------------------------------- trace_calibration.py

_SMALL = ["--calibrations", "glm-5.1", "--seeds", "0", "--contexts", "64", "--k", "8", "--steps", "10", "--warm", "2"]


@pytest.mark.parametrize("change, says", [
    (["--contexts", "0"], "argument --contexts: expected sealed records n in [1, 16777216]"),
    (["--contexts", "-64"], "argument --contexts: expected sealed records n in [1, 16777216]"),
    (["--contexts", "2147483647"], "argument --contexts: expected sealed records n in [1, 16777216] (2^24"),
    (["--k", "0"], "argument --k: expected records selected per step in [1, 64]"),
    (["--k", "128"], "argument --k: expected records selected per step in [1, 64] (at most the smallest --contexts"),
    (["--steps", "0", "--warm", "0"], "argument --steps: expected steps in [1, 65536]"),
    (["--steps", "100000"], "argument --steps: expected steps in [1, 65536]"),
    (["--warm", "10"], "argument --warm: expected warm-up steps in [0, 9] (below --steps 10"),
    (["--warm", "-5"], "argument --warm: expected warm-up steps in [0, 9]"),
    (["--seeds", "-1"], "argument --seeds: expected seeds in [0, 2^32)"),
    (["--seeds", "4294967296"], "argument --seeds: expected seeds in [0, 2^32) (JAX keeps a seed's low 32 bits"),
    (["--seeds", "99999999999999999999999"], "argument --seeds: expected seeds in [0, 2^32)"),
    (["--seeds", "1", "1"], "argument --seeds: 1 given twice; give each once"),
    (["--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
])
def test_trace_calibration_refuses_out_of_range_arguments(change, says, capsys):
    # Argparse keeps the last of a repeated option: the change overrides the small run's value.
    line = _refused(capsys, "trace_calibration", _script("trace_calibration").main, [*_SMALL, *change])
    assert says in line, line


def test_trace_calibration_runs_at_the_edges_of_its_ranges(capsys):
    argv = ["--calibrations", "glm-5.1", "--seeds", str(2**32 - 1), "--contexts", "16", "--k", "16", "--steps", "3",
            "--warm", "2"]
    assert _script("trace_calibration").main(argv) == 0
    assert f"| glm-5.1 | 16 | 1 | {2**32 - 1} |" in capsys.readouterr().out


# --------------------------------------------------------------------------- two_level_bytes.py

@pytest.mark.parametrize("argv, says", [
    (["--deployment", "bogus"], "argument --deployment: expected one of glm5-h200, dsv32-h200, got 'bogus'"),
    (["--deployment", "qwen3-quest-h200"], "argument --deployment: qwen3-quest-h200 is a quest deployment, without "
                                           "DSA's indexer keys that two-level indexers replace; give one of"),
    (["--indexers", "bogus"], "argument --indexers: invalid choice: 'bogus' (choose from 'TwoLevel'"),
    (["--indexers", "__builtins__"], "argument --indexers: invalid choice: '__builtins__'"),
    (["--indexers", "TwoLevel", "TwoLevel"], "argument --indexers: TwoLevel given twice; give each once"),
    (["--contexts", "0"], "argument --contexts: expected tokens per request in [1983, 2147483582] for glm5-h200 "
                          "(max_context = context + 65 holds its top_k records and is at most 2^31 - 1), got 0"),
    (["--contexts", "1982"], "in [1983, 2147483582] for glm5-h200"),
    (["--contexts", "2147483583"], "got 2147483583"),
    (["--deployment", "dsv32-h200", "--contexts", "-5"], "in [1983, 2147483582] for dsv32-h200"),
    (["--contexts", "131072", "131072"], "argument --contexts: 131072 given twice; give each once"),
])
def test_two_level_bytes_refuses_what_its_configs_cannot_take(argv, says, capsys):
    line = _refused(capsys, "two_level_bytes", _script("two_level_bytes").main, argv)
    assert says in line, line


def test_two_level_bytes_takes_the_ends_of_its_context_range(capsys):
    assert _script("two_level_bytes").main(["--contexts", "1983", "2147483582", "--indexers", "TwoLevel"]) == 0
    out = capsys.readouterr().out
    assert "| 1983 | DSA (fp8 keys) |" in out and "| 2147483582 | two-level" in out


# --------------------------------------------------------------------------- byte_bounds.py, launch_gaps.py

def _gpu_profile(**fields) -> dict:
    return {"mode": "device", "context": 64, "batch": 2, "trace": "t", "step_seconds": 5e-3, "tpot_seconds": 4e-3,
            "seconds": {"weights/FFN": 2e-3, "attention": 1e-3, "other": 5e-4},
            "bytes": {"weights": 1e9, "metadata": 0.0, "attended KV": 1e6, "miss IO": 0.0},
            "bandwidths": {"hbm": 4e12, "host link": 5e10}, "kernels_per_step": 400.0, "roofline_seconds": 3e-3,
            **fields}


def _report(tmp_path: Path, name: str, *profiles: dict, text: str | None = None, **fields) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(text if text is not None else json.dumps(dict(rows=[], profiles=list(profiles), **fields)))
    return str(path)


# Both scripts refuse these (benchmarks/script_checks.py): (file name, profile fields, what the line says).
SHARED = [
    ("seconds_neg", dict(seconds={"attention": -1.0}), "seconds['attention'] is -1.0, not a finite number of seconds >= 0"),
    ("seconds_str", dict(seconds={"attention": 1e-3, "other": "x"}), "seconds['other'] is 'x', not a finite number"),
    ("context_float", dict(context=1.5), "context is 1.5, not an integer >= 1"),
    ("context_str", dict(context="x"), "context is 'x', not an integer >= 1"),
    ("batch_0", dict(batch=0), "batch is 0, not an integer >= 1"),
    ("batch_bool", dict(batch=True), "batch is True, not an integer >= 1"),
    ("mode_number", dict(mode=5), "mode is 5, not a name"),
    ("trace_list", dict(trace=[1]), "trace is [1], not a name or null"),
]


@pytest.mark.parametrize("name, fields, says", SHARED + [
    ("seconds_inf", None, "seconds['attention'] is inf, not a finite number of seconds >= 0"),
    ("bandwidth_0", dict(bandwidths={"hbm": 0, "host link": 5e10}), "bandwidths['hbm'] is 0, not a finite number of "
                                                                     "bytes/s > 0"),
    ("bandwidth_neg", dict(bandwidths={"hbm": 4e12, "host link": -1e12}), "bandwidths['host link'] is -1000000000000.0"),
    ("bandwidth_nan", None, "bandwidths['hbm'] is nan, not a finite number of bytes/s > 0"),
    ("bytes_neg", dict(bytes={"weights": -5, "metadata": 0, "attended KV": 0, "miss IO": 0}),
     "bytes['weights'] is -5, not a finite number of bytes >= 0"),
    # Each value finite, the figures shown from them not: refused, not printed as inf.
    ("seconds_huge", dict(seconds={"attention": 1e308}), "its bounds overflow to inf or nan"),
    ("bandwidth_tiny", dict(bandwidths={"hbm": 1e-300, "host link": 5e10}), "its bounds overflow to inf or nan"),
])
def test_byte_bounds_refuses_profile_values_that_are_not_numbers_of_their_kind(name, fields, says, tmp_path, capsys):
    if name == "seconds_inf":
        path = _report(tmp_path, name, text=json.dumps(dict(profiles=[_gpu_profile()])).replace("0.001", "Infinity"))
    elif name == "bandwidth_nan":
        path = _report(tmp_path, name, text=json.dumps(dict(profiles=[_gpu_profile()])).replace("4000000000000.0", "NaN"))
    else:
        path = _report(tmp_path, name, _gpu_profile(**fields))
    line = _refused(capsys, "byte_bounds", _script("byte_bounds").main, [path])
    assert f"{path}: profile 0 lacks a field or holds a wrong value" in line and says in line, line
    assert line.rstrip().endswith("pass a decode.json written by hisparse-bench decode --profile")


def test_byte_bounds_refuses_a_family_that_is_not_a_name(tmp_path, capsys):
    path = _report(tmp_path, "family", _gpu_profile(), family=5)
    assert "family.json: its family is 5, not a family's name" in _refused(
        capsys, "byte_bounds", _script("byte_bounds").main, [path])
    assert _script("byte_bounds").main([_report(tmp_path, "ok", _gpu_profile(), family="dsa")]) == 0


@pytest.mark.parametrize("name, fields, says", SHARED + [
    ("step_0", dict(step_seconds=0.0), "profile 0's step_seconds is 0.0, not a finite number of seconds > 0"),
    ("step_neg", dict(step_seconds=-1e-3), "profile 0's step_seconds is -0.001, not a finite number of seconds > 0"),
    ("kernels_0", dict(kernels_per_step=0), "profile 0's kernels_per_step is 0, not a finite number of kernels > 0"),
    ("kernels_neg", dict(kernels_per_step=-3), "profile 0's kernels_per_step is -3, not a finite number of kernels"),
    ("kernels_null", dict(kernels_per_step=None), "profile 0's kernels_per_step is None, not a finite number"),
    ("roofline_neg", dict(roofline_seconds=-1), "profile 0's roofline_seconds is -1, not a finite number of seconds > 0"),
    ("roofline_0", dict(roofline_seconds=0.0), "profile 0's roofline_seconds is 0.0, not a finite number"),
    ("busy_nan", dict(busy_seconds="nan"), "profile 0's busy_seconds is 'nan', not a finite number of seconds >= 0"),
    ("step_huge", dict(step_seconds=1e308), "profile 0's figures overflow to inf or nan"),
    ("tpot_tiny", dict(tpot_seconds=1e-320), "profile 0's figures overflow to inf or nan"),
])
def test_launch_gaps_refuses_profile_values_that_are_not_numbers_of_their_kind(name, fields, says, tmp_path, capsys):
    path = _report(tmp_path, name, _gpu_profile(**fields))
    line = _refused(capsys, "launch_gaps", _script("launch_gaps").main, [path])
    assert f"{path}: a profile or timing row lacks a field or holds a wrong value" in line and says in line, line


def test_launch_gaps_shows_a_missing_roofline_or_kernel_count_as_a_dash(tmp_path, capsys):
    profile = _gpu_profile()
    del profile["kernels_per_step"], profile["roofline_seconds"]
    assert _script("launch_gaps").main([_report(tmp_path, "old", profile)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("| - | - | - |")


# --------------------------------------------------------------------------- merge_decode_reports.py

def test_merge_refuses_a_run_given_twice_and_says_its_usage(tmp_path, capsys):
    merge = _script("merge_decode_reports")
    row = dict(context=64, mode="device", run="capacity", trace="t")
    base = dict(family="dsa", ratios=[])
    one = _report(tmp_path, "one", text=json.dumps(dict(base, rows=[row])))
    two = _report(tmp_path, "two", text=json.dumps(dict(base, rows=[dict(row, context=128)])))
    same = _report(tmp_path, "same", text=json.dumps(dict(base, rows=[dict(row, context=128)])))
    profiled = _report(tmp_path, "profiled", text=json.dumps(dict(base, rows=[], profiles=[dict(context=1.5)])))
    out = tmp_path / "merged"
    for argv, says in [
        ([str(out), one, one], f"{one}: its row (context 64, mode device, run capacity, trace t) is already in {one}; "
                               "pass each run's report once"),
        ([str(out), one, two, same], f"{same}: its row (context 128, mode device, run capacity, trace t) is already "
                                     f"in {two}"),
        ([str(out), profiled], "profiled.json: its profiles is not a list of objects with an integer context"),
        ([], "expected OUT_DIR and at least one REPORT.json; usage: python benchmarks/merge_decode_reports.py OUT_DIR "
             "REPORT.json..."),
        ([str(out)], "expected OUT_DIR and at least one REPORT.json; usage:"),
    ]:
        assert says in _refused(capsys, "merge_decode_reports", merge.main, argv)
    assert not out.exists()  # refused before anything was written


# --------------------------------------------------------------------------- ncu_stalls.py

NCU_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_lg",'
              '"stall_long_sb","stall_lg (Not Issued)"')


def _ncu_page(tmp_path: Path, *rows: str, first: str = '"Kernel Name","k(Args)",') -> str:
    path = tmp_path / "source.csv"
    path.write_text("\n".join([first, NCU_HEADER, *rows]) + "\n")
    return str(path)


def test_ncu_stalls_sums_reasons_and_lists_the_top_instructions(tmp_path, capsys):
    page = _ncu_page(tmp_path, '"0x10","LDG.E R1, [R2]","30","1,056","10","20","9"',
                     '"0x20","HGMMA.64x32x16","","64","",""," "', '"0x30","BAR.SYNC","10","8","10","0","0"')
    assert _script("ncu_stalls").main([page, "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "k(Args): 40 stall samples, 1128 warp instructions executed"
    assert out[1].split() == ["stall_lg", "20", "50.0%"] and out[2].split() == ["stall_long_sb", "20", "50.0%"]
    assert out[4].split()[:2] == ["0", "30"] and "stall_long_sb 20, stall_lg 10" in out[4]
    assert out[5].split()[:2] == ["2", "10"] and len(out) == 6  # --top 2; the "Not Issued" column is not a reason


@pytest.mark.parametrize("rows, first, says", [
    (['"0x10","LDG","1","1","1","1","1"'], "x", "no 'Kernel Name' line first"),
    ([], '"Kernel Name","k",', "no 'Kernel Name' line first"),
    (['"0x10","LDG","many","1","1","1","1"'], None, "row 3: 'Warp Stall Sampling (All Samples)' is 'many', not a count"),
    (['"0x10","LDG","1","1","-1","1","1"'], None, "row 3: 'stall_lg' is '-1', not a count"),
    (['"0x10","LDG","1","1","nan","1","1"'], None, "row 3: 'stall_lg' is 'nan', not a count"),
    (['"0x10","LDG","1"'], None, "row 3 has 3 cells, the header 7"),
])
def test_ncu_stalls_refuses_what_is_not_a_source_page(rows, first, says, tmp_path, capsys):
    page = _ncu_page(tmp_path, *rows, **({} if first is None else {"first": first}))
    err = _refused(capsys, "ncu_stalls", _script("ncu_stalls").main, [page])
    assert f"{page}: {says}" in err and "pass the output of `ncu -i REPORT --page source --csv" in err


def test_ncu_stalls_refuses_a_page_without_its_columns_and_a_bad_top(tmp_path, capsys):
    path = tmp_path / "source.csv"
    path.write_text('"Kernel Name","k",\n"Address","Source","Instructions Executed","stall_lg"\n"0x1","X","1","1"\n')
    err = _refused(capsys, "ncu_stalls", _script("ncu_stalls").main, [str(path)])
    assert "no 'Warp Stall Sampling (All Samples)' column" in err
    err = _refused(capsys, "ncu_stalls", _script("ncu_stalls").main, [str(path), "--top", "-1"])
    assert "--top must be an integer in [0, 10000], got -1" in err
    err = _refused(capsys, "ncu_stalls", _script("ncu_stalls").main, [str(tmp_path)])
    assert "not a regular file" in err


# --------------------------------------------------------------------------- sass_lines.py


def _listing(tmp_path: Path) -> tuple[str, Path]:
    """A two-function nvdisasm --print-line-info listing whose lines point at a real source file."""
    source = tmp_path / "k.cu"
    source.write_text("".join(f"// line {i}\n" for i in range(1, 20)))
    text = f"""//--------------------- .text._Z3fooPf --------------------------
\t.section\t.text._Z3fooPf,"ax",@progbits
_Z3fooPf:
\t//## File "{source}", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_0:
\t//## File "{source}", line 12
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
\t//## File "{source}", line 13
        /*0030*/              @!P0 BRA `(.L_x_0) ;
        /*0040*/                   EXIT ;
//--------------------- .text._Z3barPf --------------------------
\t.section\t.text._Z3barPf,"ax",@progbits
_Z3barPf:
        /*0000*/                   EXIT ;
"""
    path = tmp_path / "k.sass"
    path.write_text(text)
    return str(path), source


def test_sass_lines_counts_a_range_by_line_and_opcode_with_repeats(tmp_path, capsys):
    listing, _ = _listing(tmp_path)
    argv = [listing, "--kernel", "foo", "--loops", "--from", "0x10", "--to", "0x40", "--repeat", "0x10:0x30:3"]
    assert _script("sass_lines").main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "_Z3fooPf: 7 instructions counted in [0x10, 0x40), [0x10, 0x30) x3 (5 in the kernel)"
    assert out[1].startswith("backward branches") and out[2].split() == ["0x30", "->", "0x10", "3"]
    assert out[3] == "by opcode: HMMA 6 (85.7%), BRA 1 (14.3%)"  # LDC and EXIT are outside the range
    assert out[5].split()[:3] == ["6", "85.7%", "k.cu:12"] and out[5].endswith("// line 12")
    assert out[6].split()[:3] == ["1", "14.3%", "k.cu:13"] and len(out) == 7


@pytest.mark.parametrize("argv, says", [
    (["--kernel", "baz"], "no function whose name holds 'baz'"),
    (["--kernel", "Pf"], "2 functions hold 'Pf' (_Z3fooPf, _Z3barPf); pass --kernel a longer piece"),
    (["--kernel", "foo", "--from", "0x50"], "no instruction of _Z3fooPf in [0x50, end); its code spans 0x0-0x40"),
    (["--kernel", "foo", "--from", "ten"], "--from is 'ten', not an address"),
    (["--kernel", "foo", "--from", "0x20", "--to", "0x10"], "--from 0x20 must be below --to 0x10"),
    (["--kernel", "foo", "--repeat", "0x10:0x30"], "--repeat is '0x10:0x30', not FROM:TO:TIMES"),
    (["--kernel", "foo", "--repeat", "0x10:0x30:0"], "--repeat's TIMES is '0', not an integer in [1, 1000000]"),
    (["--kernel", "foo", "--repeat", "0x30:0x10:2"], "--repeat '0x30:0x10:2': FROM must be below TO"),
    (["--kernel", "foo", "--top", "-1"], "--top must be an integer in [0, 100000], got -1"),
])
def test_sass_lines_refuses_bad_arguments_in_one_line(argv, says, tmp_path, capsys):
    listing, _ = _listing(tmp_path)
    err = _refused(capsys, "sass_lines", _script("sass_lines").main, [listing, *argv])
    assert says in err, err


def test_sass_lines_refuses_what_is_not_a_listing(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    err = _refused(capsys, "sass_lines", _script("sass_lines").main, [str(path), "--kernel", "foo"])
    assert "no function whose name holds 'foo'" in err and "nvdisasm --print-line-info" in err
    err = _refused(capsys, "sass_lines", _script("sass_lines").main, [str(tmp_path), "--kernel", "foo"])
    assert "not a regular file" in err

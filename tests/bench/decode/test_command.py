"""`hisparse-bench decode` end to end on the tiny preset: bad input gets one line and a non-zero
exit before anything compiles; a report names the RESOLVE implementation that ran, the spread
of every timing and the direction of every ratio."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import hisparse_jax as hs
from hisparse_jax.bench import cli
from hisparse_jax.bench.decode import plan, report
from hisparse_jax.bench.decode.capacity import account, capacity
from hisparse_jax.bench.decode.plan import build_plan
from hisparse_jax.bench.decode.runner import DecodeTiming, tokens_needed
from hisparse_jax.bench.decode.working_memory import program_memory
from hisparse_jax.models import get_family

CPU = jax.default_backend() == "cpu"
PLATFORM = hs.platform_of(jax.default_backend())
FAST = ["--steps", "2", "--reps", "3", "--max-batch", "3", "--device-budget-mib", "0.5", "--no-plots"]


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--contexts", "-5"], ["argument --contexts", "positive number of tokens", "-5"]),
        (["--contexts", "0"], ["argument --contexts", "got 0"]),
        (["--contexts", "64", "64"], ["argument --contexts", "64 given more than once"]),
        (["--steps", "0"], ["argument --steps", "positive integer"]),
        (["--reps", "0"], ["argument --reps", "positive integer"]),
        (["--reps", "x"], ["argument --reps", "'x'"]),
        (["--max-batch", "0"], ["argument --max-batch", "positive integer"]),
        (["--num-layers", "0"], ["argument --num-layers"]),
        (["--layers", "2"], ["unrecognized arguments: --layers 2"]),
        (["--device-budget-mib", "-1"], ["argument --device-budget-mib", "positive size"]),
        (["--device-budget-mib", "0"], ["argument --device-budget-mib"]),
        (["--device-budget-gib", "-2"], ["argument --device-budget-gib"]),
        (["--device-budget-mib", "nan"], ["argument --device-budget-mib"]),
        (["--host-budget-gib", "0"], ["argument --host-budget-gib"]),
        (["--device-budget-mib", "1", "--device-budget-gib", "1"], ["not allowed with"]),
        (["--preset", "huge"], ["unknown preset 'huge'", "presets: tiny, realistic"]),
        (["--family", "llama"], ["argument --family", "invalid choice"]),
        (["--top-k", "64"], ["Config.top_k", "k=64", "B=32", "raise hot_slots or lower top_k", "--top-k",
                             "--hot-slots"]),
        (["--set", "index_share=3"], ["Config.index_share", "--num-layers"]),
        (["--set", "nope=1"], ["--set 'nope=1': expected FIELD=VALUE"]),
        (["--set", "index_share=abc"], ["--set 'index_share=abc': index_share takes a int (the preset has 1)"]),
        (["--set", "top_k=abc"], ["--set 'top_k=abc': top_k takes a int (the preset has 16)"]),
        (["--set", "top_k=8", "--top-k", "4"], ["top_k is also given by --top-k"]),
        (["--set", "max_context=512"], ["max_context is set by --contexts"]),
        (["--set", "dtype=float16"], ["Config.dtype"]),
        # --set values out of any sane range: one line before anything is traced or compiled
        (["--set", "d_model=99999999999999"], ["Config.d_model", "up to 2^31 - 1"]),  # aborted XLA
        (["--set", "num_layers=2147483647"], ["Config.num_layers", "at most 1024"]),  # minutes of tracing
        (["--set", "index_heads=2147483647"], ["weight .indexers[0].w_q", "2^31 elements"]),  # aborted XLA
        (["--set", "experts=99999999999"], ["Config.experts", "[0, 2^31)"]),
        (["--set", "q_lora_rank=99999999999"], ["Config.q_lora_rank", "[0, 2^31)"]),
        (["--set", "rope_theta=nan"], ["Config.rope_theta", "finite number > 0"]),  # NaN logits
        (["--set", "norm_eps=-1"], ["Config.norm_eps", "finite number > 0"]),
        (["--set", "index_dtype=bogus"], ["Config.index_dtype", "'fp8'"]),  # was "takes a NoneType"
        (["--set", "pool_records=abc"], ["pool_records takes a int | None"]),
        (["--selection", "trace", "--trace-beta", "2"], ["TraceConfig.beta"]),
        (["--modes", "device", "--no-io"], ["--no-io", "add hisparse to --modes"]),
        (["--modes", "device", "--prefetch"], ["--prefetch", "add hisparse to --modes"]),
        (["--overlap-groups", "2"], ["--overlap-groups 2", "add --prefetch"]),
        (["--prefetch", "--overlap-groups", "0"], ["argument --overlap-groups", "int >= 1"]),
        (["--prefetch", "--overlap-groups", "2", "--family", "quest"], ["quest family has no overlap groups"]),
        (["--set", "overlap_groups=2"], ["Config.overlap_groups", "set prefetch=True"]),
        (["--contexts", "99999999999"], ["argument --contexts", "99999999999 exceeds", "int32"]),
        (["--profile-dir", "prof"], ["--profile-dir keeps the traces of --profile", "add --profile"]),
        (["--contexts", "9" * 400], ["argument --contexts", "exceeds 1073741824"]),  # an int, never cast to float
        # The synthetic trace's flags without a selection that uses the trace were ignored.
        (["--trace-beta", "0.5"], ["--trace-beta applies to --selection trace",
                                   "add --selection trace or drop --trace-beta"]),
        (["--trace", "deepseek-v3.2", "--trace-memoryless-layers", "1"],
         ["--trace, --trace-memoryless-layers apply to --selection trace", "drop them"]),
        # More memoryless layers than the model selects with: at planning, not after compiling.
        (["--selection", "trace", "--trace-memoryless-layers", "99999999999999999999"],
         ["--trace-memoryless-layers 99999999999999999999: the dsa model has 4 selecting layers", "give at most 4"]),
        (["--selection", "trace", "--trace-memoryless-layers", "5", "--explain"], ["has 4 selecting layers"]),
        (["--set", "index_share=1", "--set", "index_share=2"],
         ["--set 'index_share=2': index_share is also given by --set 'index_share=1'; give it once"]),
        # Budgets below one byte were "0 B".
        (["--device-budget-mib", "1e-12"], ["argument --device-budget-mib", "at least one byte, got 1e-12"]),
        (["--device-budget-gib", "1e-12", "--explain"], ["argument --device-budget-gib", "at least one byte"]),
        (["--host-budget-gib", "1e-12"], ["argument --host-budget-gib", "at least one byte"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_work(capsys, tmp_path, argv, needles, one_line_error):
    err = one_line_error(["decode", *argv, "--out", str(tmp_path / "out")])
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not CPU, reason="XLA:CPU cannot run bf16 dots; GPUs can")
@pytest.mark.parametrize("argv", [["--preset", "realistic"], ["--set", "dtype=bfloat16"]])
def test_bfloat16_is_refused_on_cpu_with_the_fix(capsys, argv, one_line_error):
    err = one_line_error(["decode", *argv])
    assert "bfloat16" in err and "XLA:CPU" in err and "--set dtype=float32" in err and "GPU" in err


def test_the_module_entry_point_exits_2_without_a_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hisparse_jax.bench", "decode", "--contexts", "-5"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "hisparse-bench: error: argument --contexts: expected a positive number of tokens, got -5"]


def _batch1_bytes(context: int, mode: str, steps: int, reps: int) -> tuple[int, int]:
    """(device, host) bytes of one request's state at `context`, as the bench sizes it."""
    config = get_family("dsa").Config.tiny(max_context=tokens_needed(context, steps, reps) + 1)
    acc = account(get_family("dsa"), config, 1, mode)
    return acc.total("device"), acc.total("host")


@pytest.mark.parametrize("contexts", [["100000"], ["64", "100000"]])
def test_a_context_that_does_not_fit_is_an_error_naming_its_bytes(capsys, contexts, one_line_error):
    err = one_line_error(["decode", "--contexts", *contexts, "--steps", "2", "--reps", "3"], status=1)
    for mode, name in (("device", "full-KV"), ("hisparse", "hisparse")):
        device, _ = _batch1_bytes(100000, mode, 2, 3)
        assert f"{name} @ 100000: {report.fmt_bytes(device)}" in err, err
    assert "@ 64" not in err  # 64 fits: only what does not fit is named
    assert f"device budget of {plan.CPU_DEFAULTS['device_budget_mib']:.2f} MiB" in err


def test_nothing_fits_names_the_budget_that_fits(capsys, one_line_error):
    argv = ["decode", "--contexts", "64", "--steps", "2", "--reps", "3", "--device-budget-mib", "0.01",
            "--host-budget-gib", "0.00001"]
    err = one_line_error(argv, status=1)
    device, host = _batch1_bytes(64, "device", 2, 3)
    assert f"full-KV @ 64: {report.fmt_bytes(device)}" in err
    assert "host budget of 10.49 KiB" in err
    assert f"hisparse @ 64: {report.fmt_bytes(_batch1_bytes(64, 'hisparse', 2, 3)[1])}" in err
    device_fix = float(re.search(r"--device-budget-mib ([0-9.e-]+)", err).group(1))
    host_fix = float(re.search(r"--host-budget-gib ([0-9.e-]+)", err).group(1))
    # The named budget holds the state and the compiled decode's working memory at batch 1.
    dsa = get_family("dsa")
    config = dsa.Config.tiny(max_context=tokens_needed(64, 2, 3) + 1)
    working = program_memory(dsa, config, "device", 1, 2, trace=False).total
    assert device + working <= device_fix * 2**20 < (device + working) * 1.01
    # The named budgets do fit: planning with them succeeds, every run at batch >= 1.
    args = cli.parser().parse_args(argv[:-4] + ["--device-budget-mib", str(device_fix), "--host-budget-gib",
                                                 str(host_fix)])
    plan = build_plan(args)
    assert all(r.batch >= 1 for c in plan.contexts for r in c.runs)


def test_refuses_to_time_the_reference_without_the_extension(capsys, monkeypatch, one_line_error):
    monkeypatch.setattr(plan, "extension_error", lambda: ImportError("no module named _hisparse_ffi"))
    err = one_line_error(["decode", "--contexts", "64"])
    assert "without its compiled extension" in err and "pure-JAX reference" in err
    assert "pip install --no-build-isolation ." in err and "--allow-reference" in err


_IMPLEMENTATION_FIELD = "implementation" in {f.name for f in dataclasses.fields(get_family("dsa").Config)}


@pytest.mark.skipif(not _IMPLEMENTATION_FIELD, reason="the model Config has no implementation field")
def test_a_requested_reference_needs_allow_reference(capsys, tmp_path, one_line_error):
    err = one_line_error(["decode", "--contexts", "64", "--set", "implementation=reference"])
    assert "--allow-reference" in err
    rc = cli.main(["decode", "--contexts", "64", "--set", "implementation=reference", "--allow-reference",
                   "--out", str(tmp_path), *FAST])
    assert rc == 0
    assert json.loads((tmp_path / "decode.json").read_text())["resolve_implementation"] == "reference"
    assert "RESOLVE: reference" in capsys.readouterr().out


def test_the_schedule_is_in_turns_unless_asked_or_too_big():
    args = cli.parser().parse_args(["decode", "--contexts", "64", *FAST])
    plan = build_plan(args)
    assert plan.in_turns and "in turns" in plan.timing_note
    assert [(r.kind, r.mode) for r in plan.contexts[0].runs] == [
        ("capacity", "device"), ("capacity", "hisparse"), ("equal batch", "hisparse")]
    plan = build_plan(cli.parser().parse_args(["decode", "--contexts", "64", "--one-at-a-time", *FAST]))
    assert not plan.in_turns and "--one-at-a-time" in plan.timing_note


def _timing(mode, batch, ms, tokens=None):
    return DecodeTiming(mode=mode, batch=batch, context=64, steps=4, step_seconds_all=tuple(t / 1e3 for t in ms),
                        misses_per_step=0.0, selected_per_step=1.0, fetch=True,
                        tokens=np.zeros((4, batch), np.int32) if tokens is None else tokens)


def test_ratios_are_per_round_with_their_direction_in_the_name():
    family = get_family("dsa")
    config = family.Config.tiny()
    caps = {m: capacity(family, config, m, device_budget=2**20) for m in ("device", "hisparse")}
    device = _timing("device", 2, [1.0, 2.0, 1.0])
    hisparse = _timing("hisparse", 6, [2.0, 2.0, 4.0])
    equal = _timing("hisparse", 2, [1.5, 1.0, 1.0])
    q = report.ratios(64, hisparse, device, equal, caps)
    per_round = 3 * np.array([1 / 2, 2 / 2, 1 / 4])  # batch ratio 3 x device time / hisparse time
    assert q["throughput_hisparse_over_full_kv"] == pytest.approx(np.median(per_round))
    assert q["throughput_hisparse_over_full_kv_range"] == pytest.approx([0.75, 3.0])
    assert q["batch_hisparse_over_full_kv"] == 3.0
    assert q["tpot_hisparse_over_full_kv_at_equal_batch"] == pytest.approx(1.0)
    assert q["tpot_hisparse_over_full_kv_at_equal_batch_range"] == pytest.approx([0.5, 1.5])
    kv = lambda m: caps[m].device_per_request_by_category["kv records"]
    assert q["kv_hbm_per_request_full_kv_over_hisparse"] == kv("device") / kv("hisparse")
    assert q["tokens_equal_at_equal_batch"] is True
    prefetch_keys = {"tpot_prefetch_over_hisparse", "throughput_prefetch_over_full_kv", "tokens_equal_with_prefetch"}
    profile_keys = {"roofline_throughput_hisparse_over_full_kv"}  # the command adds it from --profile's runs
    assert set(q) - {"context"} == {k for k in report.RATIO_COLUMNS} - prefetch_keys - profile_keys | {
        "throughput_hisparse_over_full_kv_range", "tpot_hisparse_over_full_kv_at_equal_batch_range"}
    # With a prefetch run (the capacity batch, its own timed calls): its TPOT over HiSparse's per
    # round, its throughput over full-KV's, and whether its tokens are HiSparse's.
    prefetch = _timing("hisparse", 6, [1.0, 2.0, 2.0])
    p = report.ratios(64, hisparse, device, equal, caps, prefetch)
    assert p["tpot_prefetch_over_hisparse"] == pytest.approx(np.median([0.5, 1.0, 0.5]))
    assert p["tpot_prefetch_over_hisparse_range"] == pytest.approx([0.5, 1.0])
    assert p["throughput_prefetch_over_full_kv"] == pytest.approx(np.median(3 * np.array([1.0, 1.0, 0.5])))
    assert p["tokens_equal_with_prefetch"] is True
    assert set(p) - set(q) == prefetch_keys | {"tpot_prefetch_over_hisparse_range",
                                                "throughput_prefetch_over_full_kv_range"}
    unequal = report.ratios(64, hisparse, device, _timing("hisparse", 2, [1, 1, 1], np.ones((4, 2), np.int32)), caps)
    assert unequal["tokens_equal_at_equal_batch"] is False
    without_equal = report.ratios(64, hisparse, device, None, caps)
    assert "tpot_hisparse_over_full_kv_at_equal_batch" not in without_equal
    table = report.format_table(dict(rows=[], ratios=[q, without_equal]))
    absent = {report.RATIO_COLUMNS[k] for k in prefetch_keys | profile_keys}
    for heading in report.RATIO_COLUMNS.values():
        assert (heading in table) == (heading not in absent), heading  # no prefetch run, no profile: no column
    assert "1.00 [0.50, 1.50]" in table and "| - |" in table
    with_prefetch = report.format_table(
        dict(rows=[], ratios=[dict(p, roofline_throughput_hisparse_over_full_kv=2.5), q]))
    assert all(heading in with_prefetch for heading in report.RATIO_COLUMNS.values())
    assert "| 2.50 |" in with_prefetch  # next to the measured ratio, no range: one profiled call a mode


def test_the_roofline_ratio_is_each_modes_batch_over_its_roofline_step():
    """HiSparse / full-KV with both modes at their rooflines, from the profiled capacity runs of one
    context and trace; None without both (no --profile, another trace, a prefetch run only)."""
    def prof(mode, batch, roofline, run="capacity", trace="glm-5.1", context=64):
        return dict(mode=mode, batch=batch, roofline_seconds=roofline, run=run, trace=trace, context=context)

    profiles = [prof("device", 2, 2e-3), prof("hisparse", 17, 6e-3), prof("hisparse", 17, 5e-3, run="prefetch"),
                prof("device", 9, 4e-3, context=32), prof("hisparse", 41, 8e-3, trace="deepseek-v3.2")]
    assert report.roofline_ratio(profiles, 64, "glm-5.1") == pytest.approx((17 / 6e-3) / (2 / 2e-3))
    assert report.roofline_ratio(profiles, 64, "deepseek-v3.2") is None  # no full-KV run of that trace
    assert report.roofline_ratio(profiles, 32, "glm-5.1") is None
    assert report.roofline_ratio([], 64, None) is None
    assert report.roofline_ratio([prof("device", 2, 0.0), prof("hisparse", 17, 6e-3)], 64, "glm-5.1") is None


def test_a_report_names_the_implementation_and_the_spread_of_every_timing(tmp_path, capsys):
    out = tmp_path / "decode"
    assert cli.main(["decode", "--contexts", "64", "--out", str(out), *FAST]) == 0
    stdout = capsys.readouterr().out
    data = json.loads((out / "decode.json").read_text())
    implementation = f"ffi on {PLATFORM}"
    assert data["resolve_implementation"] == implementation
    assert stdout.splitlines()[0].startswith(f"dsa tiny on {data['device']} ")
    assert f"RESOLVE: {implementation};" in stdout.splitlines()[0]
    assert data["num_layers"] == get_family("dsa").Config.tiny().num_layers
    assert "in turns" in data["timing"] and "in turns" in stdout
    runs = {(r["run"], r["mode"]): r for r in data["rows"]}
    assert set(runs) == {("capacity", "device"), ("capacity", "hisparse"), ("equal batch", "hisparse")}
    for r in data["rows"]:
        times = r["step_ms_all"]
        assert len(times) == 3 and all(t > 0 for t in times)
        assert (r["tpot_ms_min"], r["tpot_ms_median"], r["tpot_ms_max"]) == (min(times), np.median(times),
                                                                              max(times))
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / r["tpot_ms_median"] * 1e3)
        assert r["tokens_per_s_range"] == pytest.approx([r["batch"] / max(times) * 1e3,
                                                         r["batch"] / min(times) * 1e3])
        assert f"{r['tpot_ms_min']:.2f} / {r['tpot_ms_median']:.2f} / {r['tpot_ms_max']:.2f}" in stdout
        assert 1 <= r["batch"] <= 3 and 0 <= r["miss_rate"] <= 1
        assert r["max_context"] == tokens_needed(64, 2, 3) + 1
    (q,) = data["ratios"]
    d, h, e = runs[("capacity", "device")], runs[("capacity", "hisparse")], runs[("equal batch", "hisparse")]
    per_round = h["batch"] / np.array(h["step_ms_all"]) / (d["batch"] / np.array(d["step_ms_all"]))
    assert q["throughput_hisparse_over_full_kv"] == pytest.approx(np.median(per_round))
    assert q["throughput_hisparse_over_full_kv_range"] == pytest.approx([per_round.min(), per_round.max()])
    tpot = np.array(e["step_ms_all"]) / np.array(d["step_ms_all"])
    assert q["tpot_hisparse_over_full_kv_at_equal_batch"] == pytest.approx(np.median(tpot))
    assert q["tokens_equal_at_equal_batch"] is True
    assert q["kv_hbm_per_request_full_kv_over_hisparse"] > 1
    for key, heading in report.RATIO_COLUMNS.items():
        # the prefetch columns need --prefetch, the roofline's --profile
        assert (heading in stdout) == ("prefetch" not in key and "roofline" not in key), heading
    assert data["ratio_range"] in stdout
    # The bandwidths a GPU run met, profiled or not (a CPU's are measured only for --profile).
    if CPU:
        assert data["bandwidths"] == [] and "measured before each context's runs" not in stdout
    else:
        _assert_bandwidths(data, stdout, [64])


def _assert_bandwidths(data: dict, stdout: str, contexts: list[int]) -> None:
    """decode.json's bandwidths: one entry a context, positive, and the header line printing them."""
    assert [b["context"] for b in data["bandwidths"]] == contexts
    for b in data["bandwidths"]:
        assert b["hbm_bytes_per_second"] > 0 and b["host_link_bytes_per_second"] > 0
        assert (f"{b['context']}: HBM {b['hbm_bytes_per_second'] / 1e9:.0f} GB/s, host link "
                f"{b['host_link_bytes_per_second'] / 1e9:.1f} GB/s") in stdout


@pytest.mark.parametrize("share, groups", [(2, 1), (1, 2)])
def test_prefetch_run_at_the_capacity_batch(tmp_path, capsys, share, groups):
    """--prefetch adds HiSparse with Config.prefetch at its capacity batch, from the same state and
    trace: the same tokens (on CPU the copy is synchronous; the GPU timings are in BENCHMARKS.md).
    With --overlap-groups G both HiSparse runs take a multiple of G streams."""
    out = tmp_path / "decode"
    rc = cli.main(["decode", "--contexts", "64", "--fill", "synthetic", "--selection", "trace", "--prefetch",
                   "--set", f"index_share={share}", "--overlap-groups", str(groups), "--no-equal-batch", "--profile",
                   "--out", str(out), *FAST])
    assert rc == 0
    data = json.loads((out / "decode.json").read_text())
    rows = {(r["run"], r["mode"]): r for r in data["rows"]}
    assert set(rows) == {("capacity", "device"), ("capacity", "hisparse"), ("prefetch", "hisparse")}
    assert rows[("prefetch", "hisparse")]["batch"] == rows[("capacity", "hisparse")]["batch"]
    assert rows[("prefetch", "hisparse")]["batch"] % groups == 0
    assert rows[("prefetch", "hisparse")]["miss_rate"] == rows[("capacity", "hisparse")]["miss_rate"] > 0
    (ratio,) = data["ratios"]
    assert ratio["tokens_equal_with_prefetch"] is True
    assert ratio["tpot_prefetch_over_hisparse"] > 0
    # --profile: the measured throughput ratio next to the one both modes would reach at their rooflines
    at_roofline = report.roofline_ratio(data["profiles"], 64, ratio["trace"])
    assert at_roofline > 0 and ratio["roofline_throughput_hisparse_over_full_kv"] == pytest.approx(at_roofline)
    assert sorted(p["run"] for p in data["profiles"]) == ["capacity", "capacity", "prefetch"]
    captured = capsys.readouterr()
    assert "throughput at both rooflines" in captured.out
    _assert_bandwidths(data, captured.out, [64])  # --profile measures them on a CPU too
    if CPU:  # the profile's plumbing runs, and the command says what a CPU cannot measure
        assert "kernel categories stay at zero" in captured.err


def test_synthetic_fill_trace_selection_and_no_io_run(tmp_path):
    out = tmp_path / "decode"
    rc = cli.main(["decode", "--contexts", "64", "--fill", "synthetic", "--selection", "trace", "--no-io",
                   "--set", "index_share=2", "--one-at-a-time", "--out", str(out), *FAST])
    assert rc == 0
    data = json.loads((out / "decode.json").read_text())
    assert data["fill"] == "synthetic" and data["selection"] == "trace"
    assert data["overrides"] == {"index_share": 2}
    assert "--one-at-a-time" in data["timing"] and "one after the other" in data["ratio_range"]
    assert any("trace selection" in note for note in data["notes"])
    rows = {(r["run"], r["mode"]): r for r in data["rows"]}
    assert set(rows) == {("capacity", "device"), ("capacity", "hisparse"), ("no-IO", "hisparse"),
                         ("equal batch", "hisparse")}
    quiet, loud = rows[("no-IO", "hisparse")], rows[("capacity", "hisparse")]
    assert quiet["miss_rate"] > 0 and quiet["tpot_ms_median"] > 0  # RESOLVE still ran and missed
    assert quiet["io_bytes_per_token"] == 0 and loud["io_bytes_per_token"] > 0
    assert quiet["batch"] == loud["batch"]
    assert quiet["max_context"] == tokens_needed(64, 2, 3, no_io=True) + 1
    (ratio,) = data["ratios"]
    assert ratio["tokens_equal_at_equal_batch"] is True


@pytest.mark.parametrize("where, needle", [
    ("{file}/x", "is not a folder, so nothing can be written under it"),
    ("{file}", "exists and is not a folder"),
])
@pytest.mark.parametrize("command", [
    ["decode", "--contexts", "64"],
    ["policies", "--synthetic", "glm-5.1", "--records", "64", "--k", "8", "--steps", "4"],
])
def test_an_unusable_out_is_refused_before_any_work(tmp_path, command, where, needle, one_line_error, monkeypatch):
    """`--out /dev/null/x` used to fail after the whole run, losing it; now before anything runs."""
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    out = where.format(file=tmp_path / "notes.txt")
    from hisparse_jax.bench.decode import command as decode_command
    monkeypatch.setattr(decode_command, "build_plan", lambda args: pytest.fail("planned despite a bad --out"))
    err = one_line_error([*command, "--out", out])
    assert f"--out {out!r}" in err and needle in err, err


@pytest.mark.parametrize("command, flag, fix", [
    (["decode", "--contexts", "64", "--out"], "--out", "give a folder"),
    (["policies", "--synthetic", "glm-5.1", "--records", "64", "--k", "8", "--steps", "4", "--out"], "--out",
     "give a folder"),
    (["indexers", "--indexer", "dsa", "--out"], "--out", "give a folder"),
    (["bitwise", "--preset", "tiny", "--context", "200", "--steps", "1", "--reps", "1", "--json"], "--json",
     "give a file name"),
])
def test_an_empty_output_path_is_refused(command, flag, fix, one_line_error, monkeypatch):
    """`--out ""` wrote into the current folder (Path("") is "."), and `--json ""` skipped the file."""
    from hisparse_jax.bench.decode import bitwise, command as decode_command
    monkeypatch.setattr(decode_command, "build_plan", lambda args: pytest.fail("planned despite an empty path"))
    monkeypatch.setattr(bitwise, "compare", lambda args: pytest.fail("compared despite an empty path"))
    err = one_line_error([*command, ""])
    assert err == f"hisparse-bench: error: {flag}: an empty path; {fix}\n", err


def test_a_report_that_cannot_be_written_keeps_the_printed_tables(tmp_path, capsys, monkeypatch):
    """The tables print first; a write that fails afterwards is one line, exit 1."""
    from hisparse_jax.bench.decode import command

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(command.Path, "write_text", refuse)
    assert cli.main(["decode", "--contexts", "64", *FAST, "--out", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "| context |" in out and "wrote" not in out
    assert err.count("\n") == 1 and "the report could not be written" in err and "tables above" in err


@pytest.mark.skipif(not CPU, reason="on a GPU --explain compiles the slice to size its working memory")
def test_explain_prints_a_gpu_slice_on_a_cpu_without_compiling(capsys, monkeypatch):
    from hisparse_jax.bench.decode import plan as plan_module
    monkeypatch.setattr(plan_module, "_with_working_memory", lambda *a, **k: pytest.fail("compiled on --explain"))
    assert cli.main(["decode", "--deployment", "glm5-h200", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "nothing compiled" in out and "context 131072: hisparse batch" in out

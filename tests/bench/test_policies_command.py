"""`hisparse-bench policies` end to end on tiny traces: the JSON says what was replayed and holds
every policy's miss rates, the table and the plots are written, and a bad argument is one line
on stderr with exit 2 before any work."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import bad_npz
import pytest

from hisparse_jax.selection import policies as cache_policies
from hisparse_jax.bench import cli
from hisparse_jax.selection.recorded import RecordedTrace, save_trace

# The plots need matplotlib (the `test` extra installs it); without it a plot check skips, after
# the JSON and the table were checked, instead of failing an install that only lacks the plots.
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _check_plots(out, names):
    if not HAVE_MATPLOTLIB:
        pytest.skip("matplotlib is not installed: the plots are not drawn (pip install 'hisparse-jax[plots]')")
    assert {p.name for p in out.glob("*.png")} == set(names)
    assert all((out / name).stat().st_size > 0 for name in names)


TINY = ["--records", "48", "--k", "8", "--steps", "12", "--layers", "2", "--streams", "2"]


def _recorded(path, steps=10, layers=3, streams=2, k=5, seed=0) -> RecordedTrace:
    """A small trace with locality (each row keeps some of the previous step's ids), saved at `path`."""
    rng = np.random.default_rng(seed)
    ids = np.full((steps, layers, streams, k), -1, np.int32)
    sealed = np.tile(np.arange(steps, dtype=np.int32)[:, None] + 12, (1, streams))
    for t in range(steps):
        for l in range(layers):
            for s in range(streams):
                n = k if t else 3  # a short first row: padding
                ids[t, l, s, :n] = np.sort(rng.choice(min(sealed[t, s], 8 + t), size=n, replace=False))
    trace = RecordedTrace(ids=ids, sealed=sealed, source=dict(model="hand-made", note="test"))
    save_trace(path, trace)
    return trace


def test_synthetic_trace_end_to_end(tmp_path, capsys):
    out = tmp_path / "policies"
    assert cli.main(["policies", "--synthetic", "glm-5.1", *TINY, "--ratios", "1", "2", "--warm", "2",
                     "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    report = json.loads((out / "policies.json").read_text())
    assert report["policies"] == list(cache_policies.POLICIES) and report["ratios"] == [1, 2]
    (entry,) = report["traces"]
    assert entry["trace"]["kind"] == "synthetic" and entry["trace"]["calibration"] == "glm-5.1"
    assert entry["trace"]["records"] == 48 and entry["trace"]["num_records"] == 48 + 11
    assert entry["trace"]["config"]["beta"] == 0.75 and entry["trace"]["seed"] == 0
    assert (entry["k"], entry["capacities"], entry["warm"]) == (8, [8, 16], 2)
    assert (entry["steps"], entry["layers"], entry["streams"]) == (12, 2, 2)
    assert entry["selected"] == 10 * 2 * 2 * 8
    for policy in cache_policies.POLICIES:
        assert len(entry["miss_rate"][policy]) == 2 and len(entry["layer_miss_rate"][policy][0]) == 2
        assert 0 < entry["miss_rate"][policy][1] < 1 and 0 < entry["miss_rate"][policy][0] < 1
        assert entry["miss_rate"][policy][0] == pytest.approx(entry["miss_rate"]["lru"][0])  # B = k: all alike
    assert all(entry["miss_rate"]["belady"][1] <= entry["miss_rate"][p][1] for p in cache_policies.POLICIES)
    assert len(entry["step_overlap"]) == 2 and len(entry["layer_overlap"]) == 1
    assert 0 < entry["step_overlap"][0] < 1
    assert "| policy | B/k = 1 (B = 8) | B/k = 2 (B = 16) |" in stdout
    assert all(f"| {p} | " in stdout for p in cache_policies.POLICIES)
    assert "step overlap" in stdout and "adjacent-layer overlap" in stdout
    _check_plots(out, ["miss_rate.png", "layer_misses.png"])


def test_recorded_trace_end_to_end(tmp_path, capsys):
    path = tmp_path / "trace.npz"
    trace = _recorded(path)
    out = tmp_path / "policies"
    assert cli.main(["policies", "--trace-file", str(path), "--policies", "lru", "belady", "--ratios", "1.5",
                     "--warm", "0", "--out", str(out), "--no-plots"]) == 0
    stdout = capsys.readouterr().out
    (entry,) = json.loads((out / "policies.json").read_text())["traces"]
    assert entry["trace"] == dict(kind="recorded", file=str(path), source=dict(model="hand-made", note="test"),
                                  page_size=1, steps=10, layers=3, streams=2, k=5, num_records=trace.num_records)
    assert entry["capacities"] == [8] and entry["policies"] == ["lru", "belady"]
    for policy in ("lru", "belady"):  # the library's own replay of the same ids
        per_layer = [cache_policies.simulate(trace.ids[:, l], 8, policy).sum() for l in range(3)]
        assert entry["misses"][policy] == [sum(per_layer)]
        assert entry["layer_miss_rate"][policy][0] == pytest.approx(
            [m / (trace.ids[:, l] >= 0).sum() for l, m in enumerate(per_layer)])
    np.testing.assert_allclose(entry["step_overlap"], cache_policies.step_overlap(trace.ids), atol=1e-6)
    assert f"recorded trace {path}" in stdout and "| lru | " in stdout
    assert not list(out.glob("*.png"))


def test_several_calibrations_and_the_default_warm_up(tmp_path, capsys):
    out = tmp_path / "policies"
    assert cli.main(["policies", "--synthetic", "glm-5.1", "deepseek-v3.2", *TINY, "--policies", "fifo",
                     "--ratios", "1.5", "--out", str(out)]) == 0
    report = json.loads((out / "policies.json").read_text())
    assert [e["label"] for e in report["traces"]] == ["glm-5.1", "deepseek-v3.2"]
    assert [e["warm"] for e in report["traces"]] == [3, 3]  # a quarter of 12 steps
    assert [e["capacities"] for e in report["traces"]] == [[12], [12]]
    _check_plots(out, ["miss_rate-glm-5.1.png", "layer_misses-glm-5.1.png",
                       "miss_rate-deepseek-v3.2.png", "layer_misses-deepseek-v3.2.png"])


def test_without_matplotlib_the_json_is_still_written(tmp_path, capsys, monkeypatch):
    path = tmp_path / "trace.npz"
    _recorded(path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "policies"
    assert cli.main(["policies", "--trace-file", str(path), "--policies", "lru", "--ratios", "1",
                     "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "matplotlib" in line] == [
        "matplotlib is not installed: plots skipped, policies.json written (pip install 'hisparse-jax[plots]')"]
    assert (out / "policies.json").exists() and not list(out.glob("*.png"))


@pytest.mark.parametrize(
    "argv, needles",
    [
        ([], ["one of the arguments --trace-file --synthetic is required"]),
        (["--synthetic", "glm-5.1", "--trace-file", "x.npz"], ["argument --trace-file", "not allowed with"]),
        (["--synthetic", "llama"], ["argument --synthetic", "invalid choice: 'llama'"]),
        (["--synthetic", "glm-5.1", "glm-5.1"], ["argument --synthetic: glm-5.1 given more than once"]),
        (["--synthetic", "glm-5.1", "--ratios", "0.5"], ["argument --ratios", "B/k ratio >= 1", "0.5"]),
        (["--synthetic", "glm-5.1", "--ratios", "two"], ["argument --ratios", "'two'"]),
        (["--synthetic", "glm-5.1", "--ratios", "2", "2.0"], ["argument --ratios: 2 given more than once"]),
        (["--synthetic", "glm-5.1", "--policies", "mru"], ["argument --policies", "invalid choice: 'mru'"]),
        (["--synthetic", "glm-5.1", "--policies", "lru", "lru"], ["argument --policies: lru given more than once"]),
        (["--synthetic", "glm-5.1", *TINY, "--warm", "12"],
         ["argument --warm: 12 is not below the trace's 12 steps", "give --warm below 12"]),
        (["--synthetic", "glm-5.1", "--warm", "-1"], ["argument --warm", "steps >= 0"]),
        (["--synthetic", "glm-5.1", "--steps", "0"], ["argument --steps", "positive integer"]),
        (["--synthetic", "glm-5.1", "--records", "64", "--k", "100"],
         ["argument --k: k = 100 exceeds the 64 records", "lower --k or raise --records"]),
        (["--trace-file", "TRACE", "--records", "64"], ["argument --records: applies to --synthetic only"]),
        (["--trace-file", "missing.npz"], ["argument --trace-file", "no such file"]),
        (["--trace-file", "NOT_A_TRACE"], ["argument --trace-file", "not a .npz archive"]),
        (["--trace-file", "TRUNCATED"], ["argument --trace-file", "not a .npz archive"]),
        (["--trace-file", "EMPTY"], ["argument --trace-file", "not a .npz archive"]),
        (["--trace-file", "DIRECTORY"], ["argument --trace-file", "is a directory, not a file"]),
        (["--trace-file", "TRACE", "--warm", "10"], ["argument --warm: 10 is not below the trace's 10 steps"]),
        # Every number range-checked as an int before any cast (these were tracebacks, an XLA abort
        # and a hang), and B at most the records the trace seals.
        (["--synthetic", "glm-5.1", "--records", "99999999999999999999"],
         ["argument --records: 99999999999999999999 exceeds 2147483647 (record ids are int32)"]),
        (["--synthetic", "glm-5.1", "--records", "99999999999", "--k", "99999999999"],
         ["argument --records: 99999999999 exceeds 2147483647"]),
        (["--synthetic", "glm-5.1", "--records", "2147483647", "--k", "8", "--steps", "2"],
         ["argument --steps: --records 2147483647 + --steps 2 - 1 = 2147483648 records", "lower --records or --steps"]),
        (["--synthetic", "glm-5.1", "--layers", "99999999999"], ["argument --layers: 99999999999 exceeds 1024"]),
        (["--synthetic", "glm-5.1", "--steps", "99999999999"], ["argument --steps: 99999999999 exceeds 2147483647"]),
        (["--synthetic", "glm-5.1", "--streams", "99999999999"], ["argument --streams: 99999999999 exceeds 2147483647"]),
        (["--synthetic", "glm-5.1", "--k", "9" * 400], ["argument --k", "exceeds 2147483647"]),  # no float cast
        (["--synthetic", "glm-5.1", "--seed", "99999999999999999999999"],
         ["argument --seed: 99999999999999999999999 exceeds 9223372036854775807 (seeds are int64)"]),
        (["--synthetic", "glm-5.1", "--ratios", "1e300"], ["argument --ratios: B/k = 1e300 exceeds 16384"]),
        (["--synthetic", "glm-5.1", *TINY, "--ratios", "8"],
         ["argument --ratios: B/k = 8 gives B = 64 slots per stream, more than the 59 records the trace seals",
          "give ratios up to 7.375"]),
        (["--trace-file", "TRACE", "--ratios", "100"], ["argument --ratios: B/k = 100 gives B = 500", "(--trace-file)"]),
        # A trace too big for memory: its size and the flags that size its largest part.
        (["--synthetic", "glm-5.1", "--records", "2000000000", "--streams", "1000000", "--layers", "1", "--k", "8",
          "--steps", "1"],
         ["the synthetic trace would need about", "the generator's state", "lower --records, --streams or --layers"]),
        (["--synthetic", "glm-5.1", "--records", "64", "--k", "64", "--steps", "2000000000", "--streams", "1000",
          "--layers", "1"],
         ["the synthetic trace would need about", "the ids [steps, layers, streams, k]",
          "lower --steps, --layers, --streams or --k"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_work(capsys, tmp_path, argv, needles, one_line_error):
    trace, other = tmp_path / "trace.npz", tmp_path / "notes.txt"
    _recorded(trace)
    other.write_text("not a trace\n")
    (tmp_path / "truncated.npz").write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "folder.npz").mkdir()
    argv = [{"TRACE": str(trace), "NOT_A_TRACE": str(other), "missing.npz": str(tmp_path / "missing.npz"),
             "TRUNCATED": str(tmp_path / "truncated.npz"), "EMPTY": str(tmp_path / "empty.npz"),
             "DIRECTORY": str(tmp_path / "folder.npz")}.get(a, a) for a in argv]
    err = one_line_error(["policies", *argv, "--out", str(tmp_path / "out")])
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", sorted(bad_npz.KINDS))
def test_every_kind_of_bad_trace_file_is_one_line_and_exit_2(tmp_path, kind, one_line_error):
    trace = tmp_path / "trace.npz"
    _recorded(trace)
    path = bad_npz.make(kind, trace, tmp_path, "counts")
    err = one_line_error(["policies", "--trace-file", str(path), "--out", str(tmp_path / "out")])
    assert "argument --trace-file" in err and bad_npz.KINDS[kind] in err, err
    assert not (tmp_path / "out").exists()

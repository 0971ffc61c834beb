"""The step profile's table (hisparse_jax.bench.profile). (profile_decode itself needs a GPU trace.)"""

from __future__ import annotations

from hisparse_jax.bench import kernel_categories, profile


def test_format_profile_names_every_category():
    p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 1e-3), 9e-3, 3e-3, {"weights": 2**20},
                            {"hbm": 4e12, "host link": 5e10}, [])
    table = profile.format_profile([dict(mode="hisparse", context=64, batch=2, **p.as_dict())])
    assert all(c in table for c in kernel_categories.CATEGORIES) and "| 3.00 |" in table


def test_the_profile_table_names_the_baseline_as_the_decode_table_does():
    from hisparse_jax.bench.decode.report import MODE_NAMES

    p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 1e-3), 9e-3, 3e-3, {"weights": 2**20},
                            {"hbm": 4e12, "host link": 5e10}, [])
    table = profile.format_profile([dict(mode="device", context=64, batch=2, **p.as_dict())], MODE_NAMES)
    assert "| full-KV | 64 |" in table and "- full-KV @ 64:" in table and "| device |" not in table


def test_launch_gaps_set_the_kernels_against_the_timed_step():
    p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 1e-3), 9e-3, 3e-3, {"weights": 2**20},
                            {"hbm": 4e12, "host link": 5e10}, [], kernels_per_step=412.0, idle_seconds=4e-4)
    row = dict(mode="hisparse", context=64, batch=2, **p.as_dict())
    n = len(kernel_categories.CATEGORIES)  # kernels sum to n ms per step
    assert profile.launch_gaps(row) == "412 kernels per step, device idle 0.400 ms per step in the profiled call"
    row["tpot_seconds"] = (n + 0.25) * 1e-3
    assert profile.launch_gaps(row).endswith(f"minus the kernels' busy time: 0.250 ms ({0.25 / (n + 0.25):.1%})")
    assert "412 kernels per step" in profile.format_profile([row])


def test_a_copy_beside_other_kernels_counts_once_in_the_launch_gap():
    """A prefetch run's copy runs on its own stream beside compute: the gap is the step minus the
    time some kernel ran (busy_seconds), never the kernels' sum, which counts the overlap twice."""
    seconds = dict.fromkeys(kernel_categories.CATEGORIES, 0.0)
    seconds.update({"weights/FFN": 8e-3, "IO": 1e-3})
    overlap = dict(io_seconds=1e-3, hidden_seconds=8e-4, hidden_fraction=0.8)
    p = profile.StepProfile(seconds, 9.5e-3, 3e-3, {"weights": 2**20}, {"hbm": 4e12, "host link": 5e10}, [],
                            io_overlap=overlap, kernels_per_step=400.0, busy_seconds=8.2e-3)
    row = dict(mode="hisparse", context=64, batch=2, run="prefetch", tpot_seconds=8.4e-3, **p.as_dict())
    assert profile.kernels_busy(row) == 8.2e-3
    assert profile.launch_gaps(row).endswith("minus the kernels' busy time: 0.200 ms (2.4%)")
    assert abs(profile.kernel_budget(row)["gap_per_kernel"] - 0.5e-6) < 1e-15
    # A report written before busy_seconds: the sum less the copy's hidden part.
    row["busy_seconds"] = 0.0
    assert abs(profile.kernels_busy(row) - 8.2e-3) < 1e-15
    del row["busy_seconds"], row["io_overlap"]
    assert profile.kernels_busy(row) == sum(seconds.values())


def test_launch_gaps_script_joins_old_reports_to_their_timing_rows(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "launch_gaps.py"
    spec = importlib.util.spec_from_file_location("launch_gaps", script)
    gaps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gaps)
    profile_row = dict(mode="hisparse", context=64, trace="t", batch=3, step_seconds=5e-3,
                       seconds={"attention": 1e-3, "other": 3e-3})
    report = dict(deployment="slice", profiles=[profile_row, dict(profile_row, mode="device", tpot_seconds=4.4e-3)],
                  rows=[dict(mode="hisparse", context=64, trace="t", run="capacity", tpot_ms_median=4.2),
                        dict(mode="hisparse", context=64, trace="t", run="equal batch", tpot_ms_median=9.0)])
    found = gaps.gaps(report)
    assert [(g["mode"], round(g["gap"] * 1e6)) for g in found] == [("hisparse", 200), ("device", 400)]
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(report))
    assert gaps.main([str(path)]) == 0
    # Without the roofline and the kernel count the budget columns say so; the report column is
    # the file's path without /decode.json, the run column tells capacity from prefetch.
    out = capsys.readouterr().out
    assert f"| {tmp_path} | device | capacity | 64 | t | 3 | 5.000 | 4.000 | 4.400 | 0.400 | 9.1% | - | - | - |" in out
    report["profiles"][1].update(roofline_seconds=3.4e-3, kernels_per_step=200.0)
    path.write_text(json.dumps(report))
    assert gaps.main([str(path)]) == 0
    # 0.4 ms of gap over 200 kernels: 2 us a kernel; 85% of a 3.4 ms roofline leaves 0.6 ms: 3 us a kernel.
    assert "| 0.400 | 9.1% | 200 | 2.00 | 3.00 |" in capsys.readouterr().out
    assert gaps.main([]) == 2


def test_the_kernel_budget_is_what_85_percent_of_the_roofline_leaves_beyond_the_bytes():
    p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 0.5e-3), 9e-3, 3.4e-3, {"weights": 2**20},
                            {"hbm": 4e12, "host link": 5e10}, [], kernels_per_step=400.0)
    row = dict(mode="device", context=64, batch=2, **p.as_dict())
    n = len(kernel_categories.CATEGORIES)  # kernels sum to n / 2 ms per step
    b = profile.kernel_budget(row)
    assert b["target_seconds"] == 3.4e-3 / 0.85 and abs(b["budget_seconds"] - 0.6e-3) < 1e-12
    assert abs(b["per_kernel"] - 1.5e-6) < 1e-15 and "gap_per_kernel" not in b
    row["tpot_seconds"] = (n / 2 + 0.8) * 1e-3
    b = profile.kernel_budget(row)
    assert abs(b["gap_per_kernel"] - 2e-6) < 1e-15 and abs(b["over_seconds"] - row["tpot_seconds"] + 3.4e-3) < 1e-15
    line = profile.budget_line(row)
    assert line.startswith("at 85% of the roofline a step takes 4.000 ms: 0.600 ms beyond its bytes, 1.50 us for "
                           "each of its 400 kernels; this run spends ") and line.endswith("its launch gap alone 2.00 us a kernel")
    assert line in profile.format_profile([row])
    # No kernel count (a CPU profile, an old report) or no roofline: no budget, no line.
    assert profile.kernel_budget(dict(row, kernels_per_step=0.0)) is None
    assert profile.kernel_budget(dict(row, roofline_seconds=0.0)) is None
    assert "of the roofline a step takes" not in profile.format_profile([dict(row, kernels_per_step=0.0)])


def test_short_kernels_script_reads_kernel_tables(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "short_kernels.py"
    spec = importlib.util.spec_from_file_location("short_kernels", script)
    short = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(short)
    table = tmp_path / "kernels.log"
    bad = tmp_path / "nan.log"
    table.write_text("\n".join([
        "per step (ms): weights/FFN 0.900, other 0.010",
        "",
        "| category | kernel | per step | us per call min / median / max | us per step | operand MB | TB/s at the median "
        "| of HBM | shapes | scope |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| weights/FFN | GroupedMatmulKernel<true> | 8.00 | 100.00 / 112.50 / 120.00 | 900.0 |  |  |  |  |  |",
        "| other | fusion_1 | 8.00 | 0.90 / 1.00 / 1.20 | 8.0 | 0.01 | 0.01 | 0% | s32[2] -> s32[2] | mlp/add |",
        "| other | fusion_2 | 2.00 | 2.50 / 2.90 / 3.10 | 5.8 | 0.01 | 0.01 | 0% | s32[2] -> s32[2] | seal/add |",
    ]) + "\n")
    assert short.main([str(table)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| kernels.log | 18 | 0.914 | 10 | 0.014 |"
    assert short.main([str(table), "--under", "1.5"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| kernels.log | 18 | 0.914 | 8 | 0.008 |"
    (tmp_path / "report.json").write_text("{}")
    assert short.main([str(tmp_path / "report.json")]) == 2
    assert capsys.readouterr().err.strip() == (f"short_kernels: error: {tmp_path / 'report.json'}: no kernel table "
                                               "header; pass the output of benchmarks/kernel_table.py PROFILE_DIR "
                                               "STEPS --category all")
    assert short.main([str(tmp_path / "missing.log")]) == 2
    assert "missing.log: cannot be read (FileNotFoundError" in capsys.readouterr().err
    bad.write_text(table.read_text().replace("8.00 | 0.90 / 1.00 / 1.20", "8.00 | 0.90 / nan / 1.20"))
    assert short.main([str(bad)]) == 2
    assert "nan.log:6: a kernel row whose launches or times are not finite numbers >= 0" in capsys.readouterr().err
    assert short.main(["/dev/zero"]) == 2  # not a regular file: refused before any read
    assert "/dev/zero: not a regular file" in capsys.readouterr().err


def test_the_prefetch_row_sets_the_kernels_beside_its_copy_against_the_run_without():
    def row(run, kernel_seconds, beside=(), batch=16):
        p = profile.StepProfile(dict.fromkeys(kernel_categories.CATEGORIES, 1e-3), 9e-3, 3e-3, {"weights": 2**20},
                                {"hbm": 4e12, "host link": 5e10}, [],
                                io_overlap=dict(io_seconds=1e-3, hidden_seconds=8e-4, hidden_fraction=0.8),
                                kernel_seconds=kernel_seconds, beside_copy=list(beside))
        return dict(mode="hisparse", context=131072, batch=batch, trace="glm-5.1", run=run, **p.as_dict())

    capacity = row("capacity", {"ChunkKernel": 4e-4, "GroupedMatmulKernel": 2e-3})
    prefetch = row("prefetch", {"ChunkKernel": 6e-4, "GroupedMatmulKernel": 2e-3, "FetchKernel": 1e-3},
                   beside=["ChunkKernel"])
    table = profile.format_profile([capacity, prefetch])
    assert ("kernels beside the copy (1 kinds, every launch of each): 0.600 ms per step, 0.400 ms without "
            "prefetch: +50.0%") in table
    # No kind beside the copy ran without prefetch: said, and no slowdown claimed.
    alone = row("prefetch", {"FetchKernel": 1e-3, "NewKernel": 5e-4}, beside=["NewKernel"])
    assert ("kernels beside the copy: none of their 1 kinds ran in the run without prefetch, so no slowdown is "
            "measured (0.500 ms per step of kinds the run without prefetch has not: NewKernel)") in (
        profile.format_profile([capacity, alone]))
    # Without a run of the same batch to compare with, no such line.
    assert "kernels beside the copy" not in profile.format_profile([row("capacity", {}, batch=17), prefetch])


def test_each_category_is_set_against_its_own_bytes():
    seconds = dict.fromkeys(kernel_categories.CATEGORIES, 0.0)
    seconds.update({"weights/FFN": 5e-3, "indexer": 1e-3, "attention": 8e-4, "resolve": 2e-4, "IO": 1e-3,
                    "top-k": 3e-4})
    moved = {"weights": 4e9 * 4e-3, "metadata": 4e9 * 5e-4, "attended KV": 4e9 * 1e-4, "miss IO": 5e10 * 1e-3}
    p = profile.StepProfile(seconds, 9e-3, 3e-3, moved, {"hbm": 4e9, "host link": 5e10}, [])
    line = profile.byte_bounds(dict(mode="hisparse", context=64, batch=2, **p.as_dict()))
    assert line == ("each category over its own bytes' time: weights/FFN 1.25x, indexer 2.00x, attention 8.00x, "
                    "resolve + IO 1.20x; no bytes of their own in the roofline: top-k 0.300 ms")
    assert line in profile.format_profile([dict(mode="hisparse", context=64, batch=2, **p.as_dict())])


def test_nsa_and_quest_bound_attention_with_their_metadata():
    """Their metadata (compressed KV and window; page bounds and dense layers) is read by kernels
    in the attention category, so attention and indexer share one bound."""
    seconds = dict.fromkeys(kernel_categories.CATEGORIES, 0.0)
    seconds.update({"weights/FFN": 5e-3, "attention": 1e-3})
    moved = {"weights": 4e9 * 4e-3, "metadata": 4e9 * 4e-4, "attended KV": 4e9 * 1e-4, "miss IO": 0.0}
    p = profile.StepProfile(seconds, 9e-3, 3e-3, moved, {"hbm": 4e9, "host link": 5e10}, [])
    row = dict(mode="hisparse", context=64, batch=2, **p.as_dict())
    assert profile.byte_bounds(row, "nsa") == "each category over its own bytes' time: weights/FFN 1.25x, attention + indexer 2.00x"
    assert profile.byte_bounds(dict(row, family="quest")).endswith("attention + indexer 2.00x")
    # DSA: the indexer's bytes without its kernels (trace-no-indexer) are said, not shown as 0.00x.
    assert "indexer no kernels for 0.400 ms of bytes, attention 10.00x" in profile.byte_bounds(row, "dsa")
    assert "attention + indexer 2.00x" in profile.format_profile([row], family="nsa")


def test_byte_bounds_script_reads_old_reports(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "byte_bounds.py"
    spec = importlib.util.spec_from_file_location("byte_bounds", script)
    bounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bounds)
    seconds = dict.fromkeys(kernel_categories.CATEGORIES, 0.0)
    seconds.update({"weights/FFN": 5e-3, "attention": 8e-4, "other": 2e-4})
    row = dict(mode="device", context=64, trace="t", batch=3, seconds=seconds, bandwidths={"hbm": 4e9, "host link": 5e10},
               bytes={"weights": 1.6e7, "metadata": 0.0, "attended KV": 4e5, "miss IO": 0.0})
    cpu = dict(row, seconds=dict.fromkeys(kernel_categories.CATEGORIES, 0.0))  # no kernel events: left out
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(dict(deployment="slice", profiles=[row, cpu])))
    assert bounds.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [f"| {tmp_path} | device | capacity | 64 | t | 3 | 1.25 | - | 8.00 | - | other 0.200 |"]
    assert bounds.main([]) == 2
    # Time without bytes is shown, not dropped; NSA and Quest bound attention with the metadata.
    quest = dict(row, seconds=dict(seconds, resolve=3e-4, indexer=0.0), bytes=dict(row["bytes"], metadata=4e5))
    path.write_text(json.dumps(dict(family="quest", profiles=[quest])))
    assert bounds.main([str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == (
        f"| {tmp_path} | device | capacity | 64 | t | 3 | 1.25 | with attention | 4.00 (attention + indexer) "
        "| 0.300 ms, no bytes | other 0.200 |")

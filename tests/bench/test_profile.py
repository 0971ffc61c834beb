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
    assert profile.launch_gaps(row).endswith(f"minus the kernels' sum: 0.250 ms ({0.25 / (n + 0.25):.1%})")
    assert "412 kernels per step" in profile.format_profile([row])


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
    assert "| slice | device | 64 | t | 3 | 5.000 | 4.000 | 4.400 | 0.400 | 9.1% |" in capsys.readouterr().out
    assert gaps.main([]) == 2


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
    assert out[2:] == ["| slice | device | capacity | 64 | t | 3 | 1.25 | - | 8.00 | - | other 0.200 |"]
    assert bounds.main([]) == 2

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

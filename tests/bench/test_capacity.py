"""The byte account behind `hisparse-bench decode`, and the CLI end to end on a tiny preset."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from hisparse_jax.bench import capacity as cap_lib
from hisparse_jax.bench.cli import main
from hisparse_jax.models import get_family

FAMILIES = ["dsa", "quest", "nsa"]


def _config(name, **overrides):
    return get_family(name).Config.tiny(**overrides)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["device", "hisparse"])
def test_account_counts_every_array_of_the_real_state(name, mode):
    family = get_family(name)
    config = _config(name)
    acc = cap_lib.account(family, config, 3, mode)
    state = family.init_state(config, 3, mode)
    leaves = jax.tree_util.tree_leaves(state)
    assert sum(n for _, _, n in acc.arrays.values()) == sum(x.nbytes for x in leaves)
    host = [p for p, (mem, _, _) in acc.arrays.items() if mem == "host"]
    assert all("host_pool" in p for p in host)
    assert (len(host) > 0) == (mode == "hisparse")


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["device", "hisparse"])
@pytest.mark.parametrize("budget_kib", [64, 300, 1000])
def test_max_batch_is_the_largest_that_fits(name, mode, budget_kib):
    family, config = get_family(name), _config(name)
    budget = budget_kib * 1024
    c = cap_lib.capacity(family, config, mode, device_budget=budget)
    b = c.max_batch
    if b >= 1:
        assert cap_lib.account(family, config, b, mode).total("device") <= budget
    assert cap_lib.account(family, config, b + 1, mode).total("device") > budget
    assert c.limited_by == "device"


def test_host_budget_and_cap_limit_the_batch():
    family, config = get_family("dsa"), _config("dsa")
    per_host = cap_lib.capacity(family, config, "hisparse", device_budget=2**40).host_per_request
    c = cap_lib.capacity(family, config, "hisparse", device_budget=2**40, host_budget=5 * per_host + 1)
    assert (c.max_batch, c.limited_by) == (5, "host")
    c = cap_lib.capacity(family, config, "hisparse", device_budget=2**40, max_batch_cap=3)
    assert (c.max_batch, c.limited_by) == (3, "cap")


def test_hisparse_kv_bytes_per_request_do_not_grow_with_context():
    family = get_family("dsa")
    short, long = _config("dsa", max_context=128), _config("dsa", max_context=256)
    kv = lambda c, m: cap_lib.capacity(family, c, m, device_budget=2**30).device_per_request_by_category[
        "kv records"
    ]
    assert kv(short, "hisparse") == kv(long, "hisparse")
    assert kv(long, "device") == 2 * kv(short, "device")


def test_cli_writes_a_report_whose_numbers_come_from_the_run(tmp_path):
    out = tmp_path / "decode"
    rc = main(["decode", "--contexts", "64", "--steps", "2", "--reps", "1", "--max-batch", "3",
               "--device-budget-mib", "0.5", "--out", str(out), "--no-plots"])
    assert rc == 0
    report = json.loads((out / "decode.json").read_text())
    runs = {(r["run"], r["mode"]) for r in report["rows"]}
    assert runs == {("capacity", "device"), ("capacity", "hisparse"), ("equal batch", "hisparse")}
    for r in report["rows"]:
        assert r["tokens_per_s"] > 0 and r["tpot_ms"] > 0 and 1 <= r["batch"] <= 3
        assert 0 <= r["miss_rate"] <= 1
    (ratio,) = report["ratios"]
    assert ratio["tokens_equal_at_equal_batch"] is True
    assert ratio["kv_device_bytes_per_request"] > 1
    assert np.isfinite(ratio["throughput"])


def test_cli_synthetic_fill_trace_selection_and_no_io_run(tmp_path):
    out = tmp_path / "decode"
    rc = main(["decode", "--contexts", "64", "--steps", "2", "--reps", "1", "--max-batch", "2",
               "--device-budget-mib", "0.5", "--fill", "synthetic", "--selection", "trace", "--no-io",
               "--set", "index_share=2", "--out", str(out), "--no-plots"])
    assert rc == 0
    report = json.loads((out / "decode.json").read_text())
    assert report["fill"] == "synthetic" and report["selection"] == "trace"
    assert report["overrides"] == {"index_share": 2}
    assert any("trace selection" in note for note in report["notes"])
    rows = {(r["run"], r["mode"]): r for r in report["rows"]}
    assert set(rows) == {("capacity", "device"), ("capacity", "hisparse"), ("no-IO", "hisparse"),
                         ("equal batch", "hisparse")}
    quiet, loud = rows[("no-IO", "hisparse")], rows[("capacity", "hisparse")]
    assert quiet["miss_rate"] > 0 and quiet["tpot_ms"] > 0  # RESOLVE still ran and missed
    assert loud["io_bytes_per_token"] > 0 and quiet["batch"] == loud["batch"]
    (ratio,) = report["ratios"]
    assert ratio["tokens_equal_at_equal_batch"] is True


def test_cli_names_a_bad_override():
    with pytest.raises(SystemExit, match="--set 'nope=1': expected FIELD=VALUE"):
        main(["decode", "--set", "nope=1"])


def test_cli_casts_overrides_like_the_preset_and_names_a_bad_value():
    with pytest.raises(SystemExit, match=r"--set 'top_k=abc': top_k takes a int \(the preset has 16\)"):
        main(["decode", "--set", "top_k=abc"])

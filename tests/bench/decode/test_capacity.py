"""The byte account behind `hisparse-bench decode` (the command itself: test_command.py)."""

from __future__ import annotations

import jax
import pytest

from hisparse_jax.bench.decode import capacity as cap_lib
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
    assert len(acc.arrays) == len(leaves), "every array of the state declares its layout"
    assert sum(n for _, _, n, _ in acc.arrays.values()) == sum(x.nbytes for x in leaves)
    host = [p for p, (mem, *_) in acc.arrays.items() if mem == "host"]
    assert all("host_pool" in p for p in host)
    assert (len(host) > 0) == (mode == "hisparse")
    # Per-request bytes are exact: 3 requests hold 3x what one holds (nothing here is shared).
    assert acc.per_request("device") * 3 == acc.total("device")
    assert cap_lib.account(family, config, 1, mode).total("device") == acc.per_request("device")


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

"""An honest byte account of a decode state, and the largest batch each mode fits.

The account is read off the family's real State pytree (jax.eval_shape of
`init_state`, so nothing is allocated): every array is counted, by where it
lives and what it holds. Per-request bytes are the difference between batch 2
and batch 1; what does not scale with batch is counted once.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import jax
import numpy as np

# Last path component (as in jax.tree_util.keystr) -> (memory, category). Any
# other array of the state is device-resident family metadata: indexer keys,
# page min/max, compressed keys, sliding windows, lengths.
_KNOWN = {
    "host_pool": ("host", "kv pool"),
    "device_kv": ("device", "kv records"),
    "hot": ("device", "kv records"),
    "slot_record": ("device", "slot metadata"),
    "lru": ("device", "slot metadata"),
    "tail": ("device", "open page"),
}


def _classify(path: str) -> tuple[str, str]:
    last = path.rsplit(".", 1)[-1].split("[", 1)[0]
    for suffix, where in _KNOWN.items():
        if last == suffix or last.endswith("_" + suffix) or last == suffix + "s":
            return where
    return ("device", "indexer and other metadata")


@dataclasses.dataclass(frozen=True)
class ByteAccount:
    """Bytes of one decode state.

    Attributes:
      arrays: path -> (memory "device"/"host", category, bytes).
    """

    arrays: dict[str, tuple[str, str, int]]

    def total(self, memory: str, category: str | None = None) -> int:
        return sum(
            n for mem, cat, n in self.arrays.values() if mem == memory and category in (None, cat)
        )

    def by_category(self, memory: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for mem, cat, n in self.arrays.values():
            if mem == memory:
                out[cat] = out.get(cat, 0) + n
        return out


def account(family: ModuleType, config, batch: int, mode: str) -> ByteAccount:
    """The byte account of `family.init_state(config, batch, mode)`, allocating nothing."""
    state = jax.eval_shape(lambda: family.init_state(config, batch, mode))
    arrays = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = jax.tree_util.keystr(path)
        memory, category = _classify(name)
        arrays[name] = (memory, category, int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize)
    return ByteAccount(arrays)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """How a mode's bytes grow with batch, and the largest batch under the budgets.

    Attributes:
      device_per_request / host_per_request: bytes each request adds.
      device_fixed / host_fixed: bytes independent of batch.
      device_per_request_by_category: the per-request device bytes, split.
      max_batch: largest batch whose device and host bytes fit (0: none fits).
      limited_by: "device", "host" or "cap".
    """

    mode: str
    device_per_request: int
    host_per_request: int
    device_fixed: int
    host_fixed: int
    device_per_request_by_category: dict[str, int]
    max_batch: int
    limited_by: str


def _fits(fixed: int, per: int, budget: int | None) -> int | None:
    if budget is None or per == 0:
        return None
    return max(0, (budget - fixed) // per)


def capacity(
    family: ModuleType,
    config,
    mode: str,
    *,
    device_budget: int,
    host_budget: int | None = None,
    max_batch_cap: int | None = None,
) -> Capacity:
    """The largest batch of `mode` whose state fits `device_budget` (and `host_budget`) bytes."""
    one, two = account(family, config, 1, mode), account(family, config, 2, mode)
    dev_per = two.total("device") - one.total("device")
    host_per = two.total("host") - one.total("host")
    dev_fixed, host_fixed = one.total("device") - dev_per, one.total("host") - host_per
    by_cat = {
        cat: two.by_category("device").get(cat, 0) - one.by_category("device").get(cat, 0)
        for cat in two.by_category("device")
    }
    limits = {
        "device": _fits(dev_fixed, dev_per, device_budget),
        "host": _fits(host_fixed, host_per, host_budget),
        "cap": max_batch_cap,
    }
    limits = {k: v for k, v in limits.items() if v is not None}
    limited_by = min(limits, key=limits.get)
    return Capacity(
        mode=mode,
        device_per_request=dev_per,
        host_per_request=host_per,
        device_fixed=dev_fixed,
        host_fixed=host_fixed,
        device_per_request_by_category=by_cat,
        max_batch=int(limits[limited_by]),
        limited_by=limited_by,
    )

"""An honest byte account of a decode state, and the largest batch each mode fits.

The account is read off the family's real State pytree (jax.eval_shape of `init_state`, so
nothing is allocated) through the layout every state field declares (hisparse_jax.layout):
every array is counted, by the memory it lives in and the category it declares; an array's bytes
per request are its bytes over its batch axis, and arrays without one are counted once.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import jax
import numpy as np

from .. import layout

MEMORY = {layout.DEVICE: "device", layout.PINNED_HOST: "host"}


@dataclasses.dataclass(frozen=True)
class ByteAccount:
    """Bytes of one decode state.

    Attributes:
      arrays: path -> (memory "device"/"host", category, bytes, bytes per request (0 for an
        array without a batch axis)).
    """

    arrays: dict[str, tuple[str, str, int, int]]

    def total(self, memory: str, category: str | None = None) -> int:
        return sum(n for mem, cat, n, _ in self.arrays.values() if mem == memory and category in (None, cat))

    def per_request(self, memory: str) -> int:
        return sum(r for mem, _, _, r in self.arrays.values() if mem == memory)

    def by_category(self, memory: str, per_request: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        for mem, cat, n, r in self.arrays.values():
            if mem == memory:
                out[cat] = out.get(cat, 0) + (r if per_request else n)
        return out


def account(family: ModuleType, config, batch: int, mode: str) -> ByteAccount:
    """The byte account of `family.init_state(config, batch, mode)`, allocating nothing."""
    state = jax.eval_shape(lambda: family.init_state(config, batch, mode))
    arrays = {}
    for leaf in layout.leaves(state):
        nbytes = int(np.prod(leaf.value.shape)) * np.dtype(leaf.value.dtype).itemsize
        axis = leaf.layout.batch_axis
        per = nbytes // leaf.value.shape[axis] if axis is not None else 0
        arrays[leaf.path] = (MEMORY[leaf.layout.memory], leaf.layout.category, nbytes, per)
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
    one = account(family, config, 1, mode)
    dev_per, host_per = one.per_request("device"), one.per_request("host")
    dev_fixed, host_fixed = one.total("device") - dev_per, one.total("host") - host_per
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
        device_per_request_by_category=one.by_category("device", per_request=True),
        max_batch=int(limits[limited_by]),
        limited_by=limited_by,
    )

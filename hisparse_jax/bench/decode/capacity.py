"""An honest byte account of a decode state, and the largest batch each mode fits.

The account is read off the family's real State pytree (jax.eval_shape of `init_state`, so
nothing is allocated) through the layout every state field declares (hisparse_jax.layout):
every array is counted, by the memory it lives in and the category it declares (a kit indexer's
own records: "indexer records"); an array's bytes
per request are its bytes over its batch axis, and arrays without one are counted once.

With the decode's working memory (hisparse_jax.bench.decode.working_memory), a batch's device bytes are
its state's plus what the compiled decode needs besides (temporaries, unaliased outputs, small
inputs, trace ids), and the answer is checked against compiled programs, not the estimate.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import TYPE_CHECKING, Callable

import jax
import numpy as np

from ... import layout

if TYPE_CHECKING:  # working_memory imports the decode and the models; the account needs neither
    from .working_memory import WorkingMemory

MEMORY = {layout.DEVICE: "device", layout.PINNED_HOST: "host"}
# A kit indexer's own record kind (kit.RecordKind: state.index_store, state.index_tail) is a
# RecordStore like the KV's, declared as records, slot metadata and an open page; the account
# files all of it under one category of its own, so the KV's part stays the KV's.
INDEXER_RECORDS = "indexer records"
_INDEXER_RECORD_PATHS = ("index_store.", "index_tail")


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
        category = INDEXER_RECORDS if leaf.path.startswith(_INDEXER_RECORD_PATHS) else leaf.layout.category
        arrays[leaf.path] = (MEMORY[leaf.layout.memory], category, nbytes, per)
    return ByteAccount(arrays)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """How a mode's bytes grow with batch, and the largest batch under the budgets.

    Attributes:
      device_per_request / host_per_request: state bytes each request adds.
      device_fixed / host_fixed: state bytes independent of batch.
      device_per_request_by_category: the per-request device state bytes, split.
      max_batch: largest batch whose device and host bytes fit (0: none fits).
      limited_by: "device", "host" or "cap".
      working_fixed / working_per_request: the decode's working memory (beyond state and weights)
        as an affine fit of two compiled batches (0 when capacity was given no working memory).
      trace_ids_per_request: trace-id bytes each request adds to a call (0 without a trace).
      working_at_max_batch: the compiled working memory, trace ids included, at max_batch: the
        figure the answer was checked with (0 without working memory or when max_batch is 0).
      working: the WorkingMemory the search used (None: state only).
    """

    mode: str
    device_per_request: int
    host_per_request: int
    device_fixed: int
    host_fixed: int
    device_per_request_by_category: dict[str, int]
    max_batch: int
    limited_by: str
    working_fixed: int = 0
    working_per_request: int = 0
    trace_ids_per_request: int = 0
    working_at_max_batch: int = 0
    working: WorkingMemory | None = dataclasses.field(default=None, repr=False, compare=False)

    def state_device_bytes(self, batch: int) -> int:
        """Device bytes of the state of `batch` requests."""
        return self.device_fixed + self.device_per_request * batch

    def device_bytes(self, batch: int) -> int:
        """Device bytes a decode call at `batch` needs: its state, and with working memory the
        compiled program's working memory (compiled when `batch` was not yet)."""
        extra = self.working.at(batch).total if self.working is not None and batch >= 1 else 0
        return self.state_device_bytes(batch) + extra


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
    working: WorkingMemory | None = None,
) -> Capacity:
    """The largest batch of `mode` whose state (and, given `working`, the decode's working memory)
    fits `device_budget` bytes, and whose host pool fits `host_budget`.

    With `working`, the state-only answer bounds the search (working memory is never negative);
    the affine estimate picks where it starts, and compiled programs decide: the answer b fits
    when compiled and b + 1 does not (or is beyond the state-only bound). See `largest_fitting`
    for how many compiles that takes."""
    if working is not None and (working.family is not family or working.config != config
                                or working.mode != mode):
        raise ValueError(f"capacity: working is the working memory of {working.family.name} "
                         f"{working.mode!r}, not of this {family.name} {mode!r} config; build it "
                         "with working_memory(family, config, mode, ...)")
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
    max_batch = int(limits[limited_by])
    parts = {}
    if working is not None:
        def fits(batch: int) -> bool:
            return dev_fixed + dev_per * batch + working.at(batch).total <= device_budget

        per = dev_per + working.per_request + working.trace_ids_per_request
        room = device_budget - dev_fixed - working.fixed
        guess = max_batch if per <= 0 else min(max_batch, max(0, room // per))
        found = largest_fitting(fits, guess, max_batch)
        if found < max_batch:
            limited_by = "device"
        max_batch = found
        parts = dict(working_fixed=working.fixed, working_per_request=working.per_request,
                     trace_ids_per_request=working.trace_ids_per_request,
                     working_at_max_batch=working.at(max_batch).total if max_batch >= 1 else 0, working=working)
    return Capacity(
        mode=mode,
        device_per_request=dev_per,
        host_per_request=host_per,
        device_fixed=dev_fixed,
        host_fixed=host_fixed,
        device_per_request_by_category=one.by_category("device", per_request=True),
        max_batch=max_batch,
        limited_by=limited_by,
        **parts,
    )


def largest_fitting(fits: Callable[[int], bool], guess: int, upper: int) -> int:
    """The largest batch in [0, upper] that fits (batch 0 always does, and is never checked):
    from `guess`, steps of 1, 2, 4, ... up while batches fit (down while they do not), then
    bisection of the last step. A guess d batches off costs about 2 log2(d) + 2 checks, and at
    most about 2 log2(upper) + 2; an exact guess 2 (guess and guess + 1), 1 at `upper`. Whatever
    `fits` does, the answer was checked to fit and the batch above it (below `upper`) checked not
    to; that no larger batch fits takes `fits` monotone (device bytes growing with the batch)."""
    guess = min(max(int(guess), 0), upper)
    step = 1
    if guess == 0 or fits(guess):
        low = guess
        while low + step <= upper and fits(low + step):
            low, step = low + step, step * 2
        high = min(low + step, upper + 1)  # does not fit, or lies beyond the bound
    else:
        high = guess
        while high - step >= 1 and not fits(high - step):
            high, step = high - step, step * 2
        low = max(high - step, 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low

"""Eviction policies replayed on selection traces: how many records a hot buffer of B slots fetches.

A selection trace names, at each decode step, the record ids one selecting layer picks for each
stream (`hisparse_jax.selection.recorded.RecordedTrace.ids`,
`hisparse_jax.selection.synthetic.selections`). This module replays such ids through a cache of B slots per (layer, stream) under several eviction policies
and counts the misses, so that RESOLVE's LRU can be set against the classic alternatives and
against Belady's offline optimum on the same trace (docs/policies.md has the rules).

What every policy shares:
- after a step, every valid id of its selection is resident (B >= k);
- a miss is a selected id that was not resident before the step; the misses of a step are
  filled in the order of their position in the selection row;
- a victim is never a slot that holds an id of the current step, and empty slots are used first;
- the policies differ only in which of the other resident records they evict.

Each step is vectorised with numpy over the B slots of every row (a row is one stream of one
layer): a record -> slot map per row finds the hits, and a per-policy order or key picks the
victims, so a replay costs O(steps * rows * B) array work and no Python loop over ids.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

POLICIES = ("lru", "fifo", "random", "clock", "lfu", "belady")
DEFAULT_RATIOS = (1.0, 1.5, 2.0, 3.0, 4.0)

_NEVER = np.iinfo(np.int64).max  # the eviction key of a slot holding an id of the current step


# --------------------------------------------------------------------------- public API


def simulate(ids, capacity: int, policy: str, *, seed: int = 0) -> np.ndarray:
    """Misses per step and stream of a cache of `capacity` slots per stream under `policy`.

    Args:
      ids: [steps, streams, k] integer record ids of ONE selecting layer; each row holds distinct
        ids >= 0 and -1 padding (top-k rows are ascending with the padding at the end; any order
        is accepted and is the order the misses are filled in). Rows are independent, so the
        streams of several layers may be stacked on the streams axis.
      capacity: B, slots per stream, an int >= k.
      policy: one of POLICIES (docs/policies.md).
      seed: seeds the numpy Generator of "random" (its draws depend on the seed and on the
        shape of `ids`); ignored by the other policies.
    Returns:
      [steps, streams] int64: records fetched at each step.
    """
    ids = _check_ids(ids)
    steps, rows, k = ids.shape
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < k:
        raise ValueError(f"capacity must be an int >= k = {k} (a step's ids must all be resident), got {capacity!r}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; give one of {', '.join(POLICIES)}")
    capacity = int(capacity)
    cache = _Slots(rows, capacity, int(ids.max()) + 1)
    rule = _RULES[policy](ids, capacity, seed)
    misses = np.empty((steps, rows), np.int64)
    for t in range(steps):
        selection = ids[t]
        held = cache.lookup(selection)
        hit = held >= 0
        miss = (selection >= 0) & ~hit
        hit_slots = np.zeros((rows, capacity), bool)
        hit_slots[np.nonzero(hit)[0], held[hit]] = True
        if np.count_nonzero(hit_slots) != np.count_nonzero(hit):
            raise _repeated(t, np.nonzero(hit_slots.sum(1) != hit.sum(1))[0][0])
        misses[t] = np.count_nonzero(miss, axis=1)
        victims = rule.victims(t, cache, hit_slots, misses[t])
        filled = cache.fill(t, selection, miss, victims)
        rule.update(t, cache, selection, hit_slots, filled)
    return misses


def capacities(k: int, ratios: Sequence[float]) -> list[int]:
    """B = round(ratio * k) for each ratio (the nearest int); each must be >= k."""
    out = []
    for ratio in ratios:
        if not (isinstance(ratio, (int, float, np.integer, np.floating)) and math.isfinite(ratio)):
            raise ValueError(f"ratios: {ratio!r} is not a finite number; give B/k ratios >= 1")
        capacity = int(round(float(ratio) * k))
        if capacity < k:
            raise ValueError(f"ratios: {ratio:g} gives B = {capacity} below k = {k}; give ratios >= 1")
        out.append(capacity)
    return out


def replay(ids, *, ratios: Sequence[float] = DEFAULT_RATIOS, policies: Sequence[str] = POLICIES, warm: int = 0,
           seed: int = 0, progress: Callable[[str], None] | None = None) -> dict:
    """Miss rates of every policy at every B = round(ratio * k), overall and per layer.

    Args:
      ids: [steps, layers, *streams, k] record ids (RecordedTrace.ids, traces.selections); each
        (layer, stream) row sequence is replayed through its own cache of B slots.
      ratios: B/k values; policies: names from POLICIES.
      warm: misses and selected ids count from step `warm` on (the cold start left out).
      seed: the "random" policy's seed; progress: called with a label after each replay.
    Returns a JSON-able dict: steps, layers, streams, k, warm, seed, ratios, capacities, policies,
    selected (valid ids counted) and selected_per_layer, and per policy, one entry per ratio:
    misses[policy] (ints), miss_rate[policy] (misses / selected) and layer_miss_rate[policy]
    ([layers] each; None for a layer that selected nothing).
    """
    ids = _as_layers(ids)
    steps, layers, streams, k = ids.shape
    if not isinstance(warm, (int, np.integer)) or isinstance(warm, bool) or not 0 <= warm < steps:
        raise ValueError(f"warm must be an int in [0, steps = {steps}) (misses count from step warm on), got {warm!r}")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        what = f"unknown {unknown}" if unknown else "none given"
        raise ValueError(f"policies: {what}; give some of {', '.join(POLICIES)}")
    sizes = capacities(k, ratios)
    rows = ids.reshape(steps, layers * streams, k)
    per_layer = lambda counts: counts.reshape(layers, streams).sum(axis=1)
    selected = per_layer(np.count_nonzero(rows[warm:] >= 0, axis=(0, 2)))
    result = dict(steps=steps, layers=layers, streams=streams, k=k, warm=int(warm), seed=int(seed),
                  ratios=[float(r) for r in ratios], capacities=sizes, policies=list(policies),
                  selected=int(selected.sum()), selected_per_layer=selected.tolist(),
                  misses={}, miss_rate={}, layer_miss_rate={})
    for policy in policies:
        result["misses"][policy], result["miss_rate"][policy], result["layer_miss_rate"][policy] = [], [], []
        for ratio, capacity in zip(ratios, sizes):
            missed = per_layer(simulate(rows, capacity, policy, seed=seed)[warm:].sum(axis=0))
            result["misses"][policy].append(int(missed.sum()))
            result["miss_rate"][policy].append(_rate(missed.sum(), selected.sum()))
            result["layer_miss_rate"][policy].append([_rate(m, s) for m, s in zip(missed, selected)])
            if progress is not None:
                progress(f"{policy} B/k={float(ratio):g}")
    return result


def step_overlap(ids) -> np.ndarray:
    """[layers] float: the mean over steps t >= 1 and streams of |S_t & S_t-1| / |S_t|, the
    share of a selection its layer already selected at the step before (rows with an empty S_t
    left out; nan for a layer without any such row).

    Args:
      ids: [steps, layers, *streams, k] record ids, -1 padding, distinct ids per row.
    """
    ids = _as_layers(ids)
    steps, layers, streams, k = ids.shape
    shape = (steps - 1, layers * streams, k)
    return _mean_per_layer(*_shared(ids[1:].reshape(shape), ids[:-1].reshape(shape)), layers)


def layer_overlap(ids) -> np.ndarray:
    """[layers - 1] float: entry l - 1 is the mean over steps and streams of |S_l & S_l-1| / |S_l|,
    the share of layer l's selection that the layer before selected at the same step."""
    ids = _as_layers(ids)
    steps, layers, streams, k = ids.shape
    if layers == 1:
        return np.zeros(0)
    shape = (steps, (layers - 1) * streams, k)
    return _mean_per_layer(*_shared(ids[:, 1:].reshape(shape), ids[:, :-1].reshape(shape)), layers - 1)


# --------------------------------------------------------------------------- shared state


class _Slots:
    """The residency every policy shares: `record` [rows, B] (-1 = empty) and the record -> slot
    map `slot_of` [rows, R + 1]. The map's last column stands for padding: an id of -1 indexes
    it, and it stays -1, so lookups and updates need no mask for padding or empty slots."""

    def __init__(self, rows: int, capacity: int, num_records: int):
        self.record = np.full((rows, capacity), -1, np.int32)
        self.slot_of = np.full((rows, num_records + 1), -1, np.int32)
        self.rows = np.arange(rows)[:, None]

    @property
    def empty(self) -> np.ndarray:
        return self.record < 0

    def lookup(self, selection: np.ndarray) -> np.ndarray:
        """[rows, k] slot holding each id, -1 where it is not resident or padding."""
        return self.slot_of[self.rows, selection]

    def fill(self, t: int, selection, miss, victims) -> np.ndarray:
        """Miss j of a row (j-th in row order) takes victims[row, j]; returns the filled slots as
        a [rows, B] mask."""
        r, c = np.nonzero(miss)
        slots = victims[r, (np.cumsum(miss, axis=1) - 1)[r, c]]
        records = selection[r, c]
        self.slot_of[r, self.record[r, slots]] = -1  # an empty slot's -1 rewrites the padding column: still -1
        self.slot_of[r, records] = slots
        self.record[r, slots] = records
        wrong = self.slot_of[r, records] != slots  # a record missed twice in one row holds one slot only
        if np.any(wrong):
            raise _repeated(t, r[np.argmax(wrong)])
        filled = np.zeros(self.record.shape, bool)
        filled[r, slots] = True
        return filled


def _repeated(t: int, row: int) -> ValueError:
    return ValueError(f"ids: step {t}, stream {row} names a record twice; give distinct ids per row (-1 padding)")


# --------------------------------------------------------------------------- victim helpers
# A policy's `victims` returns [rows, K] slots, K = the most misses of any row: row r's first
# m[r] entries are its victims in the order its misses take them; later entries are ignored.


def _in_order(order: np.ndarray, per_slot: np.ndarray) -> np.ndarray:
    """per_slot [rows, B] read along `order` (slots listed first to last)."""
    return np.take_along_axis(per_slot, order, axis=1)


def _first_evictable(order, hit_slots, m):
    """The first m[r] slots of `order` that are not hit: (hit along order, victim rank along
    order: j for the j-th victim, else -1), RESOLVE's rule 3 for the LRU order."""
    hit = _in_order(order, hit_slots)
    rank = np.cumsum(~hit, axis=1) - 1
    return hit, np.where(~hit & (rank < m[:, None]), rank, -1)


def _victims_from_rank(rank: np.ndarray, slot_at: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[rows, K] victims from a victim rank per position and the slot at each position."""
    victims = np.zeros((rank.shape[0], int(m.max(initial=0))), np.int64)
    r, p = np.nonzero(rank >= 0)
    victims[r, rank[r, p]] = slot_at[r, p]
    return victims


def _smallest(key: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[rows, K] the slots of the K smallest keys of each row in increasing key order (keys of a
    row are distinct, so the choice is deterministic)."""
    K = int(m.max(initial=0))
    if K == 0:
        return np.zeros((key.shape[0], 0), np.int64)
    part = np.argpartition(key, K - 1, axis=1)[:, :K]
    return np.take_along_axis(part, np.argsort(np.take_along_axis(key, part, axis=1), axis=1), axis=1)


def _rank_of(victims: np.ndarray, m: np.ndarray, capacity: int) -> np.ndarray:
    """[rows, B] victim rank of each slot (-1: not a victim)."""
    rank = np.full((victims.shape[0], capacity), -1, np.int64)
    j = np.arange(victims.shape[1])
    use = j < m[:, None]
    rank[np.nonzero(use)[0], victims[use]] = np.broadcast_to(j, victims.shape)[use]
    return rank


def _promote(order, hit, rank, m) -> np.ndarray:
    """RESOLVE's rule 4 on an order of slots (least recently used first): evictable slots not
    taken (old order) + slots just filled (miss order) + hit slots (old order). `hit` and `rank`
    are read along `order`."""
    taken = rank >= 0
    keep = ~hit & ~taken
    evictable = (order.shape[1] - hit.sum(axis=1))[:, None]
    position = np.where(keep, np.cumsum(keep, axis=1) - 1,
                        np.where(taken, evictable - m[:, None] + rank, evictable + np.cumsum(hit, axis=1) - 1))
    new = np.empty_like(order)
    np.put_along_axis(new, position, order, axis=1)
    return new


def _positions(order: np.ndarray) -> np.ndarray:
    """The inverse of `order`: the position of each slot in it."""
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.broadcast_to(np.arange(order.shape[1], dtype=order.dtype), order.shape), axis=1)
    return position


def _initial_order(rows: int, capacity: int) -> np.ndarray:
    return np.broadcast_to(np.arange(capacity, dtype=np.int64), (rows, capacity)).copy()


# --------------------------------------------------------------------------- policies


class _Policy:
    def __init__(self, ids: np.ndarray, capacity: int, seed: int):
        self.rows, self.capacity = ids.shape[1], capacity

    def victims(self, t, cache: _Slots, hit_slots, m) -> np.ndarray:
        raise NotImplementedError

    def update(self, t, cache: _Slots, selection, hit_slots, filled) -> None:
        """After the fill: what the policy learns from the step's hits and fills."""


class _Ordered(_Policy):
    """A policy that keeps `order`, a list of the slots per row (initially 0..B-1), and evicts
    along it (RESOLVE's rule 3): lru, fifo and lfu."""

    def __init__(self, ids, capacity, seed):
        super().__init__(ids, capacity, seed)
        self.order = _initial_order(self.rows, capacity)

    def first_evictable(self, hit_slots, m):
        """The first m[r] slots of `order` that are not hit: (hit and victim rank, both read
        along `order`, and the [rows, K] victims)."""
        hit, rank = _first_evictable(self.order, hit_slots, m)
        return hit, rank, _victims_from_rank(rank, self.order, m)


class _Lru(_Ordered):
    """RESOLVE exactly (docs/contract.md rules 3-4): `order` lists the slots least recently used
    first (initially 0..B-1); miss m takes the m-th slot of `order` that is not hit. An empty
    slot is just an evictable slot of the order; empty slots stay at its front, so they go first."""

    def victims(self, t, cache, hit_slots, m):
        hit, rank, victims = self.first_evictable(hit_slots, m)
        self.order = _promote(self.order, hit, rank, m)
        return victims


class _Fifo(_Ordered):
    """`order` lists the slots by insertion, oldest first (empty slots first, in slot order); the
    victims are its first slots that are not hit; hits do not move; filled slots go to the end in
    miss order (the order they were filled breaks ties within a step)."""

    def victims(self, t, cache, hit_slots, m):
        _, rank, victims = self.first_evictable(hit_slots, m)
        stay = rank < 0
        position = np.where(stay, np.cumsum(stay, axis=1) - 1, (self.capacity - m)[:, None] + rank)
        new = np.empty_like(self.order)
        np.put_along_axis(new, position, self.order, axis=1)
        self.order = new
        return victims


class _Random(_Policy):
    """Uniform among the evictable slots: each step draws one uniform key per slot from a seeded
    numpy Generator (a [rows, B] draw, every step); empty slots first (slot order), then the
    evictable slots of smallest key, in key order."""

    def __init__(self, ids, capacity, seed):
        super().__init__(ids, capacity, seed)
        self.rng = np.random.default_rng(seed)
        self.empty_key = np.arange(capacity) - float(capacity)  # below every draw in [0, 1)

    def victims(self, t, cache, hit_slots, m):
        key = np.where(cache.empty, self.empty_key, self.rng.random((self.rows, self.capacity)))
        return _smallest(np.where(hit_slots, np.inf, key), m)


class _Lfu(_Ordered):
    """Fewest uses since insertion (the insertion counts as one use, each hit adds one); ties to
    the least recently used in RESOLVE's order (rule 4, maintained as for "lru"); empty slots first."""

    def __init__(self, ids, capacity, seed):
        super().__init__(ids, capacity, seed)
        self.uses = np.zeros((self.rows, capacity), np.int64)

    def victims(self, t, cache, hit_slots, m):
        uses = np.where(cache.empty, -1, self.uses)
        key = np.where(hit_slots, _NEVER, uses * self.capacity + _positions(self.order))
        victims = _smallest(key, m)
        rank = _in_order(self.order, _rank_of(victims, m, self.capacity))
        self.order = _promote(self.order, _in_order(self.order, hit_slots), rank, m)
        return victims

    def update(self, t, cache, selection, hit_slots, filled):
        self.uses += hit_slots
        self.uses[filled] = 1


class _Clock(_Policy):
    """Second chance with one reference bit per slot and a hand over slots 0..B-1.

    A hit sets its slot's bit (before any victim is chosen) and so does an insertion. While empty
    slots remain, misses take them in slot order without moving the hand (slots are never
    emptied again). Then each further miss advances the hand: a slot holding an id of the current
    step is passed untouched; a slot whose bit is set has it cleared and is passed; the first
    slot with a clear bit is the victim, and the hand stops just past it. Since B >= k, two turns
    of the hand always find enough victims."""

    def __init__(self, ids, capacity, seed):
        super().__init__(ids, capacity, seed)
        self.referenced = np.zeros((self.rows, capacity), bool)
        self.hand = np.zeros(self.rows, np.int64)
        self.used = np.zeros(self.rows, np.int64)  # slots ever filled: the empty ones are [used, B)

    def victims(self, t, cache, hit_slots, m):
        B = self.capacity
        self.referenced |= hit_slots
        from_empty = np.minimum(m, B - self.used)
        victims = self.used[:, None] + np.arange(int(m.max(initial=0)))  # the first from_empty[r] are empty slots
        rest = m - from_empty
        if rest.any():
            slot = np.arange(B)
            just_filled = (slot >= self.used[:, None]) & (slot < (self.used + from_empty)[:, None])
            at = (self.hand[:, None] + slot) % B  # the slot the hand reads after q moves
            passable = ~_in_order(at, hit_slots | just_filled)
            bit = _in_order(at, self.referenced)
            clear, set_ = passable & ~bit, passable & bit
            n_clear, n_set = np.cumsum(clear, axis=1), np.cumsum(set_, axis=1)
            first_turn = n_clear[:, -1]  # victims found before the hand is back where it started
            # First turn: the clear slots in hand order; second turn (every bit now cleared): the
            # slots that had their bit set, in hand order again.
            rank = np.where(clear & (n_clear <= rest[:, None]), n_clear - 1,
                            np.where(set_ & (n_set <= (rest - first_turn)[:, None]), first_turn[:, None] + n_set - 1, -1))
            sweeping = rest > 0
            last = np.argmax(rank == (rest - 1)[:, None], axis=1)  # where the hand takes its last victim
            one_turn = (first_turn >= rest)[:, None]
            cleared = set_ & sweeping[:, None] & (~one_turn | (slot < last[:, None]))
            r, q = np.nonzero(cleared)
            self.referenced[r, at[r, q]] = False
            r, q = np.nonzero(rank >= 0)
            victims[r, from_empty[r] + rank[r, q]] = at[r, q]
            self.hand = np.where(sweeping, (self.hand + last + 1) % B, self.hand)
        self.used += from_empty
        return victims

    def update(self, t, cache, selection, hit_slots, filled):
        self.referenced |= filled


class _Belady(_Policy):
    """Offline optimal: evict the resident record whose next use is farthest in the future (a
    record never used again is infinitely far), ties by slot index; empty slots first. The next
    use of every selected id is precomputed by one backward pass over the trace."""

    def __init__(self, ids, capacity, seed):
        super().__init__(ids, capacity, seed)
        self.steps = ids.shape[0]
        self.next_pick = _next_uses(ids)
        self.next_use = np.full((self.rows, capacity), self.steps, np.int64)  # steps = never again
        self.slot = np.arange(capacity, dtype=np.int64)

    def victims(self, t, cache, hit_slots, m):
        farthest_first = (self.steps + 1 - self.next_use) * self.capacity + self.slot  # >= B: after empties
        key = np.where(cache.empty, self.slot, farthest_first)
        return _smallest(np.where(hit_slots, _NEVER, key), m)

    def update(self, t, cache, selection, hit_slots, filled):
        r, c = np.nonzero(selection >= 0)
        self.next_use[r, cache.lookup(selection)[r, c]] = self.next_pick[t, r, c]


_RULES = {"lru": _Lru, "fifo": _Fifo, "random": _Random, "clock": _Clock, "lfu": _Lfu, "belady": _Belady}
assert tuple(_RULES) == POLICIES


def _next_uses(ids: np.ndarray) -> np.ndarray:
    """[steps, rows, k] int32: the next step after t that selects ids[t, r, j] again in row r
    (steps: never). One backward pass; padding lands in the map's spare last column."""
    steps, rows, _ = ids.shape
    last = np.full((rows, int(ids.max()) + 2), steps, np.int32)
    r = np.arange(rows)[:, None]
    out = np.empty(ids.shape, np.int32)
    for t in range(steps - 1, -1, -1):
        out[t] = last[r, ids[t]]
        last[r, ids[t]] = t
    return out


# --------------------------------------------------------------------------- checks and overlaps


def _check_ids(ids) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 3 or not np.issubdtype(ids.dtype, np.integer) or min(ids.shape) < 1:
        raise ValueError(f"ids must be a non-empty integer array [steps, streams, k], got {ids.dtype} {list(ids.shape)}")
    if ids.min() < -1:
        raise ValueError(f"ids must be record ids >= 0 or -1 (padding), got {ids.min()}")
    if ids.max() >= np.iinfo(np.int32).max:
        raise ValueError(f"ids must be below 2**31 - 1, got {ids.max()}")
    ids = ids.astype(np.int32, copy=False)
    if ids.shape[1] * (int(ids.max()) + 2) > 4 * ids.size:
        # The simulations map ids to slots with tables of a column per id, so a few large ids
        # (2**28 costs 1.2 GiB) would size them; renumber the ids that occur, keeping their order
        # (every policy sees only equality and order), and -1 stays -1 (the smallest value).
        unique, dense = np.unique(ids, return_inverse=True)
        ids = (dense.reshape(ids.shape) - int(unique[0] == -1)).astype(np.int32)
    return ids


def _as_layers(ids) -> np.ndarray:
    """[steps, layers, *streams, k] -> [steps, layers, streams, k] int32, checked."""
    ids = np.asarray(ids)
    if ids.ndim < 4:
        raise ValueError(f"ids must be [steps, layers, *streams, k] (RecordedTrace.ids, traces.selections), "
                         f"got shape {list(ids.shape)}")
    flat = _check_ids(ids.reshape(ids.shape[0], -1, ids.shape[-1]))
    return flat.reshape(ids.shape[0], ids.shape[1], -1, ids.shape[-1])


def _shared(current: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|current & previous|, |current|), each [n, rows], for [n, rows, k] rows of distinct ids."""
    n, rows, _ = current.shape
    present = np.zeros((rows, max(int(current.max(initial=-1)), int(previous.max(initial=-1))) + 2), bool)
    r = np.arange(rows)[:, None]
    shared = np.zeros((n, rows), np.int64)
    for i in range(n):
        present[r, previous[i]] = True  # padding marks the spare last column, never counted
        shared[i] = np.count_nonzero(present[r, current[i]] & (current[i] >= 0), axis=1)
        present[r, previous[i]] = False
    return shared, np.count_nonzero(current >= 0, axis=2)


def _mean_per_layer(shared: np.ndarray, size: np.ndarray, layers: int) -> np.ndarray:
    if size.size == 0:  # a single step: no pair to compare
        return np.full(layers, np.nan)
    fraction = np.divide(shared, size, out=np.zeros(shared.shape), where=size > 0)
    rows = (fraction.shape[0], layers, -1)
    counted = np.count_nonzero(size.reshape(rows) > 0, axis=(0, 2))
    total = fraction.reshape(rows).sum(axis=(0, 2))
    return np.divide(total, counted, out=np.full(layers, np.nan), where=counted > 0)


def _rate(misses, selected) -> float | None:
    return float(misses) / float(selected) if selected else None

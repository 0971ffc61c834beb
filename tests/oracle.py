"""The RESOLVE contract and the pool write as plain Python loops: obviously right, slow.

Each rule of the RESOLVE contract (docs/contract.md, ffi/resolve.h) is written
out literally, one stream at a time, on NumPy arrays. Record bytes are moved as raw bytes (a uint8 view), so
the oracle is exact for every dtype, NaN payloads included. Every other rung
(the JAX reference, the C++ and CUDA handlers) is compared with this one with
zero tolerance.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class StreamResult:
    """What RESOLVE does to one stream (lists of Python ints)."""

    slots: list[int]  # [k]
    miss_records: list[int]  # [k], -1 after the last miss
    miss_slots: list[int]  # [k], -1 after the last miss
    misses: int
    invalid: int
    slot_record: list[int]  # [B] after the call
    lru: list[int]  # [B] after the call
    malformed: bool = False  # the state came in malformed and nothing was resolved


def is_malformed(slot_record, lru, pool_records) -> bool:
    """True unless lru is a permutation of [0, B) and slot_record holds values in
    [-1, R) with no record id >= 0 in two slots (the malformed-state rule)."""
    slot_record = [int(x) for x in slot_record]
    held = [record for record in slot_record if record >= 0]
    return (
        sorted(int(x) for x in lru) != list(range(len(slot_record)))
        or any(not -1 <= record < pool_records for record in slot_record)
        or len(set(held)) != len(held)
    )


def resolve_stream(selection, sealed, slot_record, lru, pool_records) -> StreamResult:
    """The six rules for one stream, without the record copy.

    Args:
      selection: [k] record ids, -1 = padding.
      sealed: sealed records of the stream.
      slot_record: [B] record held by each slot, -1 = empty.
      lru: [B] permutation of slots, least recently used first.
      pool_records: R.
    A malformed state (see is_malformed) resolves nothing: state untouched,
    every output -1, misses 0, invalid counted by rule 0, malformed True.
    """
    selection = [int(x) for x in selection]
    slot_record = [int(x) for x in slot_record]
    lru = [int(x) for x in lru]
    k, B = len(selection), len(slot_record)
    limit = max(0, min(int(sealed), pool_records))

    # Rule 0: an id outside [0, min(sealed, R)) other than -1 is padding, counted in `invalid`.
    def is_valid(record):
        return 0 <= record < limit

    invalid = sum(1 for record in selection if record != -1 and not is_valid(record))

    if is_malformed(slot_record, lru, pool_records):
        nothing = [-1] * k
        return StreamResult(
            slots=nothing,
            miss_records=nothing,
            miss_slots=nothing,
            misses=0,
            invalid=invalid,
            slot_record=slot_record,
            lru=lru,
            malformed=True,
        )

    # Rule 1: H = distinct valid ids (kept in order of first appearance); hit slots hold one.
    distinct = []
    for record in selection:
        if is_valid(record) and record not in distinct:
            distinct.append(record)
    hit_slots = [slot for slot in range(B) if slot_record[slot] in distinct]

    # Rule 2: misses = ids of H held by no slot, in order of first appearance.
    miss_list = [record for record in distinct if record not in slot_record]

    # Rule 3: evictable = non-hit slots in lru order; miss m takes evictable[m].
    evictable = [slot for slot in lru if slot not in hit_slots]
    assert len(miss_list) <= len(evictable), "B >= k guarantees a slot per miss"
    filled = evictable[: len(miss_list)]

    # Rule 4: [evictables not taken, old order] + [filled, miss order] + [hits, old order].
    new_lru = evictable[len(miss_list) :] + filled + [slot for slot in lru if slot in hit_slots]

    # Rule 5 (metadata; the bytes are copied by the caller).
    new_slot_record = list(slot_record)
    for record, slot in zip(miss_list, filled):
        new_slot_record[slot] = record

    # Rule 6: slots[j] = slot holding selection[j], -1 for padding and invalid ids.
    slots = [new_slot_record.index(record) if is_valid(record) else -1 for record in selection]

    pad = [-1] * (k - len(miss_list))
    return StreamResult(
        slots=slots,
        miss_records=miss_list + pad,
        miss_slots=filled + pad,
        misses=len(miss_list),
        invalid=invalid,
        slot_record=new_slot_record,
        lru=new_lru,
    )


def as_bytes(x: np.ndarray, lead: int) -> np.ndarray:
    """x [*lead dims, *record] viewed as [*lead dims, record bytes] uint8 (a view, not a copy)."""
    x = np.ascontiguousarray(x)
    return x.reshape(*x.shape[:lead], -1).view(np.uint8)


@dataclasses.dataclass
class Resolved:
    """Every output of one RESOLVE call, as NumPy arrays (same shapes as the JAX API)."""

    slots: np.ndarray  # [*S, k] int32
    miss_records: np.ndarray  # [*S, k] int32
    miss_slots: np.ndarray  # [*S, k] int32
    misses: np.ndarray  # [*S] int32
    invalid: np.ndarray  # [*S] int32
    malformed: np.ndarray  # [*S] int32, 1 = the stream's state was malformed
    hot: np.ndarray  # [L, *S, B, *rec]
    slot_record: np.ndarray  # [L, *S, B] int32
    lru: np.ndarray  # [L, *S, B] int32


def resolve(hot, slot_record, lru, host_pool, selection, sealed, layer, *, fetch=True, stream_begin=0,
            stream_count=None) -> Resolved:
    """RESOLVE on every stream of `layer`, or on the streams [stream_begin, stream_begin +
    stream_count) of the flattened stream axis (stream_count None: through the last stream);
    the inputs are not modified.

    Shapes as in hisparse_jax.resolve: hot [L, *S, B, *rec], slot_record and lru
    [L, *S, B], host_pool [L, *S, R, *rec], selection [*S, k], sealed [*S].
    A layer outside [0, L) resolves nothing: state untouched, slots -1, every
    non-padding id invalid, malformed 0. A stream whose state is malformed
    resolves nothing either (see resolve_stream). k = 0 is an ordinary call.
    A stream outside the range is skipped: its state and inputs are never looked at, and its
    outputs keep what padding gives (slots and miss plan -1, misses, invalid, malformed 0).
    """
    hot, slot_record, lru = np.array(hot), np.array(slot_record), np.array(lru)
    host_pool, selection, sealed = np.asarray(host_pool), np.asarray(selection), np.asarray(sealed)
    L = host_pool.shape[0]
    streams = selection.shape[:-1]
    k = selection.shape[-1]
    S = int(np.prod(streams, dtype=np.int64))
    B = slot_record.shape[-1]
    R = host_pool.shape[1 + len(streams)]

    sel = selection.reshape(S, k)
    sealed_flat = sealed.reshape(S)
    slots = np.full((S, k), -1, np.int32)
    miss_records = np.full((S, k), -1, np.int32)
    miss_slots = np.full((S, k), -1, np.int32)
    misses = np.zeros(S, np.int32)
    invalid = np.zeros(S, np.int32)
    malformed = np.zeros(S, np.int32)

    begin = int(stream_begin)
    end = S if stream_count is None else begin + int(stream_count)
    in_range = range(begin, end)
    layer = int(layer)
    if not 0 <= layer < L:
        for s in in_range:
            invalid[s] = sum(1 for record in sel[s] if record != -1)
    else:
        hot_bytes = as_bytes(hot, 2 + len(streams)).reshape(L, S, B, -1)
        pool_bytes = as_bytes(host_pool, 2 + len(streams)).reshape(L, S, R, -1)
        rec = slot_record.reshape(L, S, B)
        order = lru.reshape(L, S, B)
        for s in in_range:
            out = resolve_stream(sel[s], sealed_flat[s], rec[layer, s], order[layer, s], R)
            slots[s] = out.slots
            miss_records[s] = out.miss_records
            miss_slots[s] = out.miss_slots
            misses[s] = out.misses
            invalid[s] = out.invalid
            malformed[s] = out.malformed
            rec[layer, s] = out.slot_record
            order[layer, s] = out.lru
            if fetch:  # rule 5: hot[slot] = host_pool[record], byte for byte
                for m in range(out.misses):
                    hot_bytes[layer, s, out.miss_slots[m]] = pool_bytes[layer, s, out.miss_records[m]]

    return Resolved(
        slots=slots.reshape(*streams, k),
        miss_records=miss_records.reshape(*streams, k),
        miss_slots=miss_slots.reshape(*streams, k),
        misses=misses.reshape(streams),
        invalid=invalid.reshape(streams),
        malformed=malformed.reshape(streams),
        hot=hot,
        slot_record=slot_record,
        lru=lru,
    )


def pool_write(host_pool, records, start, count) -> np.ndarray:
    """host_pool[l, s, start[s] + i] = records[l, s, i] for i < count[s], every layer l.

    Rows that land outside [0, R) (or past the n rows given) are not written.
    Returns a new pool; the input is not modified.
    """
    host_pool, records = np.array(host_pool), np.asarray(records)
    start, count = np.asarray(start), np.asarray(count)
    streams = start.shape
    ns = len(streams)
    L, R, n = host_pool.shape[0], host_pool.shape[1 + ns], records.shape[1 + ns]
    S = int(np.prod(streams, dtype=np.int64))
    pool_bytes = as_bytes(host_pool, 2 + ns).reshape(L, S, R, -1)
    record_bytes = as_bytes(records, 2 + ns).reshape(L, S, n, -1)
    start, count = start.reshape(S), count.reshape(S)
    for layer in range(L):
        for s in range(S):
            for i in range(min(max(int(count[s]), 0), n)):
                row = int(start[s]) + i
                if 0 <= row < R:
                    pool_bytes[layer, s, row] = record_bytes[layer, s, i]
    return host_pool

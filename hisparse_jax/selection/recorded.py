"""Recorded selection traces: the ids a model's indexer selected, per step, layer and stream, in a
compact file.

A trace holds, for `steps` decode steps, `layers` selecting layers and `streams` streams, the k
record ids each selection named (ascending, -1 padding at the end: what top-k returns) and the
records sealed when it was made. `generate(..., record_selection=True)` returns such ids;
`python -m hisparse_jax.train record` writes them for the trained model (docs/training.md), and
`hisparse-bench policies` and `hisparse-bench decode --selection recorded` replay them.

The file (`.npz`, version 1) stores each (layer, stream) sequence of selections as the set of ids
that changed from the step before (S_t xor S_t-1: the ids added and the ids dropped), their gaps
as LEB128 varints, and zlib over the whole stream. A trained indexer keeps most of its selection
from one step to the next, so a step costs a few hundred bytes instead of 4 k.

A kit indexer with a record kind of its own (kit.RecordKind: the two-level indexer's fine keys)
also fetches ids of its own records every step. The trace carries those as a second trace of the
same steps and streams (`RecordedTrace.index`), stored the same way in the members
`index_counts`, `index_sealed` and `index_payload`, its shape in the header's `index` object. The
members are optional: a file without them is still version 1 and byte for byte what it was, and
a reader that does not know them ignores them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..npz_files import NpzFile

FORMAT = "hisparse-selection-trace"
VERSION = 1


def _ids_axis(axis: int, doc: str) -> property:
    """A read-only property: the length of one axis of a trace's ids."""
    return property(lambda self: self.ids.shape[axis], doc=doc)


@dataclasses.dataclass(frozen=True)
class RecordedTrace:
    """Selections of `layers` selecting layers over `streams` streams at `steps` decode steps.

    Attributes:
      ids: [steps, layers, streams, k] int32; per row the distinct selected ids ascending, then
        -1 padding (rows hold fewer than k ids while fewer than k records are sealed).
      sealed: [steps, streams] int32, records sealed at that step: every id lies in [0, sealed).
      page_size: tokens per record.
      source: provenance, JSON-able (model, data, documents, the command that recorded it).
      index: the ids of the indexer's own records (kit.RecordKind) each selecting group fetched
        at the same steps, as a trace of their own: ids [steps, groups, streams, fetch], sealed
        the kind's sealed records, page_size its page, source its shape (record_bytes, ...);
        None (the default) for an indexer without a record kind. It has no index itself.
    """

    ids: np.ndarray
    sealed: np.ndarray
    page_size: int = 1
    source: dict = dataclasses.field(default_factory=dict)
    index: RecordedTrace | None = None

    def __post_init__(self):
        ids = np.asarray(self.ids)
        sealed = np.asarray(self.sealed)
        if ids.ndim != 4 or ids.dtype != np.int32:
            raise ValueError(f"RecordedTrace.ids must be int32 [steps, layers, streams, k], got {ids.dtype} "
                             f"{list(ids.shape)}")
        steps, _, streams, k = ids.shape
        if min(ids.shape) < 1:
            raise ValueError(f"RecordedTrace.ids must have no empty dimension, got shape {list(ids.shape)}")
        if sealed.shape != (steps, streams) or not np.issubdtype(sealed.dtype, np.integer):
            raise ValueError(f"RecordedTrace.sealed must be integer [steps, streams] = [{steps}, {streams}], got "
                             f"{sealed.dtype} {list(sealed.shape)}")
        if sealed.size and (sealed.min() < 0 or sealed.max() > 2**31 - 1):  # before the cast below
            bad = int(sealed.min()) if sealed.min() < 0 else int(sealed.max())
            raise ValueError(f"RecordedTrace.sealed holds {bad}, outside [0, 2^31): sealed counts are int32")
        if not isinstance(self.page_size, (int, np.integer)) or self.page_size < 1:
            raise ValueError(f"RecordedTrace.page_size must be a positive int, got {self.page_size!r}")
        _check_rows(ids, sealed.astype(np.int32))
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "sealed", sealed.astype(np.int32))
        json.dumps(self.source)  # raises on a source that cannot be stored
        if self.index is not None:
            if not isinstance(self.index, RecordedTrace) or self.index.index is not None:
                raise ValueError("RecordedTrace.index must be a RecordedTrace without an index of its own, got "
                                 f"{type(self.index).__name__}")
            if (self.index.steps, self.index.streams) != (steps, streams):
                raise ValueError(f"RecordedTrace.index has {self.index.steps} steps x {self.index.streams} streams; "
                                 f"it must match the trace's {steps} x {streams}")

    # The four axes of ids, by name.
    steps = _ids_axis(0, "Decode steps.")
    layers = _ids_axis(1, "Selecting layers.")
    streams = _ids_axis(2, "Streams.")
    k = _ids_axis(3, "Ids per selection (-1 padding included).")

    @property
    def num_records(self) -> int:
        """Record ids the trace ranges over: the most records ever sealed."""
        return int(self.sealed.max())


def _check_rows(ids: np.ndarray, sealed: np.ndarray) -> None:
    """Every row ascending and distinct, -1 only at the end, below its stream's sealed count."""
    valid = ids >= 0
    if np.any(ids < -1):
        raise ValueError("RecordedTrace.ids: ids must be >= 0 or -1 (padding)")
    if np.any(valid[..., 1:] & ~valid[..., :-1]):
        raise ValueError("RecordedTrace.ids: -1 padding must come after every id of a row")
    if np.any(valid[..., 1:] & (ids[..., 1:] <= ids[..., :-1])):
        raise ValueError("RecordedTrace.ids: a row's ids must be distinct and ascending (top-k order)")
    if np.any(valid & (ids >= sealed[:, None, :, None])):
        raise ValueError("RecordedTrace.ids: an id is not below its stream's sealed count at that step")


# --------------------------------------------------------------------------- varints


def varint_encode(values: np.ndarray) -> bytes:
    """Non-negative ints < 2**35 -> LEB128 bytes (7 bits per byte, high bit = more bytes follow)."""
    v = values.astype(np.uint64)
    nbytes = np.ones(v.shape, np.int64)
    for shift in (7, 14, 21, 28):
        nbytes += v >= (1 << shift)
    out = np.empty(int(nbytes.sum()), np.uint8)
    starts = np.concatenate([[0], np.cumsum(nbytes)[:-1]])
    for j in range(5):
        has = nbytes > j
        byte = (v[has] >> np.uint64(7 * j)) & np.uint64(0x7F)
        more = (nbytes[has] > j + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + j] = (byte | more).astype(np.uint8)
    return out.tobytes()


def varint_decode(data: bytes) -> np.ndarray:
    """LEB128 bytes (varint_encode) -> the non-negative ints they hold, int64."""
    b = np.frombuffer(data, np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    last = (b & 0x80) == 0
    if not last[-1]:
        raise ValueError("recorded trace: truncated payload")
    ends = np.flatnonzero(last)
    starts = np.concatenate([[0], ends[:-1] + 1])
    which = np.repeat(np.arange(ends.size), ends - starts + 1)
    position = np.arange(b.size) - starts[which]
    if position.max() > 4:
        raise ValueError("recorded trace: corrupt payload (a varint longer than 5 bytes)")
    parts = (b & 0x7F).astype(np.int64) << (7 * position)
    return np.bincount(which, weights=parts, minlength=ends.size).astype(np.int64)


# --------------------------------------------------------------------------- file


def _presence(ids_t: np.ndarray, width: int) -> np.ndarray:
    """ids [rows, k] (-1 padded) -> [rows, width] bool."""
    rows = ids_t.shape[0]
    mask = np.zeros((rows, width + 1), bool)
    r = np.repeat(np.arange(rows), ids_t.shape[1])
    mask[r, np.where(ids_t >= 0, ids_t, width).reshape(-1)] = True
    return mask[:, :width]


def encode(trace: RecordedTrace) -> tuple[np.ndarray, bytes]:
    """(toggled ids per step and row [steps, layers * streams] int64, the zlib'd varint gaps)."""
    width = max(trace.num_records, 1)
    rows = trace.layers * trace.streams
    before = np.zeros((rows, width), bool)
    counts = np.zeros((trace.steps, rows), np.int64)
    gaps = []
    for t in range(trace.steps):
        now = _presence(trace.ids[t].reshape(rows, trace.k), width)
        r, i = np.nonzero(now ^ before)  # row-major: sorted by row, then id
        counts[t] = np.bincount(r, minlength=rows)
        first = np.ones(r.size, bool)
        first[1:] = r[1:] != r[:-1]
        gaps.append(np.where(first, i, i - np.concatenate([[0], i[:-1]])))
        before = now
    payload = zlib.compress(varint_encode(np.concatenate(gaps)), 9)
    return counts, payload


# Ids and toggles one decode chunk handles at once: its scratch arrays (a few dozen bytes per
# entry) stay near 150 MiB whatever the file declares (measured: 16 MiB of ids, k = 2048, load
# with 200 MiB at its peak; 4M entries a chunk took 680 MiB and was slower), and the Python loop
# runs once per chunk of steps, never once per step and row (a 9 KB file can declare a million).
_CHUNK = 1 << 20
_RADIX_KEYS = 1 << 16  # (step, row) keys a chunk may have to be sorted as uint16 (a radix sort)


class _Varints:
    """The payload's varints, inflated and decoded a chunk at a time: memory follows what a chunk
    needs, never what the zlib stream expands to (a few bytes of zlib can expand to gigabytes)."""

    def __init__(self, payload: bytes, limit: int):
        self._zlib, self._input, self._limit = zlib.decompressobj(), payload, limit
        self._buffer, self._inflated = b"", 0

    def _more(self, want: int) -> bool:
        try:
            chunk = self._zlib.decompress(self._input, max(want, 1 << 16))
        except zlib.error as err:
            raise ValueError(f"corrupt payload ({err})") from None
        self._input = self._zlib.unconsumed_tail
        self._inflated += len(chunk)
        if self._inflated > self._limit:
            raise ValueError(f"corrupt payload (it expands past the {self._limit} bytes its counts allow)")
        self._buffer += chunk
        return bool(chunk)

    def take(self, n: int) -> np.ndarray:
        """The next n varints, int64."""
        while True:
            ends = np.flatnonzero(np.frombuffer(self._buffer, np.uint8) < 0x80)
            if ends.size >= n:
                break
            if not self._more(n - ends.size):
                raise ValueError("truncated payload (fewer ids than its counts say)")
        cut = int(ends[n - 1]) + 1 if n else 0
        values, self._buffer = varint_decode(self._buffer[:cut]), self._buffer[cut:]
        return values

    def finish(self) -> None:
        """Every byte of the stream was an id the counts asked for, and the stream is complete."""
        if self._buffer or self._more(1):
            raise ValueError("corrupt payload (it holds more ids than its counts say)")
        if not self._zlib.eof or self._zlib.unused_data:
            raise ValueError("truncated payload" if not self._zlib.eof else "corrupt payload (bytes after its end)")


def _toggled_ids(counts: np.ndarray, gaps: np.ndarray, width: int) -> np.ndarray:
    """The ids the gaps of `counts` (flat, one count per (step, row) group) encode, int64."""
    if gaps.size and gaps.max() >= width:  # every gap is at most the id it ends at, and ids < width
        raise ValueError(f"corrupt payload (an id outside the {width} records)")
    groups = counts[counts > 0]
    first = np.zeros(gaps.size, bool)
    first[np.cumsum(groups) - groups] = True
    if np.any(~first & (gaps < 1)):
        raise ValueError("corrupt payload (a row's toggled ids repeat)")
    total = np.cumsum(gaps)  # < gaps.size * width <= 2^53: no overflow
    ids = total - np.repeat(total[first] - gaps[first], groups)
    if ids.size and ids.max() >= width:
        raise ValueError(f"corrupt payload (an id outside the {width} records)")
    return ids


def _sorted(a: np.ndarray, a_end: int, b: np.ndarray, b_end: int, c: np.ndarray, c_end: int):
    """(a, b, c) sorted by a, then b, then c (non-negative ints below a_end, b_end, c_end, each
    triple distinct): as one int64 key where it fits (a sort of values is several times faster
    than np.lexsort's sort of indices), by np.lexsort where it does not."""
    if a_end * b_end * c_end < 2**62:
        key = np.sort((a * b_end + b) * c_end + c)
        ab, c = np.divmod(key, c_end)
        a, b = np.divmod(ab, b_end)
        return a, b, c
    order = np.lexsort((c, b, a))
    return a[order], b[order], c[order]


def decode(counts: np.ndarray, payload: bytes, steps: int, layers: int, streams: int, k: int,
           width: int) -> np.ndarray:
    """The inverse of `encode`: ids [steps, layers, streams, k] int32.

    Vectorized over chunks of steps: an id toggled on at step a and off at step b (or never)
    is held in [a, b); each chunk starts from the ids held before it (as toggles at its first
    step), pairs every (row, id)'s toggles into such intervals and writes the ids of each
    (step, row) ascending. Time and memory follow the ids and toggles, not the declared width."""
    rows = layers * streams
    total = int(counts.sum())
    varints = _Varints(payload, 5 * total)  # a varint is at most 5 bytes
    ids = np.full((steps, rows, k), -1, np.int32)
    per_step = counts.sum(axis=1)
    held_rows, held_ids = np.zeros(0, np.int64), np.zeros(0, np.int64)  # (row, id) held, sorted
    t0 = 0
    while t0 < steps:
        # a chunk: at least one step, at most _CHUNK ids out and toggles in
        room = max(1, _CHUNK // (rows * k))
        t1 = min(steps, t0 + room)
        toggles = np.cumsum(per_step[t0:t1])
        t1 = t0 + max(1, int(np.searchsorted(toggles, _CHUNK, side="right")))
        chunk_counts = counts[t0:t1].reshape(-1)
        toggled = _toggled_ids(chunk_counts, varints.take(int(chunk_counts.sum())), width)
        group = np.repeat(np.arange(chunk_counts.size), chunk_counts)
        # by row, then id, then step (the held ids before the first step's toggles)
        r, i, t = _sorted(np.concatenate([held_rows, group % rows]), rows, np.concatenate([held_ids, toggled]), width,
                          np.concatenate([np.zeros(held_rows.size, np.int64), 1 + group // rows]), t1 - t0 + 1)
        t = np.maximum(t - 1, 0) + t0
        key = r * width + i
        start = np.ones(key.size, bool)
        start[1:] = key[1:] != key[:-1]
        # the held ids and a step's toggles are distinct, so a (row, id)'s toggles alternate on, off
        parity = (np.arange(key.size) - np.maximum.accumulate(np.where(start, np.arange(key.size), 0))) % 2
        on = parity == 0
        nxt = np.append(~start[1:], False)  # its off toggle follows in the same (row, id)
        t_off = np.where(nxt, np.append(t[1:], 0), t1)[on]
        t_on, r_on, i_on = t[on], r[on], i[on]
        # ids held per (step, row) in the chunk: at most k
        span = t1 - t0
        size = np.cumsum(np.bincount((t_on - t0) * rows + r_on, minlength=(span + 1) * rows).reshape(span + 1, rows)
                         - np.bincount((t_off - t0) * rows + r_on, minlength=(span + 1) * rows).reshape(span + 1, rows),
                         axis=0)[:span]
        if size.max(initial=0) > k:
            raise ValueError(f"corrupt payload (a selection of more than k={k} ids)")
        # every (step, row, id) held, ordered by step and row, ids ascending
        n = t_off - t_on
        step = np.repeat(t_on - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
        where, held = (step - t0) * rows + np.repeat(r_on, n), np.repeat(i_on, n)
        if span * rows <= _RADIX_KEYS:
            # The intervals come by row then id, so a stable sort by (step, row) leaves each row's
            # ids ascending; on 16-bit keys numpy's stable sort is a radix sort, linear.
            order = np.argsort(where.astype(np.uint16), kind="stable")
            where, held = where[order], held[order]
        else:
            _, where, held = _sorted(np.zeros(where.size, np.int64), 1, where, span * rows, held, width)
        first = np.cumsum(size.reshape(-1)) - size.reshape(-1)
        position = np.arange(where.size) - first[where]
        ids[t0:t1].reshape(-1)[where * k + position] = held
        still = t_off == t1  # held past the chunk: the next chunk starts from them
        held_rows, held_ids = r_on[still], i_on[still]
        t0 = t1
    varints.finish()
    return ids.reshape(steps, layers, streams, k)


def _members(trace: RecordedTrace, prefix: str = "") -> tuple[dict, dict]:
    """(the header fields of one trace's ids, its arrays under `prefix`)."""
    counts, payload = encode(trace)
    count_dtype = np.uint16 if counts.max(initial=0) < 2**16 else np.uint32
    fields = dict(layers=trace.layers, k=trace.k, page_size=int(trace.page_size), width=max(trace.num_records, 1))
    arrays = {f"{prefix}counts": counts.astype(count_dtype), f"{prefix}sealed": trace.sealed,
              f"{prefix}payload": np.frombuffer(payload, np.uint8)}
    return fields, arrays


def save_trace(path: str | Path, trace: RecordedTrace) -> int:
    """Writes `trace` to `path` (.npz); returns the file's bytes."""
    fields, arrays = _members(trace)
    # The fields in the order files have always had them: a trace without an index is the same bytes.
    header = dict(format=FORMAT, version=VERSION, steps=trace.steps, layers=fields["layers"], streams=trace.streams,
                  k=fields["k"], page_size=fields["page_size"], width=fields["width"], source=trace.source)
    if trace.index is not None:
        index_fields, index_arrays = _members(trace.index, INDEX_PREFIX)
        header["index"] = dict(**index_fields, source=trace.index.source)
        arrays.update(index_arrays)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    Path(path).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


# Bounds a trace file must respect before anything is allocated for it.
MAX_TRACE_BYTES = 4 << 30  # the memory loading it takes (_loading_bytes); load_trace(max_bytes=)
MAX_K = 1 << 16  # ids per selection (top-k sizes in use are up to 8192)
INDEX_PREFIX = "index_"  # the members of the index's ids (RecordedTrace.index)
_INT32_MAX = 2**31 - 1


def _header_int(f: NpzFile, header: dict, name: str, low: int, high: int) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        f.fail(f"its header's {name} is {value!r}, expected an int in [{low}, {high}]")
    return value


def _part(f: NpzFile, header: dict, label: str) -> tuple[int, int, int, int]:
    """(layers, k, width, page_size) of one trace's ids in the header, each range-checked."""
    L = _header_int(f, header, label + "layers", 1, _INT32_MAX)
    k = _header_int(f, header, label + "k", 1, MAX_K)
    width = _header_int(f, header, label + "width", 1, _INT32_MAX)
    page_size = _header_int(f, header, label + "page_size", 1, _INT32_MAX)
    return L, k, width, page_size


def _loading_bytes(s: int, S: int, part: tuple[int, int, int, int]) -> int:
    """Memory loading one trace's ids takes at its peak, from the header alone: the decoded ids
    (int32) and as much again for the checks' temporaries, the per-(step, row) counts as stored (up
    to 8 bytes) and widened to int64, the per-(step, stream) sealed counts as stored and as int32.
    A trace of few ids a row is counts more than ids (k = 1: 24 bytes a row for 4 of ids)."""
    L, k, _, _ = part
    return s * L * S * (k * 8 + 16) + s * S * 12


def _read_ids(f: NpzFile, s: int, S: int, part: tuple[int, int, int, int], prefix: str, what: str):
    """(ids [s, L, S, k] int32, sealed [s, S] int32) of one trace's members under `prefix`,
    every integer range-checked before it is cast."""
    L, k, width, _ = part
    rows = L * S
    counts = f.array(prefix + "counts", max_bytes=s * rows * 8, kinds="iu")
    sealed = f.array(prefix + "sealed", max_bytes=s * S * 8, kinds="iu")
    if counts.shape != (s, rows) or sealed.shape != (s, S):
        f.fail(f"{what}counts {list(counts.shape)} and sealed {list(sealed.shape)} do not match the header's "
               f"[steps, layers x streams] = [{s}, {rows}] and [steps, streams] = [{s}, {S}]")
    if counts.size and (counts.min() < 0 or counts.max() > 2 * k):
        f.fail(f"{what}a step toggles {int(counts.max())} ids of a row; at most 2 k = {2 * k} can change")
    if sealed.min() < 0 or sealed.max() > _INT32_MAX:
        f.fail(f"{what}sealed holds {int(sealed.min()) if sealed.min() < 0 else int(sealed.max())}, "
               "outside [0, 2^31)")
    if width != max(int(sealed.max()), 1):
        f.fail(f"{what}its header's width {width} is not the most records sealed ({int(sealed.max())})")
    total = int(counts.sum(dtype=np.int64))
    payload = f.array(prefix + "payload", max_bytes=5 * total + total // 100 + 1024, kinds="u").tobytes()
    try:
        return decode(counts.astype(np.int64), payload, s, L, S, k, width), sealed.astype(np.int32)
    except (ValueError, TypeError) as err:
        f.fail(what + str(err))


def load_trace(path: str | Path, *, max_bytes: int = MAX_TRACE_BYTES) -> RecordedTrace:
    """Reads a trace `save_trace` wrote. Whatever the bytes (truncated, tampered, empty, another
    kind of file, a declared shape too large for `max_bytes` of decoded ids, the index's ids
    included), the error is one ValueError naming the file, raised before the memory a bad
    header asks for is allocated."""
    with NpzFile(path, "recorded trace") as f:
        header: dict[str, Any] = f.json("header", max_bytes=1 << 20)
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            f.fail(f"format {header.get('format')!r} version {header.get('version')!r}, expected {FORMAT!r} "
                   f"version {VERSION}")
        if not isinstance(header.get("source", {}), dict):
            f.fail(f"its header's source is {type(header['source']).__name__}, expected an object")
        s, S = (_header_int(f, header, n, 1, _INT32_MAX) for n in ("steps", "streams"))
        part = _part(f, header, "")
        index = header.get("index")
        if index is not None and not isinstance(index, dict):
            f.fail(f"its header's index is {type(index).__name__}, expected an object")
        if index is not None and not isinstance(index.get("source", {}), dict):
            f.fail(f"its header's index.source is {type(index['source']).__name__}, expected an object")
        index_part = None if index is None else _part(f, {f"index.{n}": v for n, v in index.items()}, "index.")
        needed = sum(_loading_bytes(s, S, p) for p in (part, index_part) if p is not None)
        if needed > max_bytes:
            shown = " + ".join(f"{s} steps x {p[0]} layers x {S} streams x k = {p[1]}"
                               for p in (part, index_part) if p is not None)
            f.fail(f"{shown} ids would take {needed / 2**30:.1f} GiB to load (decoded ids, their checks, counts "
                   f"and sealed), more than max_bytes = {max_bytes / 2**30:.1f} GiB")
        ids, sealed = _read_ids(f, s, S, part, "", "")
        index_trace = None
        if index_part is not None:
            index_ids, index_sealed = _read_ids(f, s, S, index_part, INDEX_PREFIX, "its index: ")
            try:
                index_trace = RecordedTrace(ids=index_ids, sealed=index_sealed, page_size=index_part[3],
                                            source=index.get("source", {}))
            except (ValueError, TypeError) as err:
                f.fail(f"its index: {err}")
        try:
            return RecordedTrace(ids=ids, sealed=sealed, page_size=part[3], source=header.get("source", {}),
                                 index=index_trace)
        except (ValueError, TypeError) as err:
            f.fail(str(err))

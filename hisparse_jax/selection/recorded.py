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
"""

from __future__ import annotations

import dataclasses
import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

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
    """

    ids: np.ndarray
    sealed: np.ndarray
    page_size: int = 1
    source: dict = dataclasses.field(default_factory=dict)

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
        if not isinstance(self.page_size, (int, np.integer)) or self.page_size < 1:
            raise ValueError(f"RecordedTrace.page_size must be a positive int, got {self.page_size!r}")
        _check_rows(ids, sealed.astype(np.int32))
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "sealed", sealed.astype(np.int32))
        json.dumps(self.source)  # raises on a source that cannot be stored

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


def decode(counts: np.ndarray, payload: bytes, steps: int, layers: int, streams: int, k: int,
           width: int) -> np.ndarray:
    """The inverse of `encode`: ids [steps, layers, streams, k] int32."""
    rows = layers * streams
    gaps = varint_decode(zlib.decompress(payload))
    if gaps.size != counts.sum():
        raise ValueError(f"recorded trace: corrupt payload ({gaps.size} ids, the counts say {counts.sum()})")
    ids = np.full((steps, rows, k), -1, np.int32)
    present = np.zeros((rows, width), bool)
    offset = 0
    for t in range(steps):
        n = int(counts[t].sum())
        g = gaps[offset : offset + n]
        offset += n
        if n:
            r = np.repeat(np.arange(rows), counts[t])
            starts = np.concatenate([[0], np.cumsum(counts[t])[:-1]])
            total = np.cumsum(g)  # gaps restart at each row: subtract the sum before the row
            before_row = np.where(starts > 0, total[np.clip(starts - 1, 0, n - 1)], 0)
            i = total - np.repeat(before_row, counts[t])
            if i.min() < 0 or i.max() >= width:
                raise ValueError("recorded trace: corrupt payload (an id outside the records)")
            present[r, i] ^= True
        rr, ii = np.nonzero(present)
        held = np.bincount(rr, minlength=rows)
        if held.max(initial=0) > k:
            raise ValueError(f"recorded trace: corrupt payload (a selection of more than k={k} ids)")
        row_start = np.concatenate([[0], np.cumsum(held)[:-1]])
        ids[t, rr, np.arange(rr.size) - row_start[rr]] = ii
    return ids.reshape(steps, layers, streams, k)


def save_trace(path: str | Path, trace: RecordedTrace) -> int:
    """Writes `trace` to `path` (.npz); returns the file's bytes."""
    counts, payload = encode(trace)
    header = dict(format=FORMAT, version=VERSION, steps=trace.steps, layers=trace.layers, streams=trace.streams,
                  k=trace.k, page_size=int(trace.page_size), width=max(trace.num_records, 1), source=trace.source)
    count_dtype = np.uint16 if counts.max(initial=0) < 2**16 else np.uint32
    buffer = io.BytesIO()
    np.savez_compressed(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8),
                        counts=counts.astype(count_dtype), sealed=trace.sealed,
                        payload=np.frombuffer(payload, np.uint8))
    Path(path).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def load_trace(path: str | Path) -> RecordedTrace:
    """Reads a trace `save_trace` wrote; a file of another kind is a one-line ValueError."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"recorded trace {str(path)!r}: no such file")
    try:
        with np.load(path, allow_pickle=False) as f:
            header: dict[str, Any] = json.loads(f["header"].tobytes().decode())
            counts, sealed, payload = f["counts"].astype(np.int64), f["sealed"], f["payload"].tobytes()
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        raise ValueError(f"recorded trace {str(path)!r}: not a selection trace file ({err})") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"recorded trace {str(path)!r}: format {header.get('format')!r} version "
                         f"{header.get('version')!r}, expected {FORMAT!r} version {VERSION}")
    s, L, S, k = (int(header[n]) for n in ("steps", "layers", "streams", "k"))
    ids = decode(counts.reshape(s, L * S), payload, s, L, S, k, int(header["width"]))
    return RecordedTrace(ids=ids, sealed=sealed, page_size=int(header["page_size"]), source=header["source"])

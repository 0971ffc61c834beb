"""Recorded selection traces (hisparse_jax.selection.recorded): the file round-trips every trace exactly,
and malformed traces or files are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hisparse_jax.selection import synthetic
from hisparse_jax.selection import recorded
from hisparse_jax.selection.recorded import RecordedTrace, varint_decode, varint_encode, load_trace, save_trace


def random_trace(rng, steps, layers, streams, k, first_sealed) -> RecordedTrace:
    """Rows of distinct ascending ids below a growing sealed count, some of them short (padding)."""
    sealed = (first_sealed + np.arange(steps))[:, None].repeat(streams, 1).astype(np.int32)
    ids = np.full((steps, layers, streams, k), -1, np.int32)
    for t in range(steps):
        for l in range(layers):
            for s in range(streams):
                n = int(rng.integers(0, min(k, sealed[t, s]) + 1))
                ids[t, l, s, :n] = np.sort(rng.choice(sealed[t, s], n, replace=False))
    return RecordedTrace(ids=ids, sealed=sealed, page_size=2, source=dict(kind="test", seed=1))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 6), layers=st.integers(1, 3), streams=st.integers(1, 3),
       k=st.integers(1, 9), first_sealed=st.integers(0, 40))
def test_file_round_trips_random_traces(tmp_path_factory, seed, steps, layers, streams, k, first_sealed):
    trace = random_trace(np.random.default_rng(seed), steps, layers, streams, k, first_sealed)
    path = tmp_path_factory.mktemp("t") / "trace.npz"
    save_trace(path, trace)
    back = load_trace(path)
    assert np.array_equal(back.ids, trace.ids) and np.array_equal(back.sealed, trace.sealed)
    assert back.page_size == 2 and back.source == trace.source


def test_a_synthetic_trace_round_trips_and_is_compact(tmp_path):
    ids = np.asarray(synthetic.selections(synthetic.TraceConfig.calibration("glm-5.1"), 3, (2,), 4096, 256,
                                       np.full((2,), 4000, np.int32), 40))
    trace = RecordedTrace(ids=ids, sealed=(4000 + np.arange(40))[:, None].repeat(2, 1))
    size = save_trace(tmp_path / "t.npz", trace)
    assert np.array_equal(load_trace(tmp_path / "t.npz").ids, ids)
    assert size < ids.nbytes / 4  # a calibrated trace keeps most ids from step to step


def test_varints_round_trip_up_to_35_bits():
    values = np.array([0, 1, 127, 128, 16383, 16384, 2**28 - 1, 2**28, 2**35 - 1], np.int64)
    assert np.array_equal(varint_decode(varint_encode(values)), values)


@pytest.mark.parametrize("ids, sealed, message", [
    (np.zeros((2, 1, 1, 3), np.int64), np.full((2, 1), 9), "must be int32"),
    (np.array([[[[2, 1, -1]]]], np.int32), np.full((1, 1), 9), "distinct and ascending"),
    (np.array([[[[1, 1, -1]]]], np.int32), np.full((1, 1), 9), "distinct and ascending"),
    (np.array([[[[-1, 1, 2]]]], np.int32), np.full((1, 1), 9), "padding must come after"),
    (np.array([[[[1, 9, -1]]]], np.int32), np.full((1, 1), 9), "not below its stream's sealed"),
    (np.array([[[[-2, 1, 2]]]], np.int32), np.full((1, 1), 9), ">= 0 or -1"),
    (np.array([[[[1, 2, 3]]]], np.int32), np.full((2, 1), 9), "sealed must be integer"),
])
def test_malformed_traces_are_refused(ids, sealed, message):
    with pytest.raises(ValueError, match=message):
        RecordedTrace(ids=ids, sealed=sealed)


def test_other_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_trace(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not a trace")
    with pytest.raises(ValueError, match="not a .npz archive"):
        load_trace(tmp_path / "text.npz")
    np.savez(tmp_path / "other.npz", header=np.frombuffer(b'{"format": "x", "version": 1}', np.uint8),
             counts=np.zeros(1), sealed=np.zeros(1), payload=np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="expected 'hisparse-selection-trace'"):
        load_trace(tmp_path / "other.npz")


def _persistent_trace(rng, steps, rows, k, records) -> RecordedTrace:
    """Selections that keep most of their ids from one step to the next (as a trained indexer's
    do), so ids stay held across many steps and across the decoder's chunks."""
    ids = np.full((steps, 1, rows, k), -1, np.int32)
    held = [set() for _ in range(rows)]
    for t in range(steps):
        for r in range(rows):
            keep = {i for i in held[r] if rng.random() < 0.8}
            extra = rng.choice(records, size=int(rng.integers(0, k + 1)), replace=False)
            held[r] = set(sorted(keep | set(extra.tolist()))[:k])
            ids[t, 0, r, : len(held[r])] = sorted(held[r])
    return RecordedTrace(ids=ids, sealed=np.full((steps, rows), records, np.int32))


@pytest.mark.parametrize("radix", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 22])
def test_the_decoder_gives_the_same_ids_whatever_its_chunk(tmp_path, monkeypatch, chunk, radix):
    """The decoder works a chunk of steps at a time, carrying the held ids from one chunk into the
    next; chunk 1 puts every step in its own chunk, 1 << 22 (the default) the whole trace in one.
    Without radix: the sort a chunk with more than 2^16 (step, row) keys takes."""
    monkeypatch.setattr(recorded, "_CHUNK", chunk)
    monkeypatch.setattr(recorded, "_RADIX_KEYS", 1 << 16 if radix else 0)
    trace = _persistent_trace(np.random.default_rng(chunk), 30, 3, 6, 20)
    save_trace(tmp_path / "t.npz", trace)
    assert np.array_equal(load_trace(tmp_path / "t.npz").ids, trace.ids)

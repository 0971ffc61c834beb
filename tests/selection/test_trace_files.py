"""A selection trace file from untrusted bytes (hisparse_jax.selection.recorded.load_trace): whatever
is wrong with it is one ValueError line naming the file, raised fast and before the memory a
bad header asks for is allocated."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
import time
import zipfile
import zlib

import numpy as np
import pytest

from hisparse_jax.selection.recorded import MAX_K, RecordedTrace, load_trace, save_trace


def _trace(steps=3, layers=2, streams=2, k=4) -> RecordedTrace:
    sealed = (10 + np.arange(steps))[:, None].repeat(streams, 1).astype(np.int32)
    ids = np.full((steps, layers, streams, k), -1, np.int32)
    ids[..., :3] = [1, 4, 7]
    return RecordedTrace(ids=ids, sealed=sealed, source=dict(kind="test"))


def _members(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {n: f[n] for n in f.files}


def _write(path, members: dict, header_changes: dict | None = None):
    """An archive like save_trace's, with members or header fields replaced."""
    header = json.loads(members["header"].tobytes())
    header.update(header_changes or {})
    members = {**members, "header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
    np.savez_compressed(path, **members)


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.npz"
    save_trace(path, _trace())
    return path


def _refused(path, needle: str) -> str:
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        load_trace(path)
    message = str(err.value)
    assert needle in message, message
    assert "\n" not in message and str(path) in message, message
    assert time.perf_counter() - start < 5, "a bad file must be refused fast"
    return message


def test_the_good_file_loads(good):
    assert np.array_equal(load_trace(good).ids, _trace().ids)


def test_truncated_empty_random_and_a_directory(tmp_path, good):
    data = good.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    _refused(tmp_path / "truncated.npz", "not a .npz archive")
    (tmp_path / "empty.npz").write_bytes(b"")
    _refused(tmp_path / "empty.npz", "not a .npz archive")
    (tmp_path / "random.npz").write_bytes(np.random.default_rng(0).bytes(5000))
    _refused(tmp_path / "random.npz", "not a .npz archive")
    (tmp_path / "folder.npz").mkdir()
    _refused(tmp_path / "folder.npz", "is a directory, not a file")
    _refused(tmp_path / "missing.npz", "no such file")


def test_a_tampered_member_is_damaged(tmp_path, good):
    """Bytes flipped inside a compressed member: zlib's error or the zip's CRC, either way one line."""
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("payload.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 5, start + info.compress_size - 2):
        data[i] ^= 0xFF
    (tmp_path / "tampered.npz").write_bytes(bytes(data))
    _refused(tmp_path / "tampered.npz", "'payload' array is damaged")


def test_an_object_array_is_refused_without_unpickling(tmp_path, good):
    members = _members(good)
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    path = tmp_path / "pickled.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, value in members.items():
            one = io.BytesIO()
            np.save(one, value)
            z.writestr(f"{name}.npy", one.getvalue() if name != "counts" else buffer.getvalue())
    _refused(path, "'counts' array holds object")


def test_a_payload_that_inflates_past_its_counts(tmp_path, good):
    """A zlib bomb: ~1 KB of zlib expanding to 1 MiB, where the counts allow 480 bytes of varints
    (a larger bomb is refused sooner, by the size of the payload member itself)."""
    members = _members(good)
    members["counts"] = np.full_like(members["counts"], 8)  # the most a row may toggle at k = 4
    bomb = zlib.compress(b"\x01" * (1 << 20), 9)
    assert len(bomb) < 5 * members["counts"].sum() + 1024
    members["payload"] = np.frombuffer(bomb, np.uint8)
    _write(tmp_path / "bomb.npz", members)
    _refused(tmp_path / "bomb.npz", "expands past")


def test_a_huge_payload_member_is_refused_by_its_size(tmp_path, good):
    members = _members(good)
    members["payload"] = np.frombuffer(zlib.compress(b"\x01" * (64 << 20), 9), np.uint8)
    _write(tmp_path / "big.npz", members)
    _refused(tmp_path / "big.npz", "'payload' array declares")


@pytest.mark.parametrize("changes, needle", [
    (dict(k=2**29), f"k is {2**29}, expected an int in [1, {MAX_K}]"),
    (dict(k=True), "k is True"),
    (dict(width=2**33), "width is 8589934592"),
    (dict(width=2**30), "width 1073741824 is not the most records sealed"),
    (dict(steps=2**20), "do not match the header"),
    (dict(steps=2**20, layers=2**10), "GiB to load (decoded ids, their checks, counts and sealed), more than max_bytes"),
    (dict(format="other"), "format 'other' version 1"),
    (dict(version=2), "version 2, expected"),
])
def test_a_header_declaring_what_the_file_is_not(tmp_path, good, changes, needle):
    _write(tmp_path / "bad.npz", _members(good), changes)
    _refused(tmp_path / "bad.npz", needle)


def test_a_member_declaring_a_huge_shape_is_not_allocated(tmp_path, good):
    members = _members(good)
    one = io.BytesIO()
    np.save(one, members["sealed"])
    raw = one.getvalue().replace(b"(3, 2)", b"(3, 2000000000000)".ljust(len(b"(3, 2)")))
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, value in members.items():
            buf = io.BytesIO()
            np.save(buf, value)
            z.writestr(f"{name}.npy", raw if name == "sealed" else buf.getvalue())
    _refused(path, "'sealed' array declares")


def test_sealed_outside_int32_is_refused_not_wrapped(tmp_path, good):
    members = _members(good)
    members["sealed"] = members["sealed"].astype(np.int64) + 2**32
    _write(tmp_path / "wide.npz", members)
    _refused(tmp_path / "wide.npz", "outside [0, 2^31)")
    with pytest.raises(ValueError, match="sealed holds 429496730[0-9], outside"):
        RecordedTrace(ids=_trace().ids, sealed=members["sealed"])


def test_a_small_file_declaring_a_million_rows_decodes_fast(tmp_path, good):
    """9 KB declaring 200,000 steps x 8 rows at k = 1 (id 0 toggled on and off at every step): the
    decoder works in chunks of steps, so the time follows the ids, not a Python loop per row
    and step (which took 13 s here)."""
    steps, rows = 200_000, 8
    members = _members(good)
    members.update(counts=np.ones((steps, rows), np.uint8), sealed=np.full((steps, rows), 10, np.int32),
                   payload=np.frombuffer(zlib.compress(b"\x00" * (steps * rows), 9), np.uint8))
    path = tmp_path / "rows.npz"
    _write(path, members, dict(steps=steps, layers=1, streams=rows, k=1, width=10))
    assert path.stat().st_size < 16_000
    start = time.perf_counter()
    ids = load_trace(path).ids
    assert time.perf_counter() - start < 5
    assert (ids[0::2] == 0).all() and (ids[1::2] == -1).all()


@pytest.mark.parametrize("raw, needle", [
    (b"[" * 100_000 + b"]" * 100_000, "its header is not JSON (RecursionError"),
    (b"\xff\xfe", "its header is not JSON (UnicodeDecodeError"),
    (b"[1, 2]", "its header is JSON list, expected an object"),
])
def test_a_header_that_is_not_a_json_object(tmp_path, good, raw, needle):
    members = {**_members(good), "header": np.frombuffer(raw, np.uint8)}
    np.savez_compressed(tmp_path / "bad.npz", **members)
    _refused(tmp_path / "bad.npz", needle)


def test_a_source_that_is_not_an_object(tmp_path, good):
    _write(tmp_path / "bad.npz", _members(good), dict(source="model"))
    _refused(tmp_path / "bad.npz", "its header's source is str, expected an object")


def test_a_payload_with_bytes_after_its_end(tmp_path, good):
    members = _members(good)
    members["payload"] = np.concatenate([members["payload"], np.frombuffer(b"tail", np.uint8)])
    _write(tmp_path / "tail.npz", members)
    _refused(tmp_path / "tail.npz", "bytes after its end")


def test_a_device_or_a_pipe_is_refused_without_reading(tmp_path):
    """/dev/zero never ends and opening a FIFO blocks until a writer comes: refused by their kind."""
    _refused("/dev/zero", "is not a regular file")
    os.mkfifo(tmp_path / "pipe.npz")
    _refused(tmp_path / "pipe.npz", "is not a regular file")


# --------------------------------------------------------------------------- the index's ids
# (RecordedTrace.index: the ids a kit indexer's own record kind fetched, in optional members)


def _indexed(steps=3, streams=2) -> RecordedTrace:
    sealed = (3 + np.arange(steps))[:, None].repeat(streams, 1).astype(np.int32)
    ids = np.full((steps, 1, streams, 2), -1, np.int32)
    ids[..., 0] = 0
    ids[1:, :, :, 1] = 3
    index = RecordedTrace(ids=ids, sealed=sealed, page_size=4, source=dict(kind="index-records", record_bytes=64))
    return dataclasses.replace(_trace(steps=steps, streams=streams), index=index)


@pytest.fixture
def indexed(tmp_path):
    path = tmp_path / "indexed.npz"
    save_trace(path, _indexed())
    return path


def test_a_trace_without_an_index_keeps_the_version_1_members(good):
    """Backward compatible: no index, no new member nor header field (the file of before)."""
    assert sorted(_members(good)) == ["counts", "header", "payload", "sealed"]
    header = json.loads(_members(good)["header"].tobytes())
    assert list(header) == ["format", "version", "steps", "layers", "streams", "k", "page_size", "width", "source"]
    assert load_trace(good).index is None


def test_the_index_round_trips(indexed):
    want, got = _indexed(), load_trace(indexed)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.sealed, want.sealed)
    assert np.array_equal(got.index.ids, want.index.ids) and np.array_equal(got.index.sealed, want.index.sealed)
    assert (got.index.page_size, got.index.source) == (4, want.index.source)
    assert sorted(_members(indexed)) == ["counts", "header", "index_counts", "index_payload", "index_sealed",
                                         "payload", "sealed"]


def _index_header(**changes) -> dict:
    """Header changes: the index object of _indexed's file with `changes`."""
    with tempfile.TemporaryDirectory() as folder:
        save_trace(f"{folder}/t.npz", _indexed())
        header = json.loads(_members(f"{folder}/t.npz")["header"].tobytes())
    return dict(index={**header["index"], **changes})


@pytest.mark.parametrize("changes, needle", [
    (dict(index="pages"), "its header's index is str, expected an object"),
    (dict(index=dict(layers=1, k=2, page_size=4, width=5, source=[])), "its header's index.source is list"),
    (_index_header(k=2**29), f"its header's index.k is {2**29}, expected an int in [1, {MAX_K}]"),
    (_index_header(layers=True), "its header's index.layers is True"),
    (_index_header(page_size=0), "its header's index.page_size is 0"),
    (_index_header(width=9), "its index: its header's width 9 is not the most records sealed (5)"),
    (_index_header(layers=2**28), "GiB to load (decoded ids, their checks, counts and sealed), more than max_bytes"),
    (_index_header(layers=2), "its index: counts [3, 2] and sealed [3, 2] do not match"),
])
def test_an_index_header_declaring_what_the_file_is_not(tmp_path, indexed, changes, needle):
    _write(tmp_path / "bad.npz", _members(indexed), changes)
    _refused(tmp_path / "bad.npz", needle)


def test_bad_index_members_are_one_line(tmp_path, indexed):
    members = _members(indexed)
    _write(tmp_path / "missing.npz", {n: v for n, v in members.items() if n != "index_payload"})
    _refused(tmp_path / "missing.npz", "has no 'index_payload' array")
    _write(tmp_path / "wide.npz", {**members, "index_sealed": members["index_sealed"].astype(np.int64) + 2**32})
    _refused(tmp_path / "wide.npz", "its index: sealed holds 4294967301, outside [0, 2^31)")
    bomb = np.frombuffer(zlib.compress(b"\x01" * (1 << 20), 9), np.uint8)
    _write(tmp_path / "bomb.npz", {**members, "index_counts": np.full_like(members["index_counts"], 4),
                                   "index_payload": bomb})
    _refused(tmp_path / "bomb.npz", "its index: ")
    sealed = members["index_sealed"].copy()
    sealed[1] = 3  # step 1 fetches page 3 of 3 sealed
    _write(tmp_path / "past.npz", {**members, "index_sealed": sealed})
    _refused(tmp_path / "past.npz", "its index: RecordedTrace.ids: an id is not below its stream's sealed count")


def test_an_index_must_match_the_trace():
    trace = _indexed()
    with pytest.raises(ValueError, match="RecordedTrace.index has 2 steps x 2 streams; it must match"):
        dataclasses.replace(trace, index=_indexed(steps=2).index)
    with pytest.raises(ValueError, match="without an index of its own"):
        dataclasses.replace(trace, index=trace)

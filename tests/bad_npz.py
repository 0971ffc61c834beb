"""Bad .npz files of every kind a reader must refuse in one line, made from a good one: the same
kinds for every reader (trace files, checkpoints) and every command that takes one."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

# kind -> the words the refusal must hold
KINDS = {
    "missing": "no such file",
    "empty": "not a .npz archive",
    "truncated": "not a .npz archive",
    "random": "not a .npz archive",
    "directory": "is a directory, not a file",
    "device": "is not a regular file",
    "tampered": "array is damaged",
    "pickled": "holds object",
    "huge_shape": "array declares shape",
}


def _members_raw(good: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(good) as z:
        return {name: z.read(name) for name in z.namelist()}


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def make(kind: str, good: Path, folder: Path, member: str) -> Path:
    """A file of `kind` made from `good` in `folder`; `member` is the array that is damaged, pickled
    or given a huge shape (one the reader reads early, so the refusal names it)."""
    path = folder / f"{kind}.npz"
    data = good.read_bytes()
    if kind == "missing":
        return path
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        return Path("/dev/zero")
    elif kind == "tampered":
        # bytes flipped inside the member's compressed data: zlib's error or the zip's CRC
        blob = bytearray(data)
        with zipfile.ZipFile(good) as z:
            info = z.getinfo(f"{member}.npy")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        for i in range(start + 2, start + info.compress_size - 2):
            blob[i] ^= 0x5A
        path.write_bytes(bytes(blob))
    elif kind == "pickled":
        one = io.BytesIO()
        np.save(one, np.array([{"x": 1}], dtype=object), allow_pickle=True)
        _zip(path, {**_members_raw(good), f"{member}.npy": one.getvalue()})
    elif kind == "huge_shape":
        # a header declaring 2^40 elements over the member's few bytes: must not be allocated
        raw = _members_raw(good)[f"{member}.npy"]
        stream = io.BytesIO(raw)
        assert np.lib.format.read_magic(stream) == (1, 0)
        _, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, dict(descr=np.lib.format.dtype_to_descr(dtype),
                                                        fortran_order=fortran, shape=(2**20, 2**20)))
        _zip(path, {**_members_raw(good), f"{member}.npy": head.getvalue() + raw[stream.tell():]})
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return path

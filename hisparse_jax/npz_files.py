"""Reading the .npz files the project writes (selection traces, checkpoints) from untrusted bytes.

`np.load` trusts a file: a truncated archive raises BadZipFile, a tampered member zlib.error, an
empty file EOFError, and a member declaring a huge shape is allocated before anything checks it.
`NpzFile` reads each member through its .npy header first: the dtype must be a plain number
type, the declared bytes must fit the caller's limit and match the member's size in the archive,
and only then are that many bytes read (the zip's CRC is checked at the member's end). Whatever
is wrong comes out as one ValueError naming the file and the member.
"""

from __future__ import annotations

import json
import lzma
import os
import stat
import zipfile
import zlib
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

# The .npy header: magic, version, length and a dict of a few hundred bytes at most.
_MAX_HEADER_BYTES = 1 << 16
# Bytes of a member read at a time.
_READ_PIECE_BYTES = 16 << 20


class NpzError(ValueError):
    """A file refused: one line naming the file and what is wrong with it."""


class NpzFile:
    """One .npz archive, its members read one at a time within a byte limit each.

    Use as a context manager: `with NpzFile(path, "recorded trace") as f: a = f.array("ids", ...)`.
    """

    def __init__(self, path: str | Path, what: str):
        self.path, self.what = Path(path), what
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            self.fail("no such file")
        except OSError as err:
            self.fail(f"cannot be read ({err.strerror})")
        if stat.S_ISDIR(mode):
            self.fail("is a directory, not a file")
        if not stat.S_ISREG(mode):  # opening a FIFO would block, /dev/zero never ends
            self.fail("is not a regular file (a device, pipe or socket)")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            self.fail(f"not a .npz archive (empty, truncated or another kind of file: {err})")

    def fail(self, reason: str):
        raise NpzError(f"{self.what} {str(self.path)!r}: {reason}") from None

    def __enter__(self) -> NpzFile:
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()

    def names(self) -> list[str]:
        """The arrays the archive holds."""
        return [n[:-4] for n in self._zip.namelist() if n.endswith(".npy")]

    def json(self, name: str, *, max_bytes: int) -> dict:
        """Member `name` (uint8 bytes of UTF-8 JSON) as the dict it must hold."""
        data = self.array(name, max_bytes=max_bytes, kinds="u").tobytes()
        try:
            value = json.loads(data.decode())
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            # RecursionError: a few KB of "[[[[..." nests deeper than the parser's stack
            self.fail(f"its {name} is not JSON ({type(err).__name__}: {str(err)[:80]})")
        if not isinstance(value, dict):
            self.fail(f"its {name} is JSON {type(value).__name__}, expected an object")
        return value

    def array(self, name: str, *, max_bytes: int, kinds: str = "biuf") -> np.ndarray:
        """Member `name` as a NumPy array, after its header is checked.

        Args:
          max_bytes: the most data bytes this member may declare (its shape x itemsize).
          kinds: the dtype kinds allowed (numpy's `dtype.kind`: b bool, i int, u uint, f float).
        """
        try:
            info = self._zip.getinfo(f"{name}.npy")
        except KeyError:
            self.fail(f"has no {name!r} array (not written by this project, or damaged)")
        if info.file_size > max_bytes + _MAX_HEADER_BYTES:
            self.fail(f"its {name!r} array declares {info.file_size} bytes, more than the {max_bytes} it may hold")
        try:
            with self._zip.open(info) as f:
                version = npy_format.read_magic(f)
                read_header = {(1, 0): npy_format.read_array_header_1_0,
                               (2, 0): npy_format.read_array_header_2_0}.get(version)
                if read_header is None:
                    self.fail(f"its {name!r} array has .npy version {version}, expected 1.0 or 2.0")
                shape, fortran, dtype = read_header(f)
                if dtype.hasobject or dtype.kind not in kinds or dtype.names is not None:
                    self.fail(f"its {name!r} array holds {dtype}, expected numbers of kind {kinds!r}")
                count = 1
                for d in shape:
                    count *= int(d)
                nbytes = count * dtype.itemsize  # Python ints: no overflow
                if nbytes > max_bytes:
                    self.fail(f"its {name!r} array declares shape {tuple(shape)} ({nbytes} bytes), more than "
                              f"the {max_bytes} it may hold")
                if nbytes != info.file_size - f.tell():
                    self.fail(f"its {name!r} array declares {nbytes} bytes but stores {info.file_size - f.tell()}")
                try:
                    out = np.empty(nbytes, np.uint8)
                except MemoryError:
                    self.fail(f"its {name!r} array needs {nbytes} bytes, more than this machine can allocate")
                view, done = memoryview(out), 0
                while done < nbytes:
                    # In pieces: zipfile decompresses a read into a new buffer of the size asked
                    # for, so one read of the whole member would hold it twice.
                    got = f.readinto(view[done:done + _READ_PIECE_BYTES])
                    if not got:
                        self.fail(f"its {name!r} array is truncated")
                    done += got
                if f.read(1):  # also makes zipfile check the member's CRC
                    self.fail(f"its {name!r} array holds more bytes than its header declares")
        except NpzError:
            raise
        except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, ValueError) as err:
            self.fail(f"its {name!r} array is damaged ({type(err).__name__}: {err})")
        except (RuntimeError, NotImplementedError) as err:  # zipfile: an encrypted member, an unknown method
            self.fail(f"its {name!r} array cannot be read: {err} (this project writes plain or deflated members)")
        except MemoryError:
            self.fail(f"its {name!r} array cannot be decompressed in this machine's memory")
        return out.view(dtype).reshape(shape, order="F" if fortran else "C")

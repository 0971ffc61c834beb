"""Reading a text file a user hands a script (a decode.json report, a kernel table) within a byte
bound: a regular file only (a FIFO would block, /dev/zero and /proc files report size 0 and never
end or grow), at most `max_bytes` read whatever the file's size claims, UTF-8. Every failure is one
BenchError line naming the file and what the script wants instead."""

from __future__ import annotations

import os
import stat

from .errors import BenchError


def read_bounded_text(path: str, max_bytes: int, wanted: str) -> str:
    """The text of `path`, or BenchError: not a readable regular file, more than `max_bytes`, or not
    UTF-8. `wanted` names what the caller expects there (for the message: "pass <wanted>")."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise BenchError(f"{path}: not a regular file (a directory, device or pipe); pass {wanted}")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise BenchError(f"{path}: cannot be read ({type(err).__name__}: {err}); pass {wanted}") from None
    if len(data) > max_bytes:
        raise BenchError(f"{path}: more than {max_bytes} bytes, larger than {wanted} can be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BenchError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); pass {wanted}") from None

"""Offline training text: files of the machine's Python standard library (and any other folders
given), read as bytes: the model is byte-level (vocab 256, token = byte).

Documents are split into training and held-out sets by a hash of their path relative to their
root, so the split is the same on every machine that has the same files. Training batches are
windows drawn uniformly from the concatenation of the training documents (documents packed end
to end, as in pre-training); the held-out set gives evaluation windows and the long documents
whose decoding is recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import sysconfig
from pathlib import Path
from typing import Sequence

import numpy as np

SUFFIXES = (".py", ".txt", ".rst", ".md")
SEPARATOR = 0x1E  # ASCII record separator between packed documents
# The most bytes one document (a file) and the whole corpus may hold: the standard library's
# largest text file is under 1 MiB, all of it about 40 MiB. Nothing is read past them.
MAX_DOCUMENT_BYTES = 64 << 20
MAX_CORPUS_BYTES = 4 << 30


def default_roots() -> list[Path]:
    """The Python standard library's folder (its installed third-party packages excluded)."""
    return [Path(sysconfig.get_paths()["stdlib"])]


@dataclasses.dataclass(frozen=True)
class Document:
    name: str  # path relative to its root
    tokens: np.ndarray  # [n] uint8


def _held_out(name: str, fraction: float) -> bool:
    digest = hashlib.sha1(name.encode()).digest()
    return int.from_bytes(digest[:4], "little") < fraction * 2**32


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def _read_text(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of `path`, at most max_bytes; None when it is not a regular file (a FIFO would
    block, a device never ends; a broken link names nothing). Whatever cannot be read, and a
    file larger than max_bytes, is one ValueError naming it."""
    try:
        info = os.stat(path)  # follows links: a link to a text file is read
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"corpus: {str(path)!r} cannot be read ({type(err).__name__}: {err.strerror or err}); make "
                         "it readable or give --roots without it") from None
    if not stat.S_ISREG(info.st_mode):
        return None
    too_big = (f"corpus: {str(path)!r} holds more than {_size(max_bytes)}, more than a document may; move it out "
               "of the folder or give other --roots")
    if info.st_size > max_bytes:
        raise ValueError(too_big.replace("holds more than", f"is {info.st_size} bytes, more than", 1))
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # at most that: /proc files report size 0
    except OSError as err:
        raise ValueError(f"corpus: {str(path)!r} cannot be read ({type(err).__name__}: {err.strerror or err}); make "
                         "it readable or give --roots without it") from None
    if len(data) > max_bytes:
        raise ValueError(too_big)
    return data


def read_documents(roots: Sequence[Path], min_bytes: int = 256, max_bytes: int = MAX_DOCUMENT_BYTES,
                   max_total: int = MAX_CORPUS_BYTES) -> list[Document]:
    """Text files under `roots` (SUFFIXES; regular files; no NUL byte; at least min_bytes), sorted
    by name; folders named site-packages or dist-packages (installed packages) and __pycache__
    skipped. A file of more than max_bytes, text of more than max_total in all, or a file that
    cannot be read is one ValueError naming it (no file is read past max_bytes)."""
    docs, total, seen = [], 0, 0
    skipped = {"short": 0, "binary": 0, "irregular": 0}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"corpus: {str(root)!r} is not a folder; pass existing folders of text files")
        try:
            paths = sorted(root.rglob("*"))
        except OSError as err:
            raise ValueError(f"corpus: {str(root)!r} cannot be listed ({type(err).__name__}: {err}); give "
                             "readable folders") from None
        for path in paths:
            parts = set(path.relative_to(root).parts)
            if parts & {"site-packages", "dist-packages", "__pycache__"} or path.suffix not in SUFFIXES:
                continue
            seen += 1
            data = _read_text(path, max_bytes)
            if data is None:
                skipped["irregular"] += 1
                continue
            if len(data) < min_bytes or b"\0" in data:
                skipped["short" if len(data) < min_bytes else "binary"] += 1
                continue
            total += len(data)
            if total > max_total:
                raise ValueError(f"corpus: the text files under {', '.join(map(str, roots))} hold more than "
                                 f"{_size(max_total)}, more than a corpus may; give fewer or smaller folders")
            docs.append(Document(f"{root.name}/{path.relative_to(root)}", np.frombuffer(data, np.uint8)))
    where = ", ".join(map(str, roots))
    if not docs and not seen:
        raise ValueError(f"corpus: no text files ({', '.join(SUFFIXES)}) under {where} (folders named site-packages, "
                         "dist-packages and __pycache__ are skipped); pass folders of text files")
    if not docs:
        raise ValueError(f"corpus: none of the {seen} files named {', '.join('*' + x for x in SUFFIXES)} under "
                         f"{where} is a document: {skipped['short']} are shorter than {min_bytes} bytes, "
                         f"{skipped['binary']} hold a NUL byte (binary), {skipped['irregular']} are not regular "
                         f"files; pass folders of text files of {min_bytes} bytes or more")
    return docs


@dataclasses.dataclass(frozen=True)
class Corpus:
    train: list[Document]
    held_out: list[Document]

    @classmethod
    def from_roots(cls, roots: Sequence[Path] | None = None, held_out_fraction: float = 0.05,
                   long_tokens: int = 40000, long_fraction: float = 0.25) -> "Corpus":
        """Documents under `roots`; a held_out_fraction of them held out, and a long_fraction of
        those with at least long_tokens tokens (the recorder decodes long held-out documents, and
        a small corpus has few)."""
        docs = read_documents(roots or default_roots())
        held_out = lambda d: _held_out(d.name, long_fraction if d.tokens.size >= long_tokens else held_out_fraction)
        held = [d for d in docs if held_out(d)]
        train = [d for d in docs if not held_out(d)]
        if not train or not held:
            raise ValueError(f"corpus: {len(docs)} documents split into {len(train)} training and {len(held)} "
                             "held-out ones; give more text")
        return cls(train, held)

    @staticmethod
    def packed(docs: Sequence[Document]) -> np.ndarray:
        sep = np.array([SEPARATOR], np.uint8)
        return np.concatenate([part for d in docs for part in (d.tokens, sep)])

    def tokens(self, split: str) -> int:
        return sum(d.tokens.size for d in (self.train if split == "train" else self.held_out))

    def long_documents(self, min_tokens: int) -> list[Document]:
        """Held-out documents of at least min_tokens tokens, longest first (ties by name)."""
        return sorted((d for d in self.held_out if d.tokens.size >= min_tokens), key=lambda d: (-d.tokens.size, d.name))


class WindowSampler:
    """Random windows [batch, length] int32 of a packed token array, from a seeded generator."""

    def __init__(self, packed: np.ndarray, batch: int, length: int, seed: int):
        if packed.size <= length:
            raise ValueError(f"corpus: {packed.size} tokens cannot fill a window of {length}; give more text")
        self.packed, self.batch, self.length = packed, batch, length
        self.rng = np.random.default_rng(seed)

    def __next__(self) -> np.ndarray:
        starts = self.rng.integers(0, self.packed.size - self.length, self.batch)
        return np.stack([self.packed[s : s + self.length] for s in starts]).astype(np.int32)

    def __iter__(self):
        return self

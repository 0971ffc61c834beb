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
import sysconfig
from pathlib import Path
from typing import Sequence

import numpy as np

SUFFIXES = (".py", ".txt", ".rst", ".md")
SEPARATOR = 0x1E  # ASCII record separator between packed documents


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


def read_documents(roots: Sequence[Path], min_bytes: int = 256) -> list[Document]:
    """Text files under `roots` (SUFFIXES; no NUL byte; at least min_bytes), sorted by name;
    folders named site-packages or dist-packages (installed packages) and __pycache__ skipped."""
    docs = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"corpus: {str(root)!r} is not a folder; pass existing folders of text files")
        for path in sorted(root.rglob("*")):
            parts = set(path.relative_to(root).parts)
            if parts & {"site-packages", "dist-packages", "__pycache__"} or path.suffix not in SUFFIXES:
                continue
            if not path.is_file():
                continue
            data = path.read_bytes()
            if len(data) < min_bytes or b"\0" in data:
                continue
            docs.append(Document(f"{root.name}/{path.relative_to(root)}", np.frombuffer(data, np.uint8)))
    if not docs:
        raise ValueError(f"corpus: no text files ({', '.join(SUFFIXES)}) under {', '.join(map(str, roots))}")
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

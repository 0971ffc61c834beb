"""A one-line progress display on stderr for long benchmark runs (no dependency)."""

from __future__ import annotations

import sys
import time


class Progress:
    """`with Progress(total, "label") as p: ... p.advance("what")` redraws one stderr line."""

    def __init__(self, total: int, label: str, stream=sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.done, self.start = 0, time.perf_counter()
        self.enabled = stream.isatty()

    def __enter__(self):
        self._draw("starting")
        return self

    def advance(self, what: str = "", log: bool = True) -> None:
        """One more step done; log=False keeps it out of a log (no terminal: one line per
        logged step), a terminal's line still shows it."""
        self.done += 1
        if log or self.enabled:
            self._draw(what)

    def _draw(self, what: str) -> None:
        elapsed = time.perf_counter() - self.start
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done}/{self.total} {elapsed:6.1f}s {what}")
        if self.enabled:
            self.stream.write("\r" + line[:120].ljust(120))
        else:  # logs: one line per event
            self.stream.write(line + "\n")
        self.stream.flush()

    def __exit__(self, *exc):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
        return False

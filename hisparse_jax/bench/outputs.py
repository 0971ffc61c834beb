"""Output locations, checked before any work: a benchmark that runs for minutes and then cannot
write its report loses the run (`--out /dev/null/x` used to fail only at the end)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .errors import BenchError


def check_folder(flag: str, path: str | os.PathLike) -> None:
    """`path` is a folder the command may create or write: it is one, or its nearest existing
    ancestor is a writable folder. Nothing is created here (a refused run leaves no trace)."""
    _check_not_empty(flag, path, "give a folder")
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise BenchError(f"{flag} {str(path)!r}: exists and is not a folder; give a folder")
    _check_ancestor(flag, path, target)


def check_file(flag: str, path: str | os.PathLike) -> None:
    """`path` is a file the command may write: not a folder, and its folder exists or can be
    created under a writable one."""
    _check_not_empty(flag, path, "give a file name")
    target = Path(path)
    if target.is_dir():
        raise BenchError(f"{flag} {str(path)!r}: is a folder; give a file name")
    _check_ancestor(flag, path, target.parent)


def write_report(out: Path, name: str, report: dict, plots: Callable[[dict, Path], list] | None) -> list[Path]:
    """Writes `report` as out/name (JSON) and, given `plots`, its plots; the paths written. Called
    after the tables are printed, so a write that fails (a disk filled meanwhile) is one line,
    exit 1, and the results stay on screen."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(report, indent=1))
        return [out / name, *(plots(report, out) if plots is not None else [])]
    except OSError as err:
        raise BenchError(f"--out {str(out)!r}: the report could not be written ({err}); the tables above "
                         "are the run's results", status=1) from None


def _check_not_empty(flag: str, path, fix: str) -> None:
    """An empty path is refused: Path("") is the current folder, so `--out ""` wrote the report
    into it (and `--json ""` skipped the file), where the user gave no path at all."""
    if isinstance(path, str) and path == "":
        raise BenchError(f"{flag}: an empty path; {fix}")


def _check_ancestor(flag: str, shown, folder: Path) -> None:
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise BenchError(f"{flag} {str(shown)!r}: {str(probe)!r} is not a folder, so nothing can be written "
                         "under it; give another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BenchError(f"{flag} {str(shown)!r}: {str(probe)!r} is not writable; give another path")

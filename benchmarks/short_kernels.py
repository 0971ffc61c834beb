"""The short kernels of profiled decode steps: launches a step and device time a step of the kernels
whose median call is under a few microseconds, read from benchmarks/kernel_table.py's tables.

    python benchmarks/short_kernels.py KERNEL_TABLE... [--under 3]

Each KERNEL_TABLE is the output of `benchmarks/kernel_table.py PROFILE_DIR STEPS --category all`
(one profiled run). Kernels this short move next to nothing: what they cost is their launch and
fixed latencies, so what they take a step (with the step's launch gap, benchmarks/launch_gaps.py)
is set against what a step at 85% of its roofline leaves beyond its bytes (the same script's last
column, times the kernels a step): only fewer kernels shrink it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# kernel_table.py's header row: the columns read here are the per-step launches (3), the us per
# call min / median / max (4) and the us per step (5).
_HEADER = "| category | kernel | per step | us per call min / median / max | us per step |"
_CALL = re.compile(r"^([\d.]+) / ([\d.]+) / ([\d.]+)$")
_MAX_BYTES = 16 << 20  # a table of every kernel of a step is tens of KB


class TableError(ValueError):
    """A file that is not a kernel_table.py table, in one line."""


def read_table(path: str) -> list[tuple[float, float, float]]:
    """(launches a step, median us a call, us a step) of every kernel row of one table."""
    try:
        size = os.path.getsize(path)
        if size > _MAX_BYTES:
            raise TableError(f"{path}: {size} bytes, more than a kernel table's {_MAX_BYTES}; pass kernel_table.py's output")
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: cannot read it ({type(err).__name__}: {err})") from None
    if not any(line.startswith(_HEADER) for line in lines):
        raise TableError(f"{path}: no kernel table header; pass the output of benchmarks/kernel_table.py "
                         "PROFILE_DIR STEPS --category all")
    rows = []
    for n, line in enumerate(lines, 1):
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 7 or not _CALL.match(cells[4]):
            continue
        try:
            launches, median, per_step = float(cells[3]), float(_CALL.match(cells[4]).group(2)), float(cells[5])
        except ValueError:
            raise TableError(f"{path}:{n}: a kernel row with a non-numeric launch count or time") from None
        rows.append((launches, median, per_step))
    if not rows:
        raise TableError(f"{path}: a kernel table header but no kernel rows")
    return rows


def summary(rows: list[tuple[float, float, float]], under_us: float) -> dict:
    """Launches and ms a step of the kernels under `under_us` a call, and of all of them."""
    short = [r for r in rows if r[1] < under_us]
    return dict(short_launches=sum(r[0] for r in short), short_ms=sum(r[2] for r in short) / 1e3,
                launches=sum(r[0] for r in rows), ms=sum(r[2] for r in rows) / 1e3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", help="outputs of benchmarks/kernel_table.py ... --category all")
    p.add_argument("--under", type=float, default=3.0, help="a kernel is short when its median call takes less (us)")
    a = p.parse_args(argv)
    if not 0 < a.under < 1e6:
        p.error(f"--under must be a positive number of microseconds below 1e6, got {a.under}")
    try:  # every table is read and checked before anything is printed
        found = [(path, summary(read_table(path), a.under)) for path in a.tables]
    except TableError as err:
        print(f"short_kernels: error: {err}", file=sys.stderr)
        return 2
    print(f"| table | launches a step | ms a step | launches under {a.under:g} us a call | their ms a step |")
    print("|---|---|---|---|---|")
    for path, s in found:
        print(f"| {os.path.basename(path)} | {s['launches']:.0f} | {s['ms']:.3f} | {s['short_launches']:.0f} | "
              f"{s['short_ms']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import math
import os
import re
import sys

from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.user_files import read_bounded_text

# kernel_table.py's header row: the columns read here are the per-step launches (3), the us per
# call min / median / max (4) and the us per step (5).
_HEADER = "| category | kernel | per step | us per call min / median / max | us per step |"
_CALL = re.compile(r"^(\S+) / (\S+) / (\S+)$")
_MAX_BYTES = 16 << 20  # a table of every kernel of a step is tens of KB
_WANTED = "the output of benchmarks/kernel_table.py PROFILE_DIR STEPS --category all"


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def read_table(path: str) -> list[tuple[float, float, float]]:
    """(launches a step, median us a call, us a step) of every kernel row of one table, or
    BenchError in one line."""
    lines = read_bounded_text(path, _MAX_BYTES, _WANTED).splitlines()
    if not any(line.startswith(_HEADER) for line in lines):
        raise BenchError(f"{path}: no kernel table header; pass {_WANTED}")
    rows = []
    for n, line in enumerate(lines, 1):
        cells = [c.strip() for c in line.split("|")]
        call = _CALL.match(cells[4]) if len(cells) >= 7 else None
        if call is None:
            continue
        try:
            rows.append((_number(cells[3]), _number(call.group(2)), _number(cells[5])))
        except ValueError:
            raise BenchError(f"{path}:{n}: a kernel row whose launches or times are not finite numbers >= 0; "
                             f"pass {_WANTED}") from None
    if not rows:
        raise BenchError(f"{path}: a kernel table header but no kernel rows; pass {_WANTED}")
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
    except BenchError as err:
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

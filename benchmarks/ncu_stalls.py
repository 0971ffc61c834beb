"""Where a kernel's warps wait, by reason and by instruction, from Nsight Compute's source view.

    ncu --set full --import-source yes -k regex:KERNEL --launch-count 1 -o REPORT BINARY ARGS...
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
    python benchmarks/ncu_stalls.py SOURCE.csv [--top 30]

Prints the kernel's stall samples summed by reason (share of all samples) and the instructions
with the most samples (their index in the SASS listing, the instruction, their two main reasons):
what BENCHMARKS.md quotes for a kernel's profile.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys

from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.user_files import read_bounded_text

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import one_line_errors  # noqa: E402

_MAX_BYTES = 64 << 20  # one kernel's source page: a few thousand instructions, ~1 MB
_WANTED = "the output of `ncu -i REPORT --page source --csv --print-source sass` (one kernel)"
_SAMPLES = "Warp Stall Sampling (All Samples)"
_EXECUTED = "Instructions Executed"


def _number(path: str, line: int, column: str, text: str) -> float:
    """A count of the page: empty is 0, else a finite number >= 0 (BenchError otherwise)."""
    try:
        value = float(text.replace(",", "")) if text.strip() else 0.0
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise BenchError(f"{path}: row {line}: {column!r} is {text!r}, not a count; pass {_WANTED}")
    return value


def read_page(path: str) -> tuple[str, list[str], list[tuple[str, float, float, dict[str, float]]]]:
    """(kernel name, stall reasons, rows of (instruction, samples, executed, samples by reason))."""
    rows = list(csv.reader(read_bounded_text(path, _MAX_BYTES, _WANTED).splitlines()))
    if len(rows) < 3 or len(rows[0]) < 2 or rows[0][0] != "Kernel Name":
        raise BenchError(f"{path}: no 'Kernel Name' line first; pass {_WANTED}")
    header = rows[1]
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    missing = [h for h in ("Source", _SAMPLES, _EXECUTED) if h not in header]
    if missing or not reasons:
        raise BenchError(f"{path}: no {missing[0] if missing else 'stall_*'!r} column; pass {_WANTED}")
    at = {h: i for i, h in enumerate(header)}
    out = []
    for line, row in enumerate(rows[2:], 3):
        if len(row) != len(header):
            raise BenchError(f"{path}: row {line} has {len(row)} cells, the header {len(header)}; pass {_WANTED}")
        by_reason = {h: _number(path, line, h, row[at[h]]) for h in reasons}
        out.append((row[at["Source"]].strip(), _number(path, line, _SAMPLES, row[at[_SAMPLES]]),
                    _number(path, line, _EXECUTED, row[at[_EXECUTED]]), by_reason))
    if not out:
        raise BenchError(f"{path}: a header but no instructions; pass {_WANTED}")
    return rows[0][1], reasons, out


def main(argv: list[str] | None = None) -> int:
    p = one_line_errors(argparse.ArgumentParser(prog="ncu_stalls.py", description=__doc__.split("\n\n")[0]))
    p.add_argument("page", help="the source page as CSV: ncu -i REPORT --page source --csv --print-source sass")
    p.add_argument("--top", type=int, default=30, help="instructions to list, by their stall samples")
    a = p.parse_args(argv)
    if not 0 <= a.top <= 10000:
        p.error(f"--top must be an integer in [0, 10000], got {a.top}")
    try:
        kernel, reasons, rows = read_page(a.page)
    except BenchError as err:
        print(f"ncu_stalls: error: {err}", file=sys.stderr)
        return 2
    total = sum(r[1] for r in rows)
    print(f"{kernel}: {total:.0f} stall samples, {sum(r[2] for r in rows):.0f} warp instructions executed")
    sums = sorted(((h, sum(r[3][h] for r in rows)) for h in reasons), key=lambda x: -x[1])
    for reason, samples in sums[:10]:
        print(f"  {reason:22s} {samples:7.0f} {100 * samples / total if total else 0:5.1f}%")
    print("top instructions by samples (index in the SASS listing, samples, instruction, two main reasons):")
    for i in sorted(range(len(rows)), key=lambda i: -rows[i][1])[:a.top]:
        source, samples, _, by_reason = rows[i]
        (r1, s1), (r2, s2) = (sorted(by_reason.items(), key=lambda x: -x[1]) + [("-", 0.0)] * 2)[:2]
        print(f"  {i:5d} {samples:6.0f}  {source[:60]:60s} {r1} {s1:.0f}, {r2} {s2:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

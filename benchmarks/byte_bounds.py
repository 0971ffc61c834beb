"""Each profile category of profiled decode runs against its own bytes' time.

    python benchmarks/byte_bounds.py DECODE_JSON...

Reads `hisparse-bench decode --profile` reports (decode.json) and prints, per profiled run, each
category's device time per step over the time its own bytes take at the bandwidths the run
measured (hisparse_jax.bench.profile.bounds_for: weights/FFN over the weights, indexer over the
metadata, attention over the attended records at the HBM rate; resolve + IO over the miss IO at
the host link's; NSA and Quest, whose metadata attention kernels read, bound attention and indexer
together by both), and the device ms per step of the categories with no bytes of their own in the
roofline. A cell is the ratio, "X ms, no bytes" for time without bytes, "no kernels" for bytes
without time, "-" for neither. The roofline issue's bound is 1.25x a category. Works on reports
written before the profile printed this itself. The report column is the report's path (without
a trailing /decode.json).
"""

from __future__ import annotations

import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import BYTE_BOUNDS, category_bounds

COLUMNS = [" + ".join(categories) for categories, _, _ in BYTE_BOUNDS]


def _cell(seconds: float, bound: float) -> str:
    if bound > 0 and seconds > 0:
        return f"{seconds / bound:.2f}"
    if seconds > 0:
        return f"{seconds * 1e3:.3f} ms, no bytes"
    return "no kernels" if bound > 0 else "-"


def cells(bounded: list[tuple[str, float, float]]) -> list[str]:
    """The table's cells of one profile's bounds (category_bounds), in COLUMNS order: a bound over
    several of the columns' categories (NSA, Quest: attention + indexer) fills the first column it
    names and marks the others "with <that column>"."""
    out = dict.fromkeys(COLUMNS, "-")
    for label, seconds, bound in bounded:
        names = label.split(" + ")
        home = label if label in out else names[0]
        out[home] = _cell(seconds, bound) + ("" if label in out else f" ({label})")
        for name in names:
            if name in out and name != home:
                out[name] = f"with {home}"
    return [out[c] for c in COLUMNS]


def rows(path: str) -> list[str]:
    """The table rows of one report, or BenchError in one line (an unreadable report, a profile
    without numeric seconds, bytes and positive bandwidths, no GPU profile at all)."""
    report = load_report(path, keys=("profiles",))
    family = report.get("family")
    out, i = [], 0
    try:
        for i, p in enumerate(report["profiles"]):
            if not any(p["seconds"].values()):
                continue  # a CPU profile: no kernel events
            bounded, unbounded = category_bounds(p, family)
            rest = ", ".join(f"{c} {s * 1e3:.3f}" for c, s in unbounded) or "-"
            out.append(f"| {path.removesuffix('/decode.json')} | {p['mode']} | {p.get('run', 'capacity')} | "
                       f"{p['context']} | {p.get('trace') or '-'} | {p['batch']} | {' | '.join(cells(bounded))} | {rest} |")
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError, ZeroDivisionError) as err:
        raise BenchError(f"{path}: profile {i} lacks a field or holds a wrong value (mode, context, batch, numeric "
                         f"seconds and bytes, positive bandwidths: {type(err).__name__}: {err}); pass a decode.json "
                         "written by hisparse-bench decode --profile") from None
    if not out:
        raise BenchError(f"{path}: no GPU profile in it; pass a decode.json of a hisparse-bench decode --profile run "
                         "on a GPU")
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:  # every report is read and checked before the table is printed
        table = [line for path in paths for line in rows(path)]
    except BenchError as err:
        print(f"byte_bounds: error: {err}", file=sys.stderr)
        return 2
    print("| report | mode | run | context | trace | batch | " + " | ".join(f"{label} x" for label in COLUMNS)
          + " | no bytes of their own, ms |")
    print("|---|---|---|---|---|---|" + "---|" * len(COLUMNS) + "---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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
a trailing /decode.json). A GPU profile whose seconds or bytes are not finite numbers >= 0, whose
bandwidths are not > 0 or whose context or batch is not an integer >= 1 is refused in one line
naming the report and the field (benchmarks/script_checks.py, shared with launch_gaps.py).
"""

from __future__ import annotations

import os
import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import BYTE_BOUNDS, category_bounds

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import count, finite, number, text  # noqa: E402

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


def checked(p: dict) -> dict:
    """The profile with its seconds and bytes finite numbers >= 0, its bandwidths > 0 and its
    context and batch integers >= 1, or ValueError naming the field (TypeError, AttributeError:
    a field of the wrong kind)."""
    out = dict(p, seconds={c: number(v, f"seconds[{c!r}]") for c, v in p["seconds"].items()},
               bytes={k: number(v, f"bytes[{k!r}]", unit="bytes") for k, v in p["bytes"].items()},
               bandwidths={k: number(v, f"bandwidths[{k!r}]", unit="bytes/s", positive=True)
                           for k, v in p["bandwidths"].items()},
               context=count(p.get("context"), "context"), batch=count(p.get("batch"), "batch"),
               mode=text(p.get("mode"), "mode"), run=text(p.get("run", "capacity"), "run"),
               trace=text(p.get("trace"), "trace", optional=True))
    if not isinstance(p.get("family", ""), str):
        raise ValueError(f"family is {repr(p['family'])[:40]}, not a family's name")
    return out


def rows(path: str) -> list[str]:
    """The table rows of one report, or BenchError in one line (an unreadable report, a profile
    without finite seconds and bytes >= 0, positive bandwidths, integer context and batch, no GPU
    profile at all)."""
    report = load_report(path, keys=("profiles",))
    family = report.get("family")
    if family is not None and not isinstance(family, str):
        raise BenchError(f"{path}: its family is {repr(family)[:40]}, not a family's name; pass a decode.json "
                         "written by hisparse-bench decode --profile")
    out, i = [], 0
    try:
        for i, p in enumerate(report["profiles"]):
            if not any(number(v, f"seconds[{c!r}]") for c, v in p["seconds"].items()):
                continue  # a CPU profile: no kernel events
            p = checked(p)
            bounded, unbounded = category_bounds(p, family)
            # The bounds and the figures as the table shows them (ratios, ms): finite, or the values are
            # not a profile's (1e308 seconds, a bandwidth of 1e-300 bytes/s).
            shown = [x for _, seconds, bound in bounded for x in (bound, seconds * 1e3, seconds / bound if bound else 0)]
            finite(shown + [seconds * 1e3 for _, seconds in unbounded], "its bounds")
            rest = ", ".join(f"{c} {s * 1e3:.3f}" for c, s in unbounded) or "-"
            out.append(f"| {path.removesuffix('/decode.json')} | {p['mode']} | {p.get('run', 'capacity')} | "
                       f"{p['context']} | {p.get('trace') or '-'} | {p['batch']} | {' | '.join(cells(bounded))} | {rest} |")
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError, ZeroDivisionError) as err:
        raise BenchError(f"{path}: profile {i} lacks a field or holds a wrong value (mode, integer context and batch, "
                         f"finite seconds and bytes >= 0, bandwidths > 0: {type(err).__name__}: {str(err)[:300]}); "
                         "pass a decode.json written by hisparse-bench decode --profile") from None
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

"""Each profile category of profiled decode runs against its own bytes' time.

    python benchmarks/byte_bounds.py DECODE_JSON...

Reads `hisparse-bench decode --profile` reports (decode.json) and prints, per profiled run, each
category's device time per step over the time its own bytes take at the bandwidths the run
measured (hisparse_jax.bench.profile.BYTE_BOUNDS: weights/FFN over the weights, indexer over the
metadata, attention over the attended records at the HBM rate; resolve + IO over the miss IO at
the host link's), and the device ms per step of the categories with no bytes of their own in the
roofline. The roofline issue's bound is 1.25x a category. Works on reports written before the
profile printed this itself.
"""

from __future__ import annotations

import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import BYTE_BOUNDS, category_bounds


def rows(path: str) -> list[str]:
    """The table rows of one report, or BenchError in one line (an unreadable report, a profile
    without numeric seconds, bytes and positive bandwidths)."""
    report = load_report(path, keys=("profiles",))
    name = report.get("deployment") or report.get("family")
    out, i = [], 0
    try:
        for i, p in enumerate(report["profiles"]):
            if not any(p["seconds"].values()):
                continue  # a CPU profile: no kernel events
            bounded, unbounded = category_bounds(p)
            ratios = " | ".join(f"{s / b:.2f}" if b > 0 else "-" for _, s, b in bounded)
            rest = ", ".join(f"{c} {s * 1e3:.3f}" for c, s in unbounded) or "-"
            out.append(f"| {name} | {p['mode']} | {p.get('run', 'capacity')} | {p['context']} | "
                       f"{p.get('trace') or '-'} | {p['batch']} | {ratios} | {rest} |")
    except (KeyError, TypeError, AttributeError, ZeroDivisionError) as err:
        raise BenchError(f"{path}: profile {i} lacks numeric seconds, bytes or bandwidths "
                         f"({type(err).__name__}: {err})") from None
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    labels = [" + ".join(categories) for categories, _, _ in BYTE_BOUNDS]
    try:  # every report is read and checked before the table is printed
        table = [line for path in paths for line in rows(path)]
    except BenchError as err:
        print(f"byte_bounds: error: {err}", file=sys.stderr)
        return 2
    print("| report | mode | run | context | trace | batch | " + " | ".join(f"{label} x" for label in labels)
          + " | no bytes of their own, ms |")
    print("|---|---|---|---|---|---|" + "---|" * len(labels) + "---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

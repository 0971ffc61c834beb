"""Merges decode.json reports of one family (e.g. one run per context) into one table and plots.

  python benchmarks/merge_decode_reports.py OUT_DIR REPORT.json...

Runs per context in separate processes keep a failure at one context from losing the others
and return all pinned host memory between contexts; this joins their rows and ratios (sorted by
context) into OUT_DIR/decode.json, prints the table, and draws throughput and TPOT vs context.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hisparse_jax.bench.decode.plots import write_plots
from hisparse_jax.bench.decode.report import format_table


def merge(reports: list[dict]) -> dict:
    first = reports[0]
    for r in reports[1:]:
        for key in ("family", "preset", "device", "jax", "device_budget_bytes", "host_budget_bytes",
                    "max_batch_cap", "steps", "reps", "fill", "selection", "overrides", "notes"):
            if r.get(key) != first.get(key):
                raise SystemExit(f"reports differ in {key}: {first[key]!r} vs {r[key]!r}")
    merged = dict(first)
    merged["rows"] = sorted((row for r in reports for row in r["rows"]), key=lambda row: row["context"])
    merged["ratios"] = sorted((q for r in reports for q in r["ratios"]), key=lambda q: q["context"])
    return merged


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    report = merge([json.loads(Path(p).read_text()) for p in argv[1:]])
    (out / "decode.json").write_text(json.dumps(report, indent=1))
    print(format_table(report))
    write_plots(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

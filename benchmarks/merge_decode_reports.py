"""Merges decode.json reports of one family (e.g. one run per context) into one table and plots.

  python benchmarks/merge_decode_reports.py OUT_DIR REPORT.json...

Runs per context in separate processes keep a failure at one context from losing the others
and return all pinned host memory between contexts; this joins their rows, ratios, profiles and bandwidths
(sorted by context) into OUT_DIR/decode.json, prints the table, and draws throughput and TPOT vs context.
Each run (context, mode, run, trace) must come from one report: a report passed twice, or two
reports of the same run, are refused in one line rather than doubling its rows.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from hisparse_jax.bench import outputs
from hisparse_jax.bench.decode.plots import write_plots
from hisparse_jax.bench.decode.report import format_table, load_report
from hisparse_jax.bench.errors import BenchError


def _entries(path: str, report: dict, key: str) -> list[dict]:
    """report[key] as a list of objects with an integer context, or BenchError naming the file."""
    entries = report.get(key, [])
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("context"), int) and not isinstance(e["context"], bool)
            for e in entries):
        raise BenchError(f"{path}: its {key} is not a list of objects with an integer context; pass a decode.json "
                         "written by hisparse-bench decode")
    return entries


# What names one entry of a report: a timing row or a profile by its run, a ratio by its context and
# trace (a report holds one of each).
_KEYS = {"rows": ("context", "mode", "run", "trace"), "ratios": ("context", "trace"),
         "profiles": ("context", "mode", "run", "trace"), "bandwidths": ("context",)}


def _refuse_repeats(paths: list[str], reports: list[dict]) -> None:
    """BenchError naming the first entry a report repeats from an earlier one (the same report
    passed twice, or two reports of one run): merged, its rows would count twice."""
    seen: dict[tuple, str] = {}
    for path, report in zip(paths, reports):
        mine = set()
        for key, fields in _KEYS.items():
            for e in _entries(path, report, key):
                name = (key, *(repr(e.get(f)) for f in fields))
                if name in seen:
                    said = ", ".join(f"{f} {e.get(f)}" for f in fields)
                    raise BenchError(f"{path}: its {key[:-1]} ({said}) is already in {seen[name]}; pass each run's "
                                     "report once")
                mine.add(name)
        seen.update(dict.fromkeys(mine, path))


def merge(reports: list[dict], paths: list[str] | None = None) -> dict:
    """One report of `reports` (read from `paths`): the first one's fields, every report's rows,
    ratios, profiles and bandwidths sorted by context (a stable sort: each context's entries in their
    order)."""
    paths = paths or [f"report {i + 1}" for i in range(len(reports))]
    _refuse_repeats(paths, reports)
    entries = {key: [e for p, r in zip(paths, reports) for e in _entries(p, r, key)]
               for key in _KEYS}
    first = reports[0]
    for r in reports[1:]:
        for key in ("family", "preset", "device", "jax", "device_budget_bytes", "host_budget_bytes",
                    "max_batch_cap", "steps", "reps", "fill", "selection", "overrides", "notes"):
            if r.get(key) != first.get(key):
                raise BenchError(f"reports differ in {key}: {first.get(key)!r} vs {r.get(key)!r}")
    merged = dict(first)
    for key, found in entries.items():
        if key in first or found:
            merged[key] = sorted(found, key=lambda e: e["context"])
    return merged


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("merge_decode_reports: error: expected OUT_DIR and at least one REPORT.json; usage: "
              + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    # Everything is checked and drawn before anything is written: the output folder, every
    # report, the table and the plots (drawn into a scratch folder, then moved).
    with tempfile.TemporaryDirectory() as scratch:
        try:
            outputs.check_folder("OUT_DIR", argv[0])
            report = merge([load_report(p) for p in argv[1:]], argv[1:])
            table = format_table(report)
            write_plots(report, Path(scratch))
        except BenchError as err:
            print(f"merge_decode_reports: error: {err}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as err:
            print("merge_decode_reports: error: a field of the reports is missing or holds a wrong value "
                  f"({type(err).__name__}: {str(err)[:120]}); pass decode.json files written by hisparse-bench "
                  "decode", file=sys.stderr)
            return 2
        print(table)  # the table first: a failed write below does not lose it
        out = Path(argv[0])
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode.json").write_text(json.dumps(report, indent=1))
        for plot in sorted(Path(scratch).iterdir()):
            shutil.move(str(plot), out / plot.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

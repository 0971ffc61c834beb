"""Launch gaps of profiled decode runs: the timed step minus the time the step's kernels ran.

    python benchmarks/launch_gaps.py DECODE_JSON...

Reads `hisparse-bench decode --profile` reports (decode.json) and prints, per profiled run, the
profiled step, the kernels' busy time (the time at least one kernel ran: a record copy beside
other kernels counts once), the unprofiled TPOT of the same run (its median; the profiler widens
the gaps between kernels, so the profiled step overstates them) and the gap, in ms and as a share
of the TPOT. Reports written before the profile carried `tpot_seconds` are joined to their timing
row by mode, context, trace and run. The last columns set the gap against what the roofline
issue's target allows: the kernels a step, the gap a kernel, and what a step at 85% of its
roofline leaves beyond its bytes for each kernel (profile.kernel_budget; "-" where the report
lacks the roofline or the kernel count). The report column is the report's path (without a
trailing /decode.json); CPU profiles (no kernel events) are left out. A GPU profile's times must
be finite numbers >= 0, its profiled step, TPOT, kernels a step and roofline (where the report has
them) > 0, its context and batch integers >= 1: anything else is refused in one line naming the
report and the field (benchmarks/script_checks.py, shared with byte_bounds.py).
"""

from __future__ import annotations

import os
import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import TARGET_SHARE, kernel_budget, kernels_busy

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import count, finite, number, text  # noqa: E402


def _optional(p: dict, key: str, what: str, unit: str) -> float | None:
    """A profile field a report may lack (older reports): None when absent, else a finite number
    > 0 (a GPU step has kernels and a roofline), or ValueError naming it."""
    return None if key not in p else number(p[key], what, unit=unit, positive=True)


def gaps(report: dict) -> list[dict]:
    """One entry per GPU profile of the report: its figures, or {"unjoined": why} when it has no
    TPOT to set against. ValueError (a field that is not what a profile holds: times finite and
    >= 0, the profiled step, the TPOT, the kernels a step and the roofline > 0 where given, context
    and batch integers >= 1) or KeyError on a malformed profile (main says which)."""
    rows = report.get("rows", [])
    out = []
    for i, p in enumerate(report.get("profiles", [])):
        seconds = {c: number(v, f"profile {i}'s seconds[{c!r}]") for c, v in p["seconds"].items()}
        if not any(seconds.values()):
            continue  # a CPU profile: no kernel events
        context = count(p.get("context"), f"profile {i}'s context")
        mode = text(p.get("mode"), f"profile {i}'s mode")
        run = text(p.get("run", "capacity"), f"profile {i}'s run")
        trace = text(p.get("trace"), f"profile {i}'s trace", optional=True)
        tpot = p.get("tpot_seconds")
        if tpot is None:
            match = [r for r in rows if (r["mode"], r["context"], r.get("trace"), r["run"])
                     == (mode, context, trace, run)]
            if len(match) != 1:  # said by main, not dropped silently
                why = "no TPOT and no timing row to join" if not match else f"no TPOT and {len(match)} timing rows that match"
                out.append(dict(mode=mode, context=context, run=run, unjoined=why))
                continue
            tpot = number(match[0]["tpot_ms_median"], f"the timing row of profile {i}'s tpot_ms_median",
                          unit="ms", positive=True) * 1e-3
        tpot = number(tpot, f"profile {i}'s TPOT", positive=True)
        kernels = _optional(p, "kernels_per_step", f"profile {i}'s kernels_per_step", "kernels")
        roofline = _optional(p, "roofline_seconds", f"profile {i}'s roofline_seconds", "seconds")
        checked = dict(p, seconds=seconds, tpot_seconds=tpot, kernels_per_step=kernels, roofline_seconds=roofline)
        if "busy_seconds" in p:
            checked["busy_seconds"] = number(p["busy_seconds"], f"profile {i}'s busy_seconds")
        if p.get("io_overlap") is not None:
            hidden = number(p["io_overlap"]["hidden_seconds"], f"profile {i}'s io_overlap.hidden_seconds")
            checked["io_overlap"] = dict(p["io_overlap"], hidden_seconds=hidden)
        busy = kernels_busy(checked)
        budget = kernel_budget(checked)  # None without the kernel count or the roofline: "-"
        entry = dict(mode=mode, context=context, trace=trace, batch=count(p.get("batch"), f"profile {i}'s batch"),
                     run=run, profiled=number(p["step_seconds"], f"profile {i}'s step_seconds", positive=True),
                     busy=busy, tpot=tpot, gap=tpot - busy, launches=budget and budget["kernels"],
                     per_kernel=budget and budget["per_kernel"])
        # The figures as the table shows them (ms, us): finite, or the report's values are not a profile's.
        finite([entry["profiled"] * 1e3, busy * 1e3, tpot * 1e3, entry["gap"] * 1e3, entry["gap"] / tpot,
                *((entry["gap"] / kernels * 1e6, budget["per_kernel"] * 1e6) if budget else ())],
               f"profile {i}'s figures")
        out.append(entry)
    return out


def _label(path: str) -> str:
    return path.removesuffix("/decode.json")


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    found = []
    for path in paths:  # every report is read and checked before the table is printed
        try:
            report = load_report(path, keys=("profiles",))
            entries = gaps(report)
        except BenchError as err:
            print(f"launch_gaps: error: {err}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError, ZeroDivisionError) as err:
            print(f"launch_gaps: error: {path}: a profile or timing row lacks a field or holds a wrong value "
                  f"({type(err).__name__}: {str(err)[:300]}); pass a decode.json written by hisparse-bench decode --profile",
                  file=sys.stderr)
            return 2
        if not entries:
            print(f"launch_gaps: error: {path}: no GPU profile in it; pass a decode.json of a hisparse-bench decode "
                  "--profile run on a GPU", file=sys.stderr)
            return 2
        found.append((path, entries))
    print("| report | mode | run | context | trace | batch | profiled step ms | kernels' busy ms | TPOT ms | gap ms "
          f"| gap / TPOT | kernels a step | gap a kernel us | {TARGET_SHARE:.0%} of the roofline leaves a kernel us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path, entries in found:
        for g in entries:
            if g.get("unjoined"):
                print(f"launch_gaps: {path}: the {g['mode']} {g['run']} profile at context {g['context']} has "
                      f"{g['unjoined']}: left out", file=sys.stderr)
                continue
            launches = (f"{g['launches']:.0f} | {g['gap'] / g['launches'] * 1e6:.2f} | {g['per_kernel'] * 1e6:.2f}"
                        if g["launches"] else "- | - | -")
            print(f"| {_label(path)} | {g['mode']} | {g['run']} | {g['context']} | {g['trace']} | {g['batch']} "
                  f"| {g['profiled'] * 1e3:.3f} | {g['busy'] * 1e3:.3f} | {g['tpot'] * 1e3:.3f} | {g['gap'] * 1e3:.3f} "
                  f"| {g['gap'] / g['tpot']:.1%} | {launches} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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
trailing /decode.json); CPU profiles (no kernel events) are left out.
"""

from __future__ import annotations

import math
import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import TARGET_SHARE, kernel_budget, kernels_busy


def _seconds(value, what: str) -> float:
    """A finite float >= 0 of a report field, or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} is {value!r}, not a finite number of seconds >= 0")
    return float(value)


def gaps(report: dict) -> list[dict]:
    """One entry per GPU profile of the report: its figures, or {"unjoined": why} when it has no
    TPOT to set against. ValueError or KeyError on a malformed profile (main says which)."""
    rows = report.get("rows", [])
    out = []
    for i, p in enumerate(report.get("profiles", [])):
        seconds = {c: _seconds(v, f"profile {i}'s seconds[{c!r}]") for c, v in p["seconds"].items()}
        if not any(seconds.values()):
            continue  # a CPU profile: no kernel events
        run = p.get("run", "capacity")
        tpot = p.get("tpot_seconds")
        if tpot is None:
            match = [r for r in rows if (r["mode"], r["context"], r.get("trace"), r["run"])
                     == (p["mode"], p["context"], p.get("trace"), run)]
            if len(match) != 1:  # said by main, not dropped silently
                why = "no TPOT and no timing row to join" if not match else f"no TPOT and {len(match)} timing rows that match"
                out.append(dict(mode=p["mode"], context=p.get("context"), run=run, unjoined=why))
                continue
            tpot = _seconds(match[0]["tpot_ms_median"], f"the timing row of profile {i}'s tpot_ms_median") * 1e-3
        tpot = _seconds(tpot, f"profile {i}'s TPOT")
        if tpot <= 0:
            raise ValueError(f"profile {i}'s TPOT is 0")
        busy = kernels_busy(dict(p, seconds=seconds))
        budget = kernel_budget(dict(p, seconds=seconds, tpot_seconds=tpot))
        out.append(dict(mode=p["mode"], context=p["context"], trace=p.get("trace"), batch=p["batch"], run=run,
                        profiled=_seconds(p["step_seconds"], f"profile {i}'s step_seconds"), busy=busy, tpot=tpot,
                        gap=tpot - busy, launches=budget and budget["kernels"],
                        per_kernel=budget and budget["per_kernel"]))
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
                  f"({type(err).__name__}: {err}); pass a decode.json written by hisparse-bench decode --profile",
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

"""Launch gaps of profiled decode runs: the timed step minus the sum of the step's kernels.

    python benchmarks/launch_gaps.py DECODE_JSON...

Reads `hisparse-bench decode --profile` reports (decode.json) and prints, per profiled run, the
profiled step, the kernels' sum, the unprofiled TPOT of the same run (its median; the profiler
widens the gaps between kernels, so the profiled step overstates them) and the gap, in ms and as a
share of the TPOT. Reports written before the profile carried `tpot_seconds` are joined to their
timing row by mode, context, trace and run. The last columns set the gap against what the roofline
issue's target allows: the kernels a step, the gap a kernel, and what a step at 85% of its roofline
leaves beyond its bytes for each kernel (profile.kernel_budget; "-" where the report lacks the
roofline or the kernel count).
"""

from __future__ import annotations

import sys

from hisparse_jax.bench.decode.report import load_report
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.profile import TARGET_SHARE, kernel_budget


def gaps(report: dict) -> list[dict]:
    rows = report.get("rows", [])
    out = []
    for p in report.get("profiles", []):
        tpot = p.get("tpot_seconds")
        if tpot is None:
            match = [r for r in rows if (r["mode"], r["context"], r.get("trace"), r["run"])
                     == (p["mode"], p["context"], p.get("trace"), p.get("run", "capacity"))]
            if len(match) != 1:  # said by main, not dropped silently
                out.append(dict(mode=p["mode"], context=p.get("context"), unjoined=True))
                continue
            tpot = match[0]["tpot_ms_median"] * 1e-3
        kernels = sum(p["seconds"].values())
        budget = kernel_budget(dict(p, tpot_seconds=tpot))
        out.append(dict(mode=p["mode"], context=p["context"], trace=p.get("trace"), batch=p["batch"],
                        profiled=p["step_seconds"], kernels=kernels, tpot=tpot, gap=tpot - kernels,
                        launches=budget and budget["kernels"], per_kernel=budget and budget["per_kernel"]))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print("| report | mode | context | trace | batch | profiled step ms | kernels' sum ms | TPOT ms | gap ms | gap / TPOT "
          f"| kernels a step | gap a kernel us | {TARGET_SHARE:.0%} of the roofline leaves a kernel us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        try:
            report = load_report(path, keys=("profiles",))
            found = gaps(report)
        except BenchError as err:
            print(f"launch_gaps: error: {err}", file=sys.stderr)
            return 2
        except (KeyError, TypeError, AttributeError) as err:
            print(f"launch_gaps: error: {path}: a profile or timing row lacks a field "
                  f"({type(err).__name__}: {err})", file=sys.stderr)
            return 2
        name = report.get("deployment") or report.get("family")
        for g in found:
            if g.get("unjoined"):
                print(f"launch_gaps: {path}: the {g['mode']} profile at context {g['context']} has no TPOT and no "
                      "timing row to join: left out", file=sys.stderr)
                continue
            launches = (f"{g['launches']:.0f} | {g['gap'] / g['launches'] * 1e6:.2f} | {g['per_kernel'] * 1e6:.2f}"
                        if g["launches"] else "- | - | -")
            print(f"| {name} | {g['mode']} | {g['context']} | {g['trace']} | {g['batch']} | {g['profiled'] * 1e3:.3f} "
                  f"| {g['kernels'] * 1e3:.3f} | {g['tpot'] * 1e3:.3f} | {g['gap'] * 1e3:.3f} | {g['gap'] / g['tpot']:.1%} "
                  f"| {launches} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`hisparse-bench decode`: decode throughput at the capacity wall, HiSparse vs full-KV.

For each context length it finds, from an honest byte account of the real
decode state (hisparse_jax.bench.decode.capacity), the largest batch each mode fits
under the device (HBM) budget for decode state and the host budget for pools,
runs the jitted decode at that batch, and reports throughput, TPOT (min /
median / max over the timed calls), miss rate, IO per token, bytes per request
and the HiSparse / full-KV ratios with their spread. An equal-batch run
(HiSparse at the baseline's batch) compares TPOT directly; a no-IO run
(--no-io: RESOLVE without the record copy) splits resolve cost from IO.

Every argument and output folder is checked before anything is compiled; a
bad one ends the command with a one-line error, as does a run whose batch 1
does not fit the budgets (found by compiling the decode at batch 1, to name a
budget that fits). The bench refuses to time the pure-JAX reference RESOLVE unless asked
(--allow-reference), and names the implementation that ran.

Without arguments it runs a small CPU default (DSA tiny preset, about a
minute on 2 cores). On a GPU, run a deployment slice: a few layers of a real
model with one GPU's share of weights, heads and HBM (docs/deployments.md),
at 32K, 128K and 256K, under both trace calibrations:
  hisparse-bench decode --deployment glm5-h200 --profile
(--explain prints the slice's derivation and each run's batch, and exits).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax

from ... import _ffi
from ...selection import synthetic as traces
from ...models.family import decode_weights
from ...models.weights import weight_bytes
from .. import outputs
from .. import profile as profile_lib
from ..errors import BenchError
from .. import roofline
from ..progress import Progress
from . import report as report_lib
from .plan import ContextPlan, Plan, RunPlan, build_plan
from .plots import write_plots
from .report import MODE_NAMES, fmt_bytes, format_table
from .runner import (DecodeRun, RecordedSelection, profile_run, start_run, time_in_turns, tokens_needed,
                     without_io)


def run(args) -> int:
    """hisparse-bench decode: plans (a BenchError on a bad argument), then prints the plan
    (--explain) or times it, writes decode.json (and plots) and prints the tables."""
    if args.profile_dir is not None and not args.profile:
        raise BenchError("--profile-dir keeps the traces of --profile's profiled calls; add --profile "
                         "(or drop --profile-dir)")
    if args.profile and jax.default_backend() == "cpu" and not args.explain:
        # The profile's plumbing runs on a CPU (and is tested there), but XLA:CPU's profiler reports
        # no device kernels and its "HBM" is the host's memory: say so before a table of zeros.
        print("hisparse-bench: note: --profile measures device time per kernel on a GPU; on XLA:CPU the "
              "kernel categories stay at zero and the bandwidths are the host's", file=sys.stderr)
    if not args.explain:  # --explain writes nothing
        outputs.check_folder("--out", args.out)
        if args.profile_dir is not None:
            outputs.check_folder("--profile-dir", args.profile_dir)
    plan_ = build_plan(args)
    if args.explain:
        print(explain(plan_))
        return 0
    report = run_decode(args, plan_)
    # The tables first: a report that cannot be written (a disk filled meanwhile) loses no result.
    print(header(report))
    print(format_table(report))
    if report["profiles"]:
        print(profile_lib.format_profile(report["profiles"], MODE_NAMES, report.get("family")))
    written = outputs.write_report(Path(args.out), "decode.json", report, None if args.no_plots else write_plots)
    print("wrote " + ", ".join(map(str, written)))
    return 0


def _measure(args, plan_: Plan, c: ContextPlan, weights, progress: Progress) -> tuple[dict, list, dict | None]:
    """(RunPlan.key -> DecodeTiming of every run at one context (and ("no-IO", "hisparse", trace)),
    the profiles of the capacity runs with --profile, the bandwidths measured before them)."""
    trace_steps = tokens_needed(c.context, args.steps, args.reps, args.no_io, args.profile) - c.context
    timings, profiles = {}, []

    def name(r: RunPlan) -> str:
        selection = ("" if r.trace is None else f", {r.trace.name}" if isinstance(r.trace, RecordedSelection)
                     else f", {r.trace.name} trace")  # "recorded STEM", "glm-5.1 trace"
        return f"{MODE_NAMES[r.mode]} @ {c.context}, batch {r.batch} ({r.kind}{selection})"

    def start(r: RunPlan) -> DecodeRun:
        config = (dataclasses.replace(c.config, prefetch=True, overlap_groups=args.overlap_groups)
                  if r.kind == "prefetch" and args.overlap_groups > 1 else
                  dataclasses.replace(c.config, prefetch=True) if r.kind == "prefetch" else c.config)
        run = start_run(plan_.family, config, weights, r.mode, r.batch, c.context, args.steps, fill=args.fill,
                        trace=r.trace, trace_steps=trace_steps, skip_indexer=args.selection == "trace-no-indexer")
        progress.advance(f"compiled {name(r)}")
        return run

    def rounds(label):
        return lambda i: progress.advance(f"{label}: timed call {i + 1}/{args.reps}", log=i + 1 == args.reps)

    def after_timing(r: RunPlan, run):
        """The capacity (and prefetch) runs' profile, then (hisparse) the no-IO run, which takes over
        the state."""
        if r.kind == "equal batch":
            return
        if args.profile:
            label = f"{r.mode}{'-prefetch' if r.kind == 'prefetch' else ''}-{c.context}"
            if isinstance(r.trace, RecordedSelection):  # a folder name: the file's, not its path
                label += f"-recorded-{Path(r.trace.path).stem}"
            elif r.trace is not None:
                label += f"-{r.trace.name}"
            trace_dir = None if args.profile_dir is None else str(Path(args.profile_dir) / label)
            profiled = profile_run(run, bandwidths, trace_dir)
            profiles.append(dict(profiled, trace=None if r.trace is None else r.trace.name, run=r.kind,
                                 tpot_seconds=timings[r.key].step_seconds))
            progress.advance(f"profiled {name(r)}")
        if args.no_io and r.mode == "hisparse" and r.kind == "capacity":
            quiet = without_io(run)
            progress.advance(f"compiled {name(r)} without the record copy (no-IO)")
            (timings[("no-IO",) + r.key[1:]],) = time_in_turns([quiet], args.reps, rounds("no-IO"))

    # Measured on every GPU run, profiled or not: HiSparse's TPOT carries its miss IO over the host
    # link, which differs from machine to machine (30-46 GB/s on H100s of one model), so a TPOT
    # compared across runs needs the link it met. On a CPU only for --profile (the figure is the
    # host's there, and takes seconds).
    measure = args.profile or jax.default_backend() != "cpu"
    bandwidths = roofline.measure_bandwidths(c.config.record_bytes) if measure else None
    if plan_.in_turns:
        runs = {r: start(r) for r in c.runs}
        measured = time_in_turns(list(runs.values()), args.reps, rounds(f"context {c.context}, in turns"))
        timings.update(zip((r.key for r in runs), measured))
        for r, run in runs.items():
            after_timing(r, run)
    else:
        for r in c.runs:
            run = start(r)
            (timings[r.key],) = time_in_turns([run], args.reps, rounds(name(r)))
            after_timing(r, run)
            del run  # its state goes before the next one is built
    return timings, profiles, bandwidths


def _progress_total(args, plan_: Plan) -> int:
    """Progress steps: each run's start, each round of timed calls (per run when one at a time)."""
    total = 0
    for c in plan_.contexts:
        total += len(c.runs) + args.reps * (1 if plan_.in_turns else len(c.runs))
        hisparse = sum(r.kind == "capacity" and r.mode == "hisparse" for r in c.runs)
        capacity_runs = sum(r.kind in ("capacity", "prefetch") for r in c.runs)
        total += hisparse * (1 + args.reps) if args.no_io else 0
        total += capacity_runs if args.profile else 0
    return total


def run_decode(args, plan_: Plan) -> dict:
    """Times every planned run; the decode.json report."""
    rows, ratios, notes, profiles, bandwidths = [], [], [], [], []
    notes += [t.describe() if isinstance(t, RecordedSelection) else traces.describe(t) for t in plan_.traces]
    calibrated = [t for t in plan_.traces if isinstance(t, traces.TraceConfig)]
    if calibrated and plan_.contexts[0].config.page_size > 1:
        notes.append(f"records are pages of {plan_.contexts[0].config.page_size} tokens: the calibrations are "
                     "token-level figures applied to pages (page-level locality uncalibrated)")
    with Progress(_progress_total(args, plan_), "decode") as progress:
        for c in plan_.contexts:
            # the decode layout (the kit: merged input projections), made once here, never per step
            weights = decode_weights(plan_.family, c.config, plan_.family.init_weights(c.config, 0))
            timings, measured, links = _measure(args, plan_, c, weights, progress)
            profiles += measured
            if links is not None:
                bandwidths.append({"context": c.context, "hbm_bytes_per_second": links["hbm"],
                                   "host_link_bytes_per_second": links["host link"]})
            del weights
            for (kind, mode, trace), timing in timings.items():
                limited_by = {"equal batch": "baseline's batch", "prefetch": "HiSparse's capacity"}.get(
                    kind, c.caps[mode].limited_by)
                rows.append(dict(report_lib.row(kind, timing, c.caps[mode], c.config.record_bytes, c.config,
                                                limited_by), trace=trace))
            for trace in [t.name for t in plan_.traces] or [None]:
                pair = (("capacity", "device", trace), ("capacity", "hisparse", trace))
                if set(pair) <= timings.keys():
                    entry = report_lib.ratios(c.context, timings[pair[1]], timings[pair[0]],
                                              timings.get(("equal batch", "hisparse", trace)), c.caps,
                                              timings.get(("prefetch", "hisparse", trace)))
                    at_roofline = report_lib.roofline_ratio(measured, c.context, trace)
                    if at_roofline is not None:  # --profile: the measured ratio's yardstick
                        entry["roofline_throughput_hisparse_over_full_kv"] = at_roofline
                    ratios.append(dict(entry, trace=trace))
    config = plan_.contexts[-1].config
    platform = _ffi.platform_of(jax.default_backend())
    return dict(
        family=getattr(args.family, "name", args.family), preset=args.preset, deployment=args.deployment,
        derivation=None if plan_.derivation is None else plan_.derivation.lines(),
        device=str(jax.devices()[0].device_kind),
        backend=jax.default_backend(), jax=jax.__version__,
        resolve_implementation=f"ffi on {platform}" if plan_.implementation == "ffi" else "reference",
        hisparse_jax_path=str(Path(_ffi.__file__).parent),
        device_budget_bytes=plan_.device_budget, host_budget_bytes=plan_.host_budget, max_batch_cap=args.max_batch,
        steps=args.steps, reps=args.reps, timing=plan_.timing_note, fill=args.fill, selection=args.selection,
        traces=[t.name for t in plan_.traces], notes=notes, overrides=plan_.overrides, num_layers=config.num_layers,
        recorded_trace=next((t.as_dict() for t in plan_.traces if isinstance(t, RecordedSelection)), None),
        ratio_range=report_lib.range_note(plan_.in_turns), rows=rows, ratios=ratios, profiles=profiles,
        overlap_groups=args.overlap_groups, bandwidths=bandwidths,
    )


def header(report: dict) -> str:
    model = (f"deployment slice {report['deployment']} ({report['family']})" if report.get("deployment")
             else f"{report['family']} {report['preset']}")
    lines = [
        f"{model} on {report['device']} (jax {report['jax']}); RESOLVE: "
        f"{report['resolve_implementation']}; device budget {fmt_bytes(report['device_budget_bytes'])}, "
        f"host budget {fmt_bytes(report['host_budget_bytes'])}, batch cap {report['max_batch_cap']}",
        f"{report['reps']} timed calls of {report['steps']} decode steps per run after an untimed one, "
        f"{report['timing']}; TPOT = call time / steps",
        f"{report['num_layers']} layers (a slice of a real model: per-request bytes scale with layers); "
        f"state from {report['fill']}, selection by {report['selection']}"
        # the synthetic trace's generator (a recorded trace has none; the ids of both are counted)
        + (" (its state on device is not in the byte account)" if report["selection"].startswith("trace") else ""),
        *report["notes"],
    ]
    if report.get("overlap_groups", 1) > 1:
        lines.append(f"prefetch run: {report['overlap_groups']} overlap groups (each layer's RESOLVE and attention per "
                     "group of streams); HiSparse's batches rounded down to a multiple of it")
    if report.get("bandwidths"):
        lines.append("measured before each context's runs: " + "; ".join(
            f"{b['context']}: HBM {b['hbm_bytes_per_second'] / 1e9:.0f} GB/s, host link "
            f"{b['host_link_bytes_per_second'] / 1e9:.1f} GB/s (RESOLVE's miss fetch)" for b in report["bandwidths"]))
    if report["ratios"]:
        lines.append(report["ratio_range"])
    return "\n".join(lines)


def explain(plan_: Plan) -> str:
    """The slice's derivation (with --deployment) and every run's batch, from the plan alone."""
    lines = []
    if plan_.derivation is not None:
        config = plan_.contexts[0].config
        per_layer = {part: n / config.num_layers for part, n in weight_bytes(plan_.family, config).items()}
        lines += plan_.derivation.lines(per_layer)
    lines.append(f"device budget {fmt_bytes(plan_.device_budget)}, host budget {fmt_bytes(plan_.host_budget)}")
    if plan_.state_only:
        lines.append("on a CPU: batches from the decode state alone, nothing compiled; on the GPU the compiled "
                     "program's working memory counts too, so its batches can be smaller")
    for c in plan_.contexts:
        for mode, cap in c.caps.items():
            working = ("" if plan_.state_only else
                       f"; compiled working memory {fmt_bytes(cap.working_fixed)} + "
                       f"{fmt_bytes(cap.working_per_request + cap.trace_ids_per_request)} per request "
                       f"(trace ids {fmt_bytes(cap.trace_ids_per_request)}), "
                       f"{fmt_bytes(cap.working_at_max_batch)} at batch {cap.max_batch}")
            lines.append(f"context {c.context}: {MODE_NAMES[mode]} batch {cap.max_batch} (limited by "
                         f"{cap.limited_by}); per request {fmt_bytes(cap.device_per_request)} device, "
                         f"{fmt_bytes(cap.host_per_request)} host; fixed {fmt_bytes(cap.device_fixed)} device"
                         + working)
        lines.append(f"context {c.context}: runs " + "; ".join(
            f"{r.kind} {MODE_NAMES[r.mode]} batch {r.batch}" + ("" if r.trace is None else f" ({r.trace.name})")
            for r in c.runs))
    return "\n".join(lines)

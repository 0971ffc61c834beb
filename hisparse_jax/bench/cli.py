"""`hisparse-bench decode`: decode throughput at the capacity wall, HiSparse vs full-KV.

For each context length it finds, from an honest byte account of the real
decode state (hisparse_jax.bench.capacity), the largest batch each mode fits
under the device (HBM) budget for decode state and the host budget for pools,
runs the jitted decode at that batch, and reports throughput, TPOT (min /
median / max over the timed calls), miss rate, IO per token, bytes per request
and the HiSparse / full-KV ratios with their spread. An equal-batch run
(HiSparse at the baseline's batch) compares TPOT directly; a no-IO run
(--no-io: RESOLVE without the record copy) splits resolve cost from IO.

Every argument is checked before anything is compiled; a bad one, or a run
whose batch 1 does not fit the budgets, ends the command with a one-line
error. The bench refuses to time the pure-JAX reference RESOLVE unless asked
(--allow-reference), and names the implementation that ran.

Without arguments it runs a small CPU default (DSA tiny preset, about a
minute on 2 cores). On a GPU, run a deployment slice: a few layers of a real
model with one GPU's share of weights, heads and HBM (docs/deployments.md),
at 32K, 128K and 256K, under both trace calibrations:
  hisparse-bench decode --deployment glm5-h200 --profile
(--explain prints the slice's derivation and each run's batch, and exits).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import jax

from .. import _ffi
from ..selection import synthetic as traces
from ..models import known_families
from ..models.weights import weight_bytes
from . import report as report_lib
from .deployments import DEPLOYMENTS
from .plan import CPU_DEFAULTS, DEPLOYMENT_DEFAULTS, BenchError, ContextPlan, Plan, RunPlan, build_plan
from .progress import Progress
from .report import MODE_NAMES, fmt_bytes, format_table, write_plots
from . import profile as profile_lib
from . import policies as policies_command
from .runner import (FILLS, DecodeRun, RecordedSelection, profile_run, start_run, time_in_turns, tokens_needed,
                     without_io)

__all__ = ["main", "format_table", "write_plots"]



class _Parser(argparse.ArgumentParser):
    """argparse without the usage dump: an error is one line (see --help for the usage)."""

    def error(self, message):
        raise BenchError(message, status=2)


def _number(kind, what: str, minimum):
    """An argparse type: a `kind` number >= minimum (finite), else a message naming `what`."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and value >= minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = what
    return parse


_count = _number(int, "a positive integer", 1)
_tokens = _number(int, "a positive number of tokens", 1)
_size = _number(float, "a positive size", 1e-12)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hisparse-bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="decode throughput at the capacity wall",
                       description=__doc__.split("\n\n", 1)[1].split("\n\nWithout")[0])
    cpu, slc = CPU_DEFAULTS, DEPLOYMENT_DEFAULTS
    d.add_argument("--deployment", default=None, choices=list(DEPLOYMENTS),
                   help="a deployment slice (docs/deployments.md): sets the model, its per-GPU share and the "
                        "device budget, and the defaults marked 'deployment' below")
    d.add_argument("--explain", action="store_true",
                   help="print the slice's derivation (with --deployment) and each run's batch, then exit")
    d.add_argument("--family", default=None, choices=known_families(), help=f"model family (default: {cpu['family']})")
    d.add_argument("--preset", default=None, help=f"family preset, tiny or realistic (default: {cpu['preset']})")
    d.add_argument("--contexts", type=_tokens, nargs="+", default=None,
                   help=f"prompt tokens per request, one measurement each (default: {cpu['contexts']}; "
                        f"deployment: {slc['contexts']})")
    budget = d.add_mutually_exclusive_group()
    budget.add_argument("--device-budget-mib", type=_size, default=None,
                        help="HBM budget for one decode state and the decode's working memory (default: "
                             f"{cpu['device_budget_mib']}; deployment: its derivation)")
    budget.add_argument("--device-budget-gib", type=_size, default=None, help="the same in GiB")
    d.add_argument("--host-budget-gib", type=_size, default=None,
                   help="pinned host budget for the pools of one state (default: "
                        f"{cpu['host_budget_gib']}; deployment: {slc['host_budget_gib']})")
    d.add_argument("--max-batch", type=_count, default=None,
                   help=f"cap on the batch of any run (default: {cpu['max_batch']}; deployment: {slc['max_batch']})")
    d.add_argument("--top-k", type=_count, default=None, help="k, records selected per stream and step")
    d.add_argument("--hot-slots", type=_count, default=None, help="B >= k, hot slots per stream")
    d.add_argument("--num-layers", type=_count, default=None,
                   help="layers of the model (a slice of the real model's; per-request bytes scale with it)")
    d.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="other Config overrides, e.g. index_share=4 dtype=float32")
    d.add_argument("--fill", default=None, choices=FILLS,
                   help="(default: prefill; deployment: synthetic) prefill: the model's dense prefill of random prompts; synthetic: hashed "
                        "non-zero records and metadata, no O(T^2) prefill (long contexts)")
    d.add_argument("--selection", default=None, choices=["indexer", "trace", "trace-no-indexer", "recorded"],
                   help="(default: indexer; deployment: trace) indexer: the model's own top-k (random weights: little locality); trace: "
                        "the calibrated synthetic trace of docs/traces.md (the indexer still runs); "
                        "trace-no-indexer: the trace without computing the indexer (shows its cost); "
                        "recorded: the selections of a recorded trace, --trace-file (the indexer still runs)")
    d.add_argument("--trace", default=None, nargs="+", choices=list(traces.CALIBRATIONS),
                   help="the trace calibrations, one comparison each (docs/traces.md): glm-5.1 reproduces "
                        "GLM-5.1's published LRU misses, deepseek-v3.2 DeepSeek-V3.2's ~44%% step overlap "
                        f"(default: {' '.join(cpu['trace'])}; deployment: {' '.join(slc['trace'])}; "
                        "not with --selection recorded, nor are the --trace-* overrides)")
    d.add_argument("--trace-beta", type=float, default=None, help="override the calibration's beta")
    d.add_argument("--trace-rho-e", type=float, default=None, help="override the calibration's rho_e")
    d.add_argument("--trace-memoryless-layers", type=int, default=None,
                   help="leading selecting layers with no locality (real models: layers 0-1; default: 0)")
    d.add_argument("--trace-file", default=None, metavar="PATH",
                   help="with --selection recorded (required there, refused elsewhere): a recorded selection trace "
                        "(hisparse_jax.recorded), one comparison labelled by the file. Its ids are replayed as "
                        "recorded: the model's selecting layer g of G replays trace layer g x L // G, stream i of "
                        "the batch trace stream i mod its streams (Quest's and NSA's KV heads of a stream share "
                        "its ids), run step t trace step t. Its k must be --top-k and its page size the model's, it "
                        "must hold every step a run decodes, and the contexts must be at least the trace's (every "
                        "id sealed when selected); a longer context keeps the trace's locality at its own context")
    d.add_argument("--no-io", action="store_true", help="also time HiSparse without the record copy")
    d.add_argument("--prefetch", action="store_true",
                   help="also time HiSparse at its capacity batch with prefetch (each layer's misses copied on a "
                        "stream of its own, joined before the layer reads; with index_share > 1 a group's later "
                        "layers' copies overlap the earlier layers), timed with the run without (in turns when both states "
                        "fit in memory); with "
                        "--profile, the share of the copy time hidden behind compute")
    d.add_argument("--profile", action="store_true",
                   help="profile one more call of each capacity run: device time per step by category "
                        "next to the step's roofline (GPU; hisparse_jax.bench.profile)")
    d.add_argument("--profile-dir", default=None,
                   help="keep the profiler traces there, one folder per run (open them in Perfetto)")
    d.add_argument("--steps", type=_count, default=None,
                   help=f"decode steps per timed call (default: {cpu['steps']}; deployment: {slc['steps']})")
    d.add_argument("--reps", type=_count, default=None,
                   help="timed calls per run, after one untimed call; min / median / max reported "
                        f"(default: {cpu['reps']}; deployment: {slc['reps']})")
    d.add_argument("--modes", nargs="+", default=["device", "hisparse"], choices=["device", "hisparse"])
    d.add_argument("--no-equal-batch", action="store_true", help="skip HiSparse at the baseline's batch")
    d.add_argument("--one-at-a-time", action="store_true",
                   help="time each run alone, one state in memory at a time (by default the runs of a "
                        "context are timed in turns when their states fit in memory together)")
    d.add_argument("--allow-reference", action="store_true",
                   help="time the pure-JAX reference RESOLVE when no compiled handler is available")
    d.add_argument("--out", default="results/decode", help="folder for decode.json and plots")
    d.add_argument("--no-plots", action="store_true")
    policies_command.add_parser(sub)
    return p


def _measure(args, plan_: Plan, c: ContextPlan, weights, progress: Progress) -> tuple[dict, list]:
    """(RunPlan.key -> DecodeTiming of every run at one context (and ("no-IO", "hisparse", trace)),
    the profiles of the capacity runs with --profile)."""
    trace_steps = tokens_needed(c.context, args.steps, args.reps, args.no_io, args.profile) - c.context
    timings, profiles = {}, []

    def name(r: RunPlan) -> str:
        selection = ("" if r.trace is None else f", {r.trace.name}" if isinstance(r.trace, RecordedSelection)
                     else f", {r.trace.name} trace")  # "recorded trace FILE", "glm-5.1 trace"
        return f"{MODE_NAMES[r.mode]} @ {c.context}, batch {r.batch} ({r.kind}{selection})"

    def start(r: RunPlan) -> DecodeRun:
        config = dataclasses.replace(c.config, prefetch=True) if r.kind == "prefetch" else c.config
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
            profiles.append(dict(profiled, trace=None if r.trace is None else r.trace.name, run=r.kind))
            progress.advance(f"profiled {name(r)}")
        if args.no_io and r.mode == "hisparse" and r.kind == "capacity":
            quiet = without_io(run)
            progress.advance(f"compiled {name(r)} without the record copy (no-IO)")
            (timings[("no-IO",) + r.key[1:]],) = time_in_turns([quiet], args.reps, rounds("no-IO"))

    bandwidths = profile_lib.measure_bandwidths(c.config.record_bytes) if args.profile else None
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
    return timings, profiles


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
    rows, ratios, notes, profiles = [], [], [], []
    notes += [t.describe() if isinstance(t, RecordedSelection) else traces.describe(t) for t in plan_.traces]
    calibrated = [t for t in plan_.traces if isinstance(t, traces.TraceConfig)]
    if calibrated and plan_.contexts[0].config.page_size > 1:
        notes.append(f"records are pages of {plan_.contexts[0].config.page_size} tokens: the calibrations are "
                     "token-level figures applied to pages (page-level locality uncalibrated)")
    with Progress(_progress_total(args, plan_), "decode") as progress:
        for c in plan_.contexts:
            weights = plan_.family.init_weights(c.config, 0)
            timings, measured = _measure(args, plan_, c, weights, progress)
            profiles += measured
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
                    ratios.append(dict(entry, trace=trace))
    config = plan_.contexts[-1].config
    platform = _ffi.platform_of(jax.default_backend())
    return dict(
        family=args.family, preset=args.preset, deployment=args.deployment,
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
    for c in plan_.contexts:
        for mode, cap in c.caps.items():
            lines.append(f"context {c.context}: {MODE_NAMES[mode]} batch {cap.max_batch} (limited by "
                         f"{cap.limited_by}); per request {fmt_bytes(cap.device_per_request)} device, "
                         f"{fmt_bytes(cap.host_per_request)} host; fixed {fmt_bytes(cap.device_fixed)} device; "
                         f"compiled working memory {fmt_bytes(cap.working_fixed)} + "
                         f"{fmt_bytes(cap.working_per_request + cap.trace_ids_per_request)} per request "
                         f"(trace ids {fmt_bytes(cap.trace_ids_per_request)}), "
                         f"{fmt_bytes(cap.working_at_max_batch)} at batch {cap.max_batch}")
        lines.append(f"context {c.context}: runs " + "; ".join(
            f"{r.kind} {MODE_NAMES[r.mode]} batch {r.batch}" + ("" if r.trace is None else f" ({r.trace.name})")
            for r in c.runs))
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.command == "policies":
            args.argv = list(sys.argv[1:] if argv is None else argv)  # for the report's command line
            return policies_command.run(args)
        plan_ = build_plan(args)
    except BenchError as err:
        print(f"hisparse-bench: error: {err}", file=sys.stderr)
        return err.status
    if args.explain:
        print(explain(plan_))
        return 0
    report = run_decode(args, plan_)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(report, indent=1))
    print(header(report))
    print(format_table(report))
    if report["profiles"]:
        print(profile_lib.format_profile(report["profiles"]))
    written = [] if args.no_plots else write_plots(report, out)
    print(f"wrote {out / 'decode.json'}" + "".join(f", {p}" for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

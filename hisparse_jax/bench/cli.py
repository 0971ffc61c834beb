"""`hisparse-bench decode`: decode throughput at the capacity wall, HiSparse vs full-KV.

For each context length it finds, from an honest byte account of the real
decode state (hisparse_jax.bench.capacity), the largest batch each mode fits
under the device (HBM) budget for decode state and the host budget for pools,
runs the jitted decode at that batch, and reports throughput, TPOT, miss rate,
IO per token, bytes per request and the HiSparse / full-KV ratios. An
equal-batch run (HiSparse at the baseline's batch) compares TPOT directly;
a no-IO run (--no-io: RESOLVE without the record copy) splits resolve cost
from IO.

Without arguments it runs a small CPU default (DSA tiny preset) in well under
a minute. On a GPU, pass the realistic preset, budgets, a synthetic fill (no
O(T^2) prefill) and the calibrated trace selection, e.g.
  hisparse-bench decode --family dsa --preset realistic --contexts 32768 131072 \\
      --device-budget-gib 24 --host-budget-gib 88 --fill synthetic --selection trace --no-io
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import jax
import numpy as np

from .. import traces
from ..models import get_family, known_families
from .capacity import Capacity, capacity
from .progress import Progress
from .runner import FILLS, decode_timing, decode_timings, tokens_needed

MiB, GiB = 2**20, 2**30


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hisparse-bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="decode throughput at the capacity wall")
    d.add_argument("--family", default="dsa", choices=known_families())
    d.add_argument("--preset", default="tiny", help="family preset (tiny, realistic)")
    d.add_argument("--contexts", type=int, nargs="+", default=[128, 192], help="prompt tokens per request")
    d.add_argument("--device-budget-mib", type=float, default=None, help="HBM budget for decode state")
    d.add_argument("--device-budget-gib", type=float, default=None)
    d.add_argument("--host-budget-gib", type=float, default=4.0, help="pinned host budget for pools")
    d.add_argument("--max-batch", type=int, default=16, help="cap on the batch of any run")
    d.add_argument("--top-k", type=int, default=None)
    d.add_argument("--hot-slots", type=int, default=None)
    d.add_argument("--layers", type=int, default=None, help="override n_layers (fewer than the real model)")
    d.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                   help="other Config overrides, e.g. index_share=4 d_ff=8192")
    d.add_argument("--fill", default="prefill", choices=FILLS,
                   help="prefill: the model's dense prefill of random prompts; synthetic: hashed "
                        "non-zero records and metadata, no O(T^2) prefill (long contexts)")
    d.add_argument("--selection", default="indexer", choices=["indexer", "trace", "trace-no-indexer"],
                   help="indexer: the model's own top-k (random weights: little locality); trace: "
                        "the calibrated synthetic trace of DESIGN.md section 7 (the indexer still runs); "
                        "trace-no-indexer: the trace without computing the indexer (shows its cost)")
    d.add_argument("--trace-beta", type=float, default=traces.TraceConfig.beta)
    d.add_argument("--trace-rho-e", type=float, default=traces.TraceConfig.rho_e)
    d.add_argument("--trace-memoryless-layers", type=int, default=0,
                   help="leading selecting layers with no locality (real models: layers 0-1)")
    d.add_argument("--no-io", action="store_true", help="also time HiSparse without the record copy")
    d.add_argument("--steps", type=int, default=8, help="decode steps per timed call")
    d.add_argument("--reps", type=int, default=2, help="timed calls (median reported)")
    d.add_argument("--modes", nargs="+", default=["device", "hisparse"], choices=["device", "hisparse"])
    d.add_argument("--no-equal-batch", action="store_true", help="skip HiSparse at the baseline's batch")
    d.add_argument("--out", default="results/decode", help="folder for decode.json and plots")
    d.add_argument("--no-plots", action="store_true")
    return p


def _parse_sets(family, args) -> dict:
    """--set FIELD=VALUE pairs -> Config overrides, each cast to the type of the field's value
    in the chosen preset (bool from true/false, "None" for optional fields)."""
    fields = {f.name for f in dataclasses.fields(family.Config)}
    preset = family.Config.preset(args.preset)
    out = {}
    for pair in args.set:
        name, sep, text = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        current = getattr(preset, name)
        try:
            if text == "None":
                out[name] = None
            elif isinstance(current, bool):
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                out[name] = text.lower() == "true"
            elif isinstance(current, (int, float)):
                out[name] = type(current)(text)
            elif current is None:  # optional int fields (e.g. pool_records)
                out[name] = int(text)
            else:
                out[name] = text
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {name} takes a {type(current).__name__} "
                             f"(the preset has {current!r})") from None
    return out


def _trace(family, args, config) -> traces.TraceConfig | None:
    if args.selection == "indexer":
        return None
    return traces.TraceConfig.for_page_size(
        config.page_size, beta=args.trace_beta, rho_e=args.trace_rho_e,
        memoryless_layers=args.trace_memoryless_layers, run_indexer=args.selection == "trace",
    )


def _config(family, args, context: int):
    overrides = _parse_sets(family, args)
    if args.top_k is not None:
        overrides["top_k"] = args.top_k
    if args.hot_slots is not None:
        overrides["hot_slots"] = args.hot_slots
    if args.layers is not None:
        overrides["n_layers"] = args.layers
    # Room for the prompt plus every decoded token (warm-up and timed calls),
    # rounded up to whole pages.
    page = family.Config.preset(args.preset, **overrides).page_size
    needed = tokens_needed(context, args.steps, args.reps, args.no_io) + 1
    overrides["max_context"] = -(-needed // page) * page
    return family.Config.preset(args.preset, **overrides)


def _device_budget(args) -> int:
    if args.device_budget_gib is not None:
        return int(args.device_budget_gib * GiB)
    return int((args.device_budget_mib if args.device_budget_mib is not None else 1.0) * MiB)


def _row(kind, timing, cap: Capacity, record_bytes: int, config) -> dict:
    miss_rate = timing.misses_per_step / timing.selected_per_step if timing.selected_per_step else 0.0
    return dict(
        run=kind,
        mode=timing.mode,
        context=timing.context,
        batch=timing.batch,
        tokens_per_s=timing.tokens_per_second,
        tpot_ms=timing.step_seconds * 1e3,
        step_ms_all=[t * 1e3 for t in timing.step_seconds_all],
        miss_rate=miss_rate,
        io_bytes_per_token=timing.misses_per_step * record_bytes / timing.batch if timing.fetch else 0.0,
        device_bytes_per_request=cap.device_per_request,
        kv_device_bytes_per_request=cap.device_per_request_by_category.get("kv records", 0),
        device_bytes_by_category=cap.device_per_request_by_category,
        host_bytes_per_request=cap.host_per_request,
        max_batch=cap.max_batch,
        limited_by=cap.limited_by if kind != "equal batch" else "baseline's batch",
        top_k=config.top_k,
        hot_slots=config.hot_slots,
    )


def run_decode(args) -> dict:
    family = get_family(args.family)
    budget, host_budget = _device_budget(args), int(args.host_budget_gib * GiB)
    rows, ratios, notes = [], [], []
    equal_runs = 0 if args.no_equal_batch else 1
    runs = len(args.contexts) * (len(args.modes) + equal_runs + (1 if args.no_io else 0))
    options = dict(fill=args.fill)
    with Progress(runs, "decode") as progress:
        for context in args.contexts:
            config = _config(family, args, context)
            options["trace"] = trace = _trace(family, args, config)
            if trace is not None and traces.describe(trace) not in notes:
                notes.append(traces.describe(trace))
            weights = family.init_weights(config, 0)
            record_bytes = config.cache_config(1).record_bytes
            caps = {
                m: capacity(family, config, m, device_budget=budget, host_budget=host_budget,
                            max_batch_cap=args.max_batch)
                for m in args.modes
            }
            timings = {}
            for mode in args.modes:
                if caps[mode].max_batch < 1:
                    progress.advance(f"{mode} @ {context}: nothing fits")
                    continue
                measured = decode_timings(family, config, weights, mode, caps[mode].max_batch, context,
                                          args.steps, args.reps, no_io=args.no_io, **options)
                timings[mode] = measured[0]
                rows.append(_row("capacity", measured[0], caps[mode], record_bytes, config))
                progress.advance(f"{mode} @ {context}, batch {caps[mode].max_batch}")
                if len(measured) > 1:
                    rows.append(_row("no-IO", measured[1], caps[mode], record_bytes, config))
                    progress.advance(f"{mode} @ {context}, batch {caps[mode].max_batch}, no IO")
            if not args.no_equal_batch and {"device", "hisparse"} <= timings.keys():
                equal = decode_timing(family, config, weights, "hisparse", timings["device"].batch, context,
                                      args.steps, args.reps, **options)
                rows.append(_row("equal batch", equal, caps["hisparse"], record_bytes, config))
                progress.advance(f"hisparse @ {context}, equal batch {equal.batch}")
                ratios.append(_ratios(context, timings, equal, caps))
    return dict(
        family=args.family, preset=args.preset, device=str(jax.devices()[0].device_kind),
        backend=jax.default_backend(), jax=jax.__version__, device_budget_bytes=budget,
        host_budget_bytes=host_budget, max_batch_cap=args.max_batch, steps=args.steps, reps=args.reps,
        fill=args.fill, selection=args.selection, notes=notes, overrides=_parse_sets(family, args),
        n_layers=config.n_layers, rows=rows, ratios=ratios,
    )


def _ratios(context, timings, equal, caps) -> dict:
    h, d = timings["hisparse"], timings["device"]
    kv_h = caps["hisparse"].device_per_request_by_category.get("kv records", 0)
    kv_d = caps["device"].device_per_request_by_category.get("kv records", 0)
    return dict(
        context=context,
        throughput=h.tokens_per_second / d.tokens_per_second,
        batch=h.batch / d.batch,
        tpot_equal_batch=equal.step_seconds / d.step_seconds,
        tokens_equal_at_equal_batch=bool(np.array_equal(equal.tokens, d.tokens)),
        kv_device_bytes_per_request=kv_d / kv_h if kv_h else float("inf"),
        device_bytes_per_request=caps["device"].device_per_request / caps["hisparse"].device_per_request,
    )


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_table(report: dict) -> str:
    head = ("| context | run | mode | batch (limit) | tokens/s | TPOT ms | miss rate | IO/token | "
            "device/request (kv part) | host/request |")
    lines = [head, "|" + "---|" * 10]
    for r in report["rows"]:
        lines.append(
            f"| {r['context']} | {r['run']} | {r['mode']} | {r['batch']} ({r['limited_by']}) | "
            f"{r['tokens_per_s']:.1f} | {r['tpot_ms']:.2f} | {r['miss_rate']:.1%} | "
            f"{_fmt_bytes(r['io_bytes_per_token'])} | {_fmt_bytes(r['device_bytes_per_request'])} "
            f"({_fmt_bytes(r['kv_device_bytes_per_request'])}) | {_fmt_bytes(r['host_bytes_per_request'])} |"
        )
    if report["ratios"]:
        lines += ["", "| context | throughput x | batch x | TPOT at equal batch x | KV HBM/request x | "
                  "device bytes/request x | tokens equal (equal batch) |", "|" + "---|" * 7]
        for q in report["ratios"]:
            lines.append(
                f"| {q['context']} | {q['throughput']:.2f} | {q['batch']:.2f} | {q['tpot_equal_batch']:.2f} | "
                f"{q['kv_device_bytes_per_request']:.1f} | {q['device_bytes_per_request']:.2f} | "
                f"{q['tokens_equal_at_equal_batch']} |"
            )
    return "\n".join(lines)


def write_plots(report: dict, out: Path) -> list[Path]:
    """throughput.png and tpot.png vs context, both modes (capacity runs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: plots skipped (pip install matplotlib)", file=sys.stderr)
        return []
    paths = []
    for key, label, name in (("tokens_per_s", "decode tokens/s", "throughput.png"),
                             ("tpot_ms", "TPOT (ms per step)", "tpot.png")):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for mode in ("device", "hisparse"):
            rows = [r for r in report["rows"] if r["mode"] == mode and r["run"] == "capacity"]
            if rows:
                ax.plot([r["context"] for r in rows], [r[key] for r in rows], marker="o",
                        label=f"{mode} (batch at capacity)")
        ax.set_xscale("log", base=2)
        contexts = sorted({r["context"] for r in report["rows"]})
        ax.set_xticks(contexts, labels=[str(c) for c in contexts])
        ax.minorticks_off()
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.set_title(f"{report['family']} {report['preset']} on {report['device']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _allow_pinned_host(host_budget: int) -> None:
    """XLA's GPU client caps pinned host memory at 64 GiB unless XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB
    says otherwise; unless the user set it, lift the cap to the host budget plus headroom. Must run
    before the backend starts (the first device use)."""
    if "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB" not in os.environ:
        os.environ["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] = str(math.ceil(host_budget / 2**30) + 8)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    _allow_pinned_host(int(args.host_budget_gib * GiB))
    report = run_decode(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps(report, indent=1))
    print(f"{report['family']} {report['preset']} on {report['device']} (jax {report['jax']}); device budget "
          f"{_fmt_bytes(report['device_budget_bytes'])}, host budget {_fmt_bytes(report['host_budget_bytes'])}, "
          f"batch cap {report['max_batch_cap']}, {report['steps']} steps x {report['reps']} timed calls")
    print(f"{report['n_layers']} layers (a slice of a real model: per-request bytes scale with layers); "
          f"state from {report['fill']}, selection by {report['selection']}"
          + (" (its state on device is not in the byte account)" if report["selection"] != "indexer" else ""))
    for note in report["notes"]:
        print(note)
    print(format_table(report))
    written = [] if args.no_plots else write_plots(report, out)
    print(f"wrote {out / 'decode.json'}" + "".join(f", {p}" for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

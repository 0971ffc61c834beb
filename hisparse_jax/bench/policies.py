"""`hisparse-bench policies`: eviction policies replayed on a selection trace (docs/policies.md).

Replays a recorded trace (--trace-file, hisparse_jax.selection.recorded) or calibrated synthetic ones
(--synthetic, hisparse_jax.selection.synthetic) through a hot buffer of B = ratio * k slots per layer and
stream under each policy of hisparse_jax.selection.policies (lru is RESOLVE's own), and reports the
miss rate per policy, B/k and layer, the step overlap and the adjacent-layer overlap: a table on
stdout, policies.json and PNG plots in --out.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..selection import policies as cache_policies, recorded, synthetic as traces
from . import outputs
from .errors import BenchError
from .progress import Progress

# The synthetic trace's shape when not given (a few seconds to replay on one core).
SYNTHETIC_DEFAULTS = dict(records=32768, streams=2, layers=4, steps=200, k=2048)
SYNTHETIC_ONLY = ("records", "streams", "layers", "steps", "k")
# Selecting layers of a synthetic trace, at most: the models' own limit (Config.num_layers), and
# the generator unrolls one top-k per layer in its compiled step (99999999999 layers traced for
# hours). Record ids, and so the records sealed by the last step, are int32.
MAX_LAYERS = 1024
MAX_RECORDS = 2**31 - 1


# --------------------------------------------------------------------------- the traces replayed


@dataclasses.dataclass
class _Source:
    """One trace to replay: its label, what it is (JSON-able) and how to get its ids."""

    label: str
    trace: dict
    steps: int
    k: int
    ids: Callable[[], np.ndarray]  # -> [steps, layers, streams, k] int32


def _sources(args) -> list[_Source]:
    """The traces the arguments name, every argument checked before any trace is generated."""
    for name in ("ratios", "policies", "synthetic"):
        values = getattr(args, name) or []
        again = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if again is not None:
            raise BenchError(f"argument --{name}: {again:g} given more than once" if name == "ratios"
                             else f"argument --{name}: {again} given more than once")
    if args.trace_file is not None:
        given = [n for n in SYNTHETIC_ONLY if getattr(args, n) is not None]
        if given:
            raise BenchError(f"argument --{given[0]}: applies to --synthetic only (a trace file fixes its own "
                             "shape); drop it or replay --synthetic")
        try:
            trace = recorded.load_trace(args.trace_file)
        except ValueError as err:
            raise BenchError(f"argument --trace-file: {err}") from None
        check_capacities(args.ratios, trace.k, trace.num_records, "--trace-file")
        described = dict(kind="recorded", file=str(args.trace_file), source=trace.source, page_size=trace.page_size,
                         steps=trace.steps, layers=trace.layers, streams=trace.streams, k=trace.k,
                         num_records=trace.num_records)
        return [_Source(Path(args.trace_file).stem, described, trace.steps, trace.k, lambda: trace.ids)]
    shape = {n: SYNTHETIC_DEFAULTS[n] if getattr(args, n) is None else getattr(args, n) for n in SYNTHETIC_ONLY}
    if shape["k"] > shape["records"]:
        raise BenchError(f"argument --k: k = {shape['k']} exceeds the {shape['records']} records sealed at the "
                         "first step; lower --k or raise --records")
    num_records = shape["records"] + shape["steps"] - 1  # one record sealed per step
    if num_records > MAX_RECORDS:
        raise BenchError(f"argument --steps: --records {shape['records']} + --steps {shape['steps']} - 1 = "
                         f"{num_records} records by the last step, beyond {MAX_RECORDS} (record ids are int32); "
                         "lower --records or --steps")
    check_capacities(args.ratios, shape["k"], num_records, "--records + --steps - 1")
    check_synthetic_memory(shape, max(capacities(args.ratios, shape["k"])))
    return [_synthetic(name, shape, args.seed) for name in args.synthetic]


def capacities(ratios, k: int) -> list[int]:
    """B = round(ratio * k) of each ratio, as the replay takes them (cache_policies.capacities)."""
    return [int(round(float(r) * k)) for r in ratios]


def check_capacities(ratios, k: int, num_records: int, what: str) -> None:
    """Every B = round(ratio * k) at most the `num_records` records the trace seals by its last
    step (`what` says where that number comes from): a larger buffer never evicts, and its
    per-slot arrays would be sized by the ratio alone (--ratios 1e12 asked for 29 TiB)."""
    for ratio, capacity in zip(ratios, capacities(ratios, k)):
        if capacity > num_records:
            raise BenchError(f"argument --ratios: B/k = {ratio:g} gives B = {capacity} slots per stream, more than the "
                             f"{num_records} records the trace seals ({what}); give ratios up to "
                             f"{math.floor(num_records / k * 1000) / 1000:g}")


def synthetic_bytes(shape: dict, capacity: int) -> dict[str, tuple[int, str, str]]:
    """Bytes of what a synthetic trace of `shape` and its replay at `capacity` slots allocate, from
    the shapes alone: name -> (bytes, what, the flags that size it). An estimate from above of
    the arrays (copies counted), not of every temporary."""
    S, L, T, k = shape["streams"], shape["layers"], shape["steps"], shape["k"]
    R = shape["records"] + shape["steps"] - 1
    rows = L * S
    return {
        # u [S, R] and e [L, S, R] float32, a step's new innovations and the updated e beside
        # them, and a layer's scores and top-k scratch.
        "state": (4 * S * R * (3 * L + 4), "the generator's state [layers + 1, streams, records] float32",
                  "--records, --streams or --layers"),
        # [T, L, S, k] int32: on the device, on the host, checked, and Belady's next uses.
        "ids": (4 * 4 * T * rows * k, "the ids [steps, layers, streams, k] int32", "--steps, --layers, --streams or --k"),
        # The replay's record -> slot map and Belady's next-use map [rows, R] int32, the overlap's mask.
        "maps": (9 * rows * (R + 2), "the replay's [layers x streams, records] maps",
                 "--records, --streams or --layers"),
        # A step's [rows, B] int64 slot orders, keys and masks.
        "slots": (8 * 12 * rows * capacity, "the replay's [layers x streams, B] slot arrays",
                  "--ratios, --k, --streams or --layers"),
    }


def check_synthetic_memory(shape: dict, capacity: int) -> None:
    """A synthetic trace whose arrays (synthetic_bytes) exceed half the RAM is refused before
    anything is allocated, naming its size and the flags of its largest part (--streams
    99999999999 was an XLA out-of-memory traceback, --records 2147483647 another)."""
    import jax

    from .decode.plan import device_memory_limit, host_memory_limit
    from .decode.report import fmt_bytes

    parts = synthetic_bytes(shape, capacity)
    checks = [(parts, *host_memory_limit())]  # on a CPU the generator's arrays are host memory too
    if jax.default_backend() != "cpu":  # the generator's state and its ids on the device
        limit, source = device_memory_limit()
        if limit is not None:
            state, ids = parts["state"], parts["ids"]
            checks.append((dict(state=state, ids=(ids[0] // 4, *ids[1:])), limit, source))
    for counted, limit, source in checks:
        total = sum(n for n, _, _ in counted.values())
        if total > limit:
            n, what, flags = max(counted.values(), key=lambda part: part[0])
            raise BenchError(f"the synthetic trace would need about {fmt_bytes(total)} of memory ({what}: "
                             f"{fmt_bytes(n)}), beyond {source} ({fmt_bytes(limit)}); lower {flags}")


def _synthetic(name: str, shape: dict, seed: int) -> _Source:
    config = traces.TraceConfig.calibration(name)
    num_records = shape["records"] + shape["steps"] - 1  # one record sealed per step

    def ids():
        import jax.numpy as jnp

        lengths = jnp.full((shape["streams"],), shape["records"], jnp.int32)
        return np.asarray(traces.selections(config, shape["layers"], (shape["streams"],), num_records, shape["k"],
                                            lengths, shape["steps"], seed=seed))

    described = dict(kind="synthetic", calibration=name, config=dataclasses.asdict(config), **shape,
                     num_records=num_records, seed=seed, generator=traces.describe(config))
    return _Source(name, described, shape["steps"], shape["k"], ids)


def _check_against(source: _Source, args) -> int:
    """The warm-up of `source`: --warm, checked against its steps (B >= k holds already: ratios >= 1)."""
    warm = source.steps // 4 if args.warm is None else args.warm
    if warm >= source.steps:
        raise BenchError(f"argument --warm: {warm} is not below the trace's {source.steps} steps; give --warm "
                         f"below {source.steps}")
    return warm


# --------------------------------------------------------------------------- report


def run(args) -> int:
    """hisparse-bench policies: replays, writes policies.json (and plots), prints the tables."""
    outputs.check_folder("--out", args.out)
    sources = _sources(args)
    warms = [_check_against(s, args) for s in sources]
    out = Path(args.out)
    entries = []
    with Progress(len(sources) * (1 + len(args.policies) * len(args.ratios)), "policies") as progress:
        for source, warm in zip(sources, warms):
            ids = source.ids()
            progress.advance(f"{source.label}: trace of {ids.shape[0]} steps ready")
            start = time.perf_counter()
            result = cache_policies.replay(ids, ratios=args.ratios, policies=args.policies, warm=warm,
                                           seed=args.seed, progress=lambda what: progress.advance(f"{source.label}: {what}"))
            result["replay_s"] = round(time.perf_counter() - start, 3)
            result["step_overlap"] = _json_floats(cache_policies.step_overlap(ids))
            result["layer_overlap"] = _json_floats(cache_policies.layer_overlap(ids))
            entries.append(dict(label=source.label, trace=source.trace, **result))
    report = dict(command=" ".join(["hisparse-bench", *getattr(args, "argv", ["policies"])]), policies=list(args.policies), ratios=list(args.ratios),
                  traces=entries)
    for entry in entries:  # the tables first: a report that cannot be written loses no result
        print(format_entry(entry))
        print()
    written = outputs.write_report(out, "policies.json", report, None if args.no_plots else write_plots)
    print("wrote " + ", ".join(map(str, written)))
    return 0


def _json_floats(values) -> list:
    return [None if math.isnan(v) else round(float(v), 6) for v in values]


def _percent(rate) -> str:
    return "-" if rate is None else f"{rate:.1%}"


def _mean(values) -> str:
    known = [v for v in values if v is not None]
    return f"{np.mean(known):.3f}" if known else "-"


def format_entry(entry: dict) -> str:
    """One trace's header, its miss-rate table (policies x B/k) and its overlaps, as Markdown."""
    t = entry["trace"]
    what = (f"recorded trace {t['file']}" if t["kind"] == "recorded" else
            f"synthetic {t['calibration']}-like trace ({t['records']} records sealed at the first step, seed {t['seed']})")
    lines = [
        f"{what}: {entry['steps']} steps x {entry['layers']} layers x {entry['streams']} streams, k = {entry['k']}; "
        f"misses / selected ids from step {entry['warm']} on ({entry['selected']} ids), replayed in {entry['replay_s']:.1f} s",
        "",
        "| policy | " + " | ".join(f"B/k = {r:g} (B = {b})" for r, b in zip(entry["ratios"], entry["capacities"])) + " |",
        "|---|" + "---|" * len(entry["ratios"]),
    ]
    for policy in entry["policies"]:
        lines.append(f"| {policy} | " + " | ".join(_percent(r) for r in entry["miss_rate"][policy]) + " |")
    lines += ["", "step overlap |S_t & S_t-1| / |S_t| per layer: "
              + ", ".join("-" if v is None else f"{v:.3f}" for v in entry["step_overlap"])
              + f" (mean {_mean(entry['step_overlap'])})"]
    if entry["layer_overlap"]:
        lines.append("adjacent-layer overlap |S_l & S_l-1| / |S_l|, layers 1.." f"{entry['layers'] - 1}: "
                     + ", ".join("-" if v is None else f"{v:.3f}" for v in entry["layer_overlap"])
                     + f" (mean {_mean(entry['layer_overlap'])})")
    return "\n".join(lines)


def write_plots(report: dict, out: Path) -> list[Path]:
    """Per trace: miss_rate.png (miss rate vs B/k, one line per policy) and layer_misses.png
    (per-layer miss rate: layers x B/k under lru, and layers x policies at the B/k nearest 2);
    names take a -LABEL suffix when several traces were replayed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: plots skipped, policies.json written (pip install 'hisparse-jax[plots]')",
              file=sys.stderr)
        return []
    paths = []
    for entry in report["traces"]:
        suffix = f"-{entry['label']}" if len(report["traces"]) > 1 else ""
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for policy in entry["policies"]:
            rates = [np.nan if r is None else 100 * r for r in entry["miss_rate"][policy]]
            ax.plot(entry["ratios"], rates, marker="o", label=policy)
        ax.set_xlabel("B / k")
        ax.set_ylabel(f"miss rate (% of selected ids, steps {entry['warm']}+)")
        ax.set_title(f"{entry['label']}: k = {entry['k']}, {entry['layers']} layers x {entry['streams']} streams")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(out / f"miss_rate{suffix}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

        panels = []
        if "lru" in entry["policies"]:
            panels.append(("lru, per B/k", [f"{r:g}" for r in entry["ratios"]], entry["layer_miss_rate"]["lru"]))
        at = int(np.argmin([abs(r - 2) for r in entry["ratios"]]))
        panels.append((f"B/k = {entry['ratios'][at]:g}, per policy", entry["policies"],
                       [entry["layer_miss_rate"][p][at] for p in entry["policies"]]))
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 1.6 + 0.45 * entry["layers"]),
                                 squeeze=False)
        for ax, (title, columns, per_column) in zip(axes[0], panels):
            grid = 100 * np.array([[np.nan if v is None else v for v in column] for column in per_column]).T
            image = ax.imshow(grid, aspect="auto", cmap="viridis")
            ax.set_xticks(range(len(columns)), columns)
            ax.set_xlabel("B / k" if title.startswith("lru") else "policy")
            ax.set_yticks(range(entry["layers"]))
            ax.set_ylabel("selecting layer")
            ax.set_title(title)
            middle = (np.nanmin(grid) + np.nanmax(grid)) / 2 if np.isfinite(grid).any() else 0.0
            for (row, col), value in np.ndenumerate(grid):
                if np.isfinite(value) and grid.size <= 200:  # numbers only where they stay legible
                    ax.text(col, row, f"{value:.1f}", ha="center", va="center", fontsize=7,
                            color="black" if value > middle else "white")
            fig.colorbar(image, ax=ax, label="miss rate (%)")
        fig.tight_layout()
        paths.append(out / f"layer_misses{suffix}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths

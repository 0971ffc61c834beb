"""Where a decode step's device time goes, next to the step's roofline.

`profile_decode` runs one jitted decode call under the JAX profiler, reads the device kernels of
its trace (hisparse_jax.bench.device_trace), maps each kernel to the HLO instruction it ran for
(the trace names it) and that instruction to the named scope of the model code it came from (the
compiled program's metadata), and sums device time per step in the categories of
hisparse_jax.bench.kernel_categories. The roofline (hisparse_jax.bench.roofline) is the step's
bytes at bandwidths measured in the same run.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import jax
import numpy as np

from .. import decode, hlo
from .device_trace import beside_copy, copy_slowdown, device_kernels, io_overlap, kernel_seconds, summarize, timeline
from .kernel_categories import CATEGORIES, hlo_instructions
from .roofline import measure_bandwidths, roofline_seconds, step_bytes


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """Device time per step by category, and the roofline of the step.

    Attributes:
      seconds: category -> device seconds per step.
      step_seconds: wall time of one step in the profiled call.
      roofline_seconds: the step's bytes at the measured bandwidths.
      bytes: part -> bytes per step behind the roofline.
      bandwidths: "hbm", "host link" -> measured bytes/s.
      top_kernels: the 12 kernels with the most device time per step: (category, kernel, seconds).
      io_overlap: `io_overlap`'s copy time and the part hidden behind other kernels, or None.
      kernels_per_step: kernel launches per step.
      idle_seconds: per step, device time between the call's first and last kernel with no kernel
        running (`device_trace.timeline`; the profiler widens it).
      busy_seconds: per step, the time at least one kernel ran (`device_trace.timeline`): the
        kernels' sum less the time kernels ran beside each other (a prefetch copy, overlap groups).
      kernel_seconds: device seconds per step of each kind of kernel (`device_trace.kernel_key`),
        which another run's `beside_copy` is set against (`format_profile`: the copy's slowdown).
      beside_copy: the kinds of kernel with a launch beside the record copy (prefetch), else [].
    """

    seconds: dict[str, float]
    step_seconds: float
    roofline_seconds: float
    bytes: dict[str, float]
    bandwidths: dict[str, float]
    top_kernels: list[tuple[str, str, float]]
    io_overlap: dict | None = None
    kernels_per_step: float = 0.0
    idle_seconds: float = 0.0
    busy_seconds: float = 0.0
    kernel_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    beside_copy: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def profile_decode(family, config, weights, state, first_tokens, steps: int, *, context: int,
                   forced=None, bandwidths: dict[str, float] | None = None,
                   trace_dir: str | None = None):
    """(StepProfile, tokens [steps, b], state after the call) of one profiled `decode.generate`
    call (the state is donated; `forced`, a decode.ForcedTrace, as in generate).

    Call it after a warm-up call with the same shapes (so nothing compiles while profiling).
    `bandwidths` ("hbm", "host link" in bytes/s) default to fresh measurements (`measure_bandwidths`).
    """
    batch = int(state.lengths.shape[0])
    options = dict(forced=forced)
    traced = decode.trace_generate(family, config, weights, state, first_tokens, steps, **options)
    hlo_text = traced.lower().compile().as_text()
    program = hlo.parse(hlo_text)
    instructions = hlo_instructions(program)
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="hisparse-profile-")
    os.makedirs(trace_dir, exist_ok=True)
    with open(os.path.join(trace_dir, "program.hlo.txt"), "w") as f:  # kernel names -> model scopes
        f.write(hlo_text)
    jax.block_until_ready((state, first_tokens))
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        t0 = time.perf_counter()
        generated = decode.generate(family, config, weights, state, first_tokens, steps, **options)
        out, misses, state = generated.tokens, generated.misses, generated.state
        jax.block_until_ready(out)
        wall = (time.perf_counter() - t0) / steps
    kernels = device_kernels(trace_dir, program.name)
    seconds, top = summarize(kernels, instructions, steps)
    overlap = io_overlap(kernels, instructions, steps)
    busy = timeline(kernels, steps)
    if bandwidths is None:
        bandwidths = measure_bandwidths(config.record_bytes)
    index = generated.index_misses  # a kit indexer's own records (kit.RecordKind), else None
    moved = step_bytes(family, config, weights, batch, context, float(np.asarray(misses).sum()) / steps,
                       0.0 if index is None else float(np.asarray(index).sum()) / steps)
    roofline = roofline_seconds(moved, bandwidths)
    return StepProfile(seconds, wall, roofline, moved, dict(bandwidths), top, overlap, **busy,
                       kernel_seconds=kernel_seconds(kernels, instructions, steps),
                       beside_copy=beside_copy(kernels, instructions)), out, state


def kernels_busy(row: dict) -> float:
    """Seconds per step during which at least one kernel of the profiled call ran: the row's
    `busy_seconds`, or for reports written before it was recorded the kernels' sum less the record
    copy's time beside other kernels (the only kernels that ran beside each other then)."""
    busy = row.get("busy_seconds")
    if busy:
        return busy
    overlap = row.get("io_overlap") or {}
    return sum(row["seconds"].values()) - overlap.get("hidden_seconds", 0.0)


def launch_gaps(row: dict) -> str:
    """One line on the time a step spends outside kernels: kernels per step, the device idle time
    the trace shows, and (with the unprofiled step time `tpot_seconds` of the same run, which the
    decode command adds) that step minus the time kernels ran (`kernels_busy`: a copy beside other
    kernels counts once), as a share of the step: the launch-gap figure, free of the profiler's
    own overhead."""
    line = (f"{row.get('kernels_per_step', 0.0):.0f} kernels per step, device idle "
            f"{row.get('idle_seconds', 0.0) * 1e3:.3f} ms per step in the profiled call")
    tpot = row.get("tpot_seconds")
    if tpot:
        gap = tpot - kernels_busy(row)
        line += f"; timed step {tpot * 1e3:.3f} ms minus the kernels' busy time: {gap * 1e3:.3f} ms ({gap / tpot:.1%})"
    return line


# The share of its roofline tokens/s each mode is held to (the roofline issue's acceptance).
TARGET_SHARE = 0.85


def kernel_budget(row: dict, share: float = TARGET_SHARE) -> dict | None:
    """What a step at `share` of its roofline leaves beyond its bytes, spread over its kernels, or
    None (no kernels in the trace, or no roofline).

    A step at that share takes roofline / share: `budget_seconds` = that minus the roofline is all
    the time its launches, its kernels' fixed latencies and every kernel that moves no roofline
    bytes may take together, `per_kernel` that over the kernels a step. With the unprofiled TPOT
    (`tpot_seconds`) it also gives the time the run spends beyond its bytes (`over_seconds`) and its
    launch gap a kernel (`gap_per_kernel`: TPOT minus the kernels' busy time, over the kernels):
    when that gap alone is near `per_kernel`, no kernel of the current list can be fast enough; the
    step needs fewer kernels.
    """
    kernels = row.get("kernels_per_step") or 0.0
    roofline = row.get("roofline_seconds") or 0.0
    if kernels <= 0 or roofline <= 0:
        return None
    target = roofline / share
    found = dict(share=share, target_seconds=target, budget_seconds=target - roofline, kernels=kernels,
                 per_kernel=(target - roofline) / kernels)
    tpot = row.get("tpot_seconds")
    if tpot:
        found["over_seconds"] = tpot - roofline
        found["gap_per_kernel"] = (tpot - kernels_busy(row)) / kernels
    return found


def budget_line(row: dict) -> str | None:
    """One line of `kernel_budget`, or None."""
    b = kernel_budget(row)
    if b is None:
        return None
    line = (f"at {b['share']:.0%} of the roofline a step takes {b['target_seconds'] * 1e3:.3f} ms: "
            f"{b['budget_seconds'] * 1e3:.3f} ms beyond its bytes, {b['per_kernel'] * 1e6:.2f} us for each of its "
            f"{b['kernels']:.0f} kernels")
    if "over_seconds" in b:
        line += (f"; this run spends {b['over_seconds'] * 1e3:.3f} ms beyond its bytes, its launch gap alone "
                 f"{b['gap_per_kernel'] * 1e6:.2f} us a kernel")
    return line


# Which bytes of the roofline (roofline.step_bytes) bound which profile categories, and over which
# bandwidth: (categories, roofline parts, bandwidth). RESOLVE with its copy (the fused plan copies
# inside its kernel) over the host link.
BYTE_BOUNDS = (
    (("weights/FFN",), ("weights",), "hbm"),
    (("indexer",), ("metadata",), "hbm"),
    (("attention",), ("attended KV",), "hbm"),
    (("resolve", "IO"), ("miss IO",), "host link"),
)
# Families whose metadata attention kernels read (NSA's compressed KV and window, Quest's page
# bounds under its `select` scope and its dense layers' KV; kernel_categories puts those scopes in
# attention): attention and indexer are bound together by the attended records plus the metadata.
METADATA_IN_ATTENTION = ("nsa", "quest")
_MERGED_BOUNDS = (
    BYTE_BOUNDS[0],
    (("attention", "indexer"), ("attended KV", "metadata"), "hbm"),
    BYTE_BOUNDS[3],
)


def bounds_for(family: str | None) -> tuple:
    """The BYTE_BOUNDS entries of a family (its name as the decode report gives it)."""
    return _MERGED_BOUNDS if family in METADATA_IN_ATTENTION else BYTE_BOUNDS


def category_bounds(row: dict, family: str | None = None) -> tuple[list[tuple[str, float, float]], list[tuple[str, float]]]:
    """(bounded, unbounded) of a profile row of `family` (the row's own "family" first): for each
    of its bounds_for entries (label, seconds per step, its bytes' seconds at the row's bandwidths),
    and the categories that move no bytes of the roofline with their seconds (nonzero ones)."""
    bounded = []
    bounds = bounds_for(row.get("family", family))
    for categories, parts, bandwidth in bounds:
        seconds = sum(row["seconds"].get(c, 0.0) for c in categories)
        moved = sum(row["bytes"].get(part, 0.0) for part in parts)
        bounded.append((" + ".join(categories), seconds, moved / row["bandwidths"][bandwidth]))
    named = {c for categories, _, _ in bounds for c in categories}
    unbounded = [(c, row["seconds"][c]) for c in CATEGORIES if c not in named and row["seconds"].get(c)]
    return bounded, unbounded


def bound_cell(seconds: float, bound: float) -> str:
    """A category's time against its bytes' time: "1.25x", or what it is when one of them is 0."""
    if bound > 0 and seconds > 0:
        return f"{seconds / bound:.2f}x"
    if seconds > 0:
        return f"{seconds * 1e3:.3f} ms with no bytes"
    return f"no kernels for {bound * 1e3:.3f} ms of bytes"


def byte_bounds(row: dict, family: str | None = None) -> str:
    """One line: each category's time per step over what its own bytes take at the run's
    bandwidths (bounds_for; the issue's bound is 1.25x), and the categories that move no bytes of
    the roofline (their whole time is above it)."""
    bounded, unbounded = category_bounds(row, family)
    parts = [f"{label} {bound_cell(seconds, bound)}" for label, seconds, bound in bounded if bound > 0 or seconds > 0]
    line = "each category over its own bytes' time: " + ", ".join(parts)
    if unbounded:
        line += "; no bytes of their own in the roofline: " + ", ".join(f"{c} {s * 1e3:.3f} ms" for c, s in unbounded)
    return line


def _without_copy(row: dict, rows: list[dict]) -> dict | None:
    """The row a prefetch row's copy is set against: HiSparse's capacity run of the same context,
    trace and batch (the decode command profiles both), or None."""
    for r in rows:
        if (r.get("run") == "capacity" and r["mode"] == row["mode"] and r["context"] == row["context"]
                and r.get("trace") == row.get("trace") and r["batch"] == row["batch"]):
            return r
    return None


def slowdown_line(row: dict, rows: list[dict]) -> str | None:
    """One line on the kernels that ran beside a prefetch row's record copy: their time per step
    against the run without prefetch (device_trace.copy_slowdown), or None (no copy beside them, or
    no run to compare with)."""
    base = _without_copy(row, rows) if row.get("run") == "prefetch" else None
    if base is None or not row.get("kernel_seconds") or not base.get("kernel_seconds"):
        return None
    found = copy_slowdown(row.get("beside_copy", []), row["kernel_seconds"], base["kernel_seconds"])
    if found is None:
        return None
    if found["slowdown"] is None:
        line = (f"kernels beside the copy: none of their {len(found['unmatched'])} kinds ran in the run without "
                "prefetch, so no slowdown is measured")
    else:
        line = (f"kernels beside the copy ({found['kinds']} kinds, every launch of each): "
                f"{found['seconds'] * 1e3:.3f} ms per step, {found['baseline_seconds'] * 1e3:.3f} ms without prefetch: "
                f"{found['slowdown']:+.1%}")
    if found["unmatched"]:
        shown = ", ".join(found["unmatched"][:3]) + (", ..." if len(found["unmatched"]) > 3 else "")
        line += (f" ({found['unmatched_seconds'] * 1e3:.3f} ms per step of kinds the run without prefetch has not: "
                 f"{shown})")
    return line


def format_profile(rows: list[dict], mode_names: dict[str, str] | None = None, family: str | None = None) -> str:
    """A markdown table of profile rows (StepProfile fields plus mode, context, batch): device ms
    per step by category, the device sum, the step and its roofline. `mode_names` maps a row's
    mode to the name the tables show (the decode report's, so the baseline has one name: full-KV);
    `family` (the report's) decides which bytes bound which categories (bounds_for)."""
    shown = dict(mode_names or {})
    head = ("| mode | context | trace | batch | " + " | ".join(CATEGORIES)
            + " | device sum | step | roofline | step / roofline | tokens/s / roofline tokens/s |")
    lines = [head, "|" + "---|" * (len(CATEGORIES) + 9)]
    for r in rows:
        cells = " | ".join(f"{r['seconds'][c] * 1e3:.3f}" for c in CATEGORIES)
        total = sum(r["seconds"].values())
        lines.append(f"| {shown.get(r['mode'], r['mode'])}{' + prefetch' if r.get('run') == 'prefetch' else ''} | {r['context']} | {r.get('trace') or '-'} | {r['batch']} | {cells} | "
                     f"{total * 1e3:.3f} | {r['step_seconds'] * 1e3:.3f} | {r['roofline_seconds'] * 1e3:.3f} | "
                     f"{r['step_seconds'] / r['roofline_seconds']:.2f} | "
                     f"{r['roofline_seconds'] / r['step_seconds']:.0%} |")
    lines += ["", "ms per step of the profiled call; roofline = (weights + metadata + attended KV) / HBM + "
                  "miss IO / host link (routed experts: the bytes of the experts expected to receive a token)"]
    for r in rows:
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in r["bytes"].items())
        bw = ", ".join(f"{k} {v / 1e9:.0f} GB/s" for k, v in r["bandwidths"].items())
        run = " (prefetch)" if r.get("run") == "prefetch" else ""
        lines.append(f"- {shown.get(r['mode'], r['mode'])}{run} @ {r['context']}: {parts}; {bw}")
        lines.append("  " + launch_gaps(r))
        if any(r["seconds"].values()):
            lines.append("  " + byte_bounds(r, family))
            budget = budget_line(r)
            if budget:
                lines.append("  " + budget)
        overlap = r.get("io_overlap")
        if overlap:
            lines.append(f"  record copy (fetch kernels) {overlap['io_seconds'] * 1e3:.3f} ms per step, "
                         f"{overlap['hidden_seconds'] * 1e3:.3f} ms of it beside other kernels: "
                         f"{overlap['hidden_fraction']:.0%} hidden")
        slowed = slowdown_line(r, rows)
        if slowed:
            lines.append("  " + slowed)
        if not any(r["seconds"].values()):
            lines.append("  (no device kernels in the trace: on CPU XLA records no per-kernel events; "
                         "profile on a GPU)")
    return "\n".join(lines)

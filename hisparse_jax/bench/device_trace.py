"""The device kernels of a profiler trace: what ran, for how long, on which stream, and for which
HLO instruction; their device time per step by category (hisparse_jax.bench.kernel_categories),
how much of RESOLVE's record copy ran beside other kernels, and which kernels ran beside it (their
slowdown against a run without the copy)."""

from __future__ import annotations

import bisect
import dataclasses
import glob
import gzip
import json
import math
import os
import re
import stat
import zlib
from typing import Iterable

from .errors import BenchError
from .kernel_categories import CATEGORIES, Instruction, classify

# A profiled decode call's trace is a few MB decompressed (4-5 MB for 16 steps of a GLM-5.1 slice);
# one past this bound is not one and is refused when its decompressed bytes pass it (a gzip bomb is
# not decompressed whole). Parsing takes a few times the JSON's size in memory on top of it.
TRACE_MAX_BYTES = 1 << 30
_PIECE = 16 << 20  # decompressed a piece at a time, so the bound holds within a piece
_WANTED = "the trace of a profiled run (jax.profiler's plugins/profile/<run>/*.trace.json.gz)"


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One kernel launch of the trace: its name, HLO instruction, duration, and (for overlap)
    its start in seconds and the device stream it ran on."""

    kernel: str
    hlo_op: str
    seconds: float
    start: float = 0.0
    stream: str = ""


def _read_trace(path: str):
    """The JSON of a gzipped trace file, read within TRACE_MAX_BYTES decompressed, or BenchError in
    one line naming the file: not a regular file, not gzip, cut short, past the bound, not JSON."""
    data = bytearray()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise BenchError(f"{path}: not a regular file (a directory, device or pipe); pass {_WANTED}")
        with gzip.open(path) as f:
            while len(data) <= TRACE_MAX_BYTES:
                piece = f.read(min(_PIECE, TRACE_MAX_BYTES + 1 - len(data)))
                if not piece:
                    break
                data += piece
    # OSError: unreadable, or gzip.BadGzipFile (not gzip); EOFError: cut short; zlib.error: corrupt.
    except (OSError, EOFError, zlib.error) as err:
        raise BenchError(f"{path}: not a readable gzip file ({type(err).__name__}: {str(err)[:80]}); "
                         f"pass {_WANTED}") from None
    if len(data) > TRACE_MAX_BYTES:
        raise BenchError(f"{path}: more than {TRACE_MAX_BYTES} bytes decompressed (TRACE_MAX_BYTES; a profiled "
                         f"decode call's trace is a few MB), larger than {_WANTED} can be")
    try:
        return json.loads(data)
    # ValueError: JSONDecodeError, not UTF-8, an integer too long to convert; RecursionError: "[[[[..."
    # nested past the parser's stack.
    except (ValueError, RecursionError) as err:
        raise BenchError(f"{path}: not JSON ({type(err).__name__}: {str(err)[:80]}); pass {_WANTED}") from None


def _micros(event: dict, key: str, path: str, i: int) -> float:
    """An event's `key` (ts or dur, microseconds; 0 when absent) as seconds, or BenchError unless
    a finite number >= 0."""
    value = event.get(key, 0.0)
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    except OverflowError:  # an int past the float range
        ok = False
    if not ok:
        raise BenchError(f"{path}: event {i}'s {key} is {repr(value)[:40]}, not a finite number of microseconds "
                         f">= 0; pass {_WANTED}")
    return float(value) * 1e-6


def device_kernels(trace_dir: str, module: str | None = None) -> list[KernelTime]:
    """Every kernel the device ran in the trace under `trace_dir` (the newest run), only those of
    the HLO module named `module` when given (the profiled program, not small jits around it).
    [] without a trace; BenchError in one line naming the file for a trace that is not one (see
    _read_trace; traceEvents not a list of objects, an event's args not an object, a kernel's ts or
    dur not a finite number >= 0)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))
    if not files:
        return []
    path = files[-1]
    trace = _read_trace(path)
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise BenchError(f"{path}: its traceEvents is not a list of objects; pass {_WANTED}")
    for i, e in enumerate(events):
        if not isinstance(e.get("args", {}), dict):
            raise BenchError(f"{path}: event {i}'s args is not an object; pass {_WANTED}")
    # Process ids as text: an id of another JSON type (a list) is no device's, and is not hashed.
    devices = {str(e["pid"]) for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and isinstance(e.get("pid"), (int, str))
               and re.search(r"/device:(GPU|TPU)", str(e.get("args", {}).get("name", "")))}
    out = []
    for i, e in enumerate(events):
        if e.get("ph") != "X" or str(e.get("pid")) not in devices:
            continue
        args = e.get("args", {})
        # A kernel the prefetch launched on its own stream may carry no module annotation; the
        # trace covers the profiled call alone, so a fetch kernel in it is that call's.
        if module is not None and args.get("hlo_module") != module and (
                args.get("hlo_module") or "fetchkernel" not in str(e.get("name", "")).lower()):
            continue
        out.append(KernelTime(str(e.get("name", "")), str(args.get("hlo_op", "")), _micros(e, "dur", path, i),
                              _micros(e, "ts", path, i), str(e.get("tid", ""))))
    return out


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering the same time as `intervals`."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals two disjoint sorted interval lists have in common."""
    i = j = 0
    common = []
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            common.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return common


def _copies_by_stream(kernels: Iterable[KernelTime], instructions: dict[str, Instruction]):
    """(stream -> the union of the record copy's (fetch kernels') intervals on it, the other
    kernels with their categories)."""
    io, others = {}, []
    for k in kernels:
        category = classify(k.kernel, instruction_of(k, instructions))
        if category == "IO":
            io.setdefault(k.stream, []).append((k.start, k.start + k.seconds))
        else:
            others.append((k, category))
    return {stream: _union(spans) for stream, spans in io.items()}, others


def io_overlap(kernels: Iterable[KernelTime], instructions: dict[str, Instruction], steps: int) -> dict | None:
    """How much of RESOLVE's record copy ran while other kernels ran, from the device timestamps.

    Copy time: the union of the fetch kernels' intervals (category "IO": the split plan's and the
    prefetch's copy; a fused resolve copies inside its resolve kernel and is not seen here).
    Hidden: the part of it during which a kernel of another category ran on another stream.
    Returns {"io_seconds", "hidden_seconds" (per step), "hidden_fraction"}, or None without a
    fetch kernel in the trace.
    """
    copies, others = _copies_by_stream(kernels, instructions)
    if not copies:
        return None
    copy = _union([span for spans in copies.values() for span in spans])
    # A copy hides only beside kernels of other streams: work on its own stream runs before or
    # after it, never beside it (the anchor's copy on the compute stream hides nothing).
    hidden_spans = []
    for stream, mine in copies.items():
        busy = _union([(k.start, k.start + k.seconds) for k, _ in others if k.stream != stream])
        hidden_spans += _intersection(mine, busy)
    total, hidden = _length(copy), _length(_union(hidden_spans))
    return dict(io_seconds=total / steps, hidden_seconds=hidden / steps,
                hidden_fraction=hidden / total if total > 0 else 0.0)


def kernel_key(kernel: KernelTime, instructions: dict[str, Instruction]) -> str:
    """What names the same kernel in two compiled programs of one model (with and without
    prefetch, say): a custom call's kernel by its CUDA function's name without its template
    arguments (the launcher may pick another variant for a smaller launch); an XLA kernel by its
    instruction's opcode, model scope and fused ops (XLA numbers fusions per program, so their
    names do not carry over)."""
    inst = instruction_of(kernel, instructions)
    if inst is None or inst.target:
        name = kernel.kernel.replace("(anonymous namespace)", "")
        name = re.split(r"[<(]", name.removeprefix("void "), maxsplit=1)[0]
        return name.split("::")[-1].strip() or kernel.kernel
    return f"{inst.opcode}:{inst.scope}:{'.'.join(inst.fused_ops)}"


def kernel_seconds(kernels: Iterable[KernelTime], instructions: dict[str, Instruction], steps: int) -> dict[str, float]:
    """kernel_key -> device seconds per step of its launches."""
    out: dict[str, float] = {}
    for k in kernels:
        key = kernel_key(k, instructions)
        out[key] = out.get(key, 0.0) + k.seconds / steps
    return out


def beside_copy(kernels: Iterable[KernelTime], instructions: dict[str, Instruction]) -> list[str]:
    """The kernel_keys of the kernels with a launch that ran while the record copy ran on another
    stream: the kernels the copy may slow down. Sorted; empty without a copy. RESOLVE's own kernels
    are left out: without prefetch they do the copy themselves (the fused plan), so their time is
    no baseline for a probe beside a copy."""
    copies, others = _copies_by_stream(kernels, instructions)
    keys = set()
    for stream, spans in copies.items():
        copy = [(a, b) for a, b in spans if b > a]  # an empty span overlaps nothing
        starts = [a for a, _ in copy]
        for k, category in others:
            if category == "resolve" or k.stream == stream or k.seconds <= 0:
                continue
            # The last copy span starting before the kernel ends is the only one that can overlap it
            # (the spans are disjoint and sorted): a bisection, not a walk over every span.
            i = bisect.bisect_left(starts, k.start + k.seconds) - 1
            if i >= 0 and copy[i][1] > k.start:
                keys.add(kernel_key(k, instructions))
    return sorted(keys)


def copy_slowdown(beside: list[str], with_copy: dict[str, float], without_copy: dict[str, float]) -> dict | None:
    """The kernels that ran beside the copy (`beside`, from the run with it) against the same
    kernels in a run without it (kernel_seconds of both): {"kinds", "seconds", "baseline_seconds"
    (per step, over the kinds found in both runs), "slowdown" (seconds / baseline_seconds - 1, or
    None when no kind is found in both), "unmatched" (the kinds the run without the copy lacks),
    "unmatched_seconds" (their seconds per step)}, or None when nothing ran beside it.
    A kind counts whole: all its launches in the step, beside the copy or not, in both runs (so a
    batch split into overlap groups is counted with what the split itself costs)."""
    if not beside:
        return None
    matched = [k for k in beside if k in without_copy]
    seconds = sum(with_copy.get(k, 0.0) for k in matched)
    baseline = sum(without_copy[k] for k in matched)
    unmatched = [k for k in beside if k not in without_copy]
    return dict(kinds=len(matched), seconds=seconds, baseline_seconds=baseline,
                slowdown=seconds / baseline - 1.0 if baseline > 0 else None, unmatched=unmatched,
                unmatched_seconds=sum(with_copy.get(k, 0.0) for k in unmatched))


def timeline(kernels: Iterable[KernelTime], steps: int) -> dict:
    """How busy the device was over the profiled call: kernels launched per step, and the time per
    step between the first kernel's start and the last one's end during which no kernel of the
    call ran on any stream (launch gaps, host waits). The profiler itself widens these gaps, so
    the decode report also sets the kernels' busy time against the unprofiled step time.
    Returns {"kernels_per_step", "idle_seconds", "busy_seconds" (per step, the time at least one
    kernel of the call ran: the kernels' sum less what ran beside other kernels, e.g. a prefetch
    copy on its own stream)} (zeros for an empty trace)."""
    spans = [(k.start, k.start + k.seconds) for k in kernels]
    if not spans:
        return dict(kernels_per_step=0.0, idle_seconds=0.0, busy_seconds=0.0)
    busy = _length(_union(spans))
    span = max(b for _, b in spans) - min(a for a, _ in spans)
    return dict(kernels_per_step=len(spans) / steps, idle_seconds=max(span - busy, 0.0) / steps,
                busy_seconds=busy / steps)


def instruction_of(kernel: KernelTime, instructions: dict[str, Instruction]) -> Instruction | None:
    """The HLO instruction a kernel ran for: the trace's hlo_op, or, inside a command buffer (a
    captured CUDA graph, whose kernels all carry the command buffer's name), the instruction the
    kernel is named after (XLA names a fusion's kernel after it, '.' written '_')."""
    found = instructions.get(kernel.hlo_op)
    if found is not None and found.opcode != "command-buffer" and not kernel.hlo_op.startswith("command_buffer"):
        return found
    return instructions.get(kernel.kernel) or instructions.get(kernel.kernel.replace("_", "."))


def summarize(kernels: Iterable[KernelTime], instructions: dict[str, Instruction], steps: int):
    """(category -> seconds per step, top kernels) of the kernels of `steps` decode steps."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel: dict[tuple[str, str], float] = {}
    for k in kernels:
        category = classify(k.kernel, instruction_of(k, instructions))
        seconds[category] += k.seconds / steps
        per_kernel[(category, k.kernel)] = per_kernel.get((category, k.kernel), 0.0) + k.seconds / steps
    top = sorted(((c, n, s) for (c, n), s in per_kernel.items()), key=lambda t: -t[2])[:12]
    return seconds, top

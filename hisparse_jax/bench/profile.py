"""Where a decode step's device time goes, next to the step's roofline.

`profile_decode` runs one jitted decode call under the JAX profiler, reads the device kernels of
its trace, maps each kernel to the HLO instruction it ran for (the trace names it) and that
instruction to the named scope of the model code it came from (the compiled program's metadata),
and sums device time per step in a few categories:

  weights/FFN   matmuls that read weights (projections, MLP, read-out, unembedding, the
                indexer's projections)
  attention     the attention over the selected records and the open page (the `attend` scope),
                and the rest of the attention scopes (gathers, softmax)
  indexer       the indexer's scoring (DSA's lightning indexer, Quest's page bounds)
  top-k         the selection of the top-k records
  resolve, IO   RESOLVE's resolve kernel and its record copy (the split plan's fetch kernel;
                the fused plan copies inside the resolve kernel, so IO shows under resolve)
  copies        copies, slices and pads the compiler materialized
  other         the rest (embedding, sampling, sealing, small fusions)

The roofline is the step's bytes at bandwidths measured in the same run: weights, the family's
per-request metadata read (index keys, page bounds, compressed KV) and the records attention
reads, at the HBM copy bandwidth; the miss IO at the pinned-host gather bandwidth of RESOLVE.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
import time
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from .. import decode
from ..models.moe import expected_active_experts

CATEGORIES = ("weights/FFN", "attention", "indexer", "top-k", "resolve", "IO", "copies", "other")

_GEMM = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|matmul|\bdot\b|sm\d+_", re.IGNORECASE)
_COPY_OPS = ("copy", "dynamic-slice", "slice", "pad", "concatenate", "transpose")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """What the compiled program says about one HLO instruction."""

    opcode: str
    scope: str  # the op_name metadata: jit(...)/while/body/decode_step/indexer/...
    target: str  # custom_call_target, or ""
    fused_ops: tuple[str, ...]  # opcodes inside a fusion


def hlo_instructions(hlo_text: str) -> dict[str, Instruction]:
    """Instruction name -> Instruction, from compiled HLO text (fusions know what they fuse)."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            bodies[current] = []
        elif current is not None:
            bodies[current].append(line)
    out = {}
    for lines in bodies.values():
        for line in lines:
            m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = (?:\([^=]*?\)|\S+) ([\w\-]+)\(", line)
            if not m:
                continue
            name, opcode = m.group(1), m.group(2)
            scope = re.search(r'op_name="([^"]*)"', line)
            target = re.search(r'custom_call_target="([^"]*)"', line)
            called = re.search(r"calls=%?([\w.\-]+)", line)
            fused = ()
            if opcode == "fusion" and called and called.group(1) in bodies:
                fused = tuple(re.findall(r"= (?:\([^=]*?\)|\S+) ([\w\-]+)\(", "\n".join(bodies[called.group(1)])))
            inst = Instruction(opcode, scope.group(1) if scope else "", target.group(1) if target else "", fused)
            out[name] = inst
            out.setdefault(name.replace(".", "_"), inst)  # how kernels are named after instructions
    return out


def classify(kernel: str, instruction: Instruction | None) -> str:
    """The category of one kernel launch (CATEGORIES).

    Custom calls by their kernels; then copies; then matmuls: those over attended KV (the
    `attend` scope) are attention, every other one reads weights; the rest by model scope.
    """
    inst = instruction or Instruction("", "", "", ())
    scope = inst.scope.lower()
    name = kernel.lower()
    text = f"{name} {inst.target}".lower()
    if "hisparse_resolve" in text or "resolvekernel" in name or "fetchkernel" in name:
        return "IO" if "fetchkernel" in name else "resolve"
    if "hisparse_topk" in text or "topk" in name or "sort" in name:
        return "top-k"
    if "hisparse_index_scores" in text or "indexscores" in name:
        return "indexer"
    if inst.opcode in _COPY_OPS or "memcpy" in name or "dynamic_slice" in name or (
        inst.opcode == "fusion" and inst.fused_ops
        and set(inst.fused_ops) <= {*_COPY_OPS, "parameter", "bitcast", "constant", "tuple"}
    ):
        return "copies"
    if "/attend" in scope:
        return "attention"
    if _GEMM.search(kernel) or inst.opcode == "dot" or "gemm" in inst.target.lower():
        return "weights/FFN"
    if "/indexer" in scope:
        return "indexer"
    if any(s in scope for s in ("/attention", "/selected", "/window", "/compressed", "/select")):
        return "attention"
    return "other"


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One kernel launch of the trace: its name, HLO instruction, duration, and (for overlap)
    its start in seconds and the device stream it ran on."""

    kernel: str
    hlo_op: str
    seconds: float
    start: float = 0.0
    stream: str = ""


def device_kernels(trace_dir: str, module: str | None = None) -> list[KernelTime]:
    """Every kernel the device ran in the trace under `trace_dir` (the newest run), only those of
    the HLO module named `module` when given (the profiled program, not small jits around it)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))
    if not files:
        return []
    with gzip.open(files[-1]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and re.search(r"/device:(GPU|TPU)", str(e.get("args", {}).get("name", "")))}
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in devices:
            continue
        args = e.get("args", {})
        # A kernel the prefetch launched on its own stream may carry no module annotation; the
        # trace covers the profiled call alone, so a fetch kernel in it is that call's.
        if module is not None and args.get("hlo_module") != module and (
                args.get("hlo_module") or "fetchkernel" not in str(e.get("name", "")).lower()):
            continue
        out.append(KernelTime(str(e.get("name", "")), str(args.get("hlo_op", "")), float(e.get("dur", 0.0)) * 1e-6,
                              float(e.get("ts", 0.0)) * 1e-6, str(e.get("tid", ""))))
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


def io_overlap(kernels: Iterable[KernelTime], instructions: dict[str, Instruction], steps: int) -> dict | None:
    """How much of RESOLVE's record copy ran while other kernels ran, from the device timestamps.

    Copy time: the union of the fetch kernels' intervals (category "IO": the split plan's and the
    prefetch's copy; a fused resolve copies inside its resolve kernel and is not seen here).
    Hidden: the part of it during which a kernel of another category ran on another stream.
    Returns {"io_seconds", "hidden_seconds" (per step), "hidden_fraction"}, or None without a
    fetch kernel in the trace.
    """
    io, busy = [], []
    for k in kernels:
        span = (k.start, k.start + k.seconds)
        if classify(k.kernel, _instruction_of(k, instructions)) == "IO":
            io.append((span, k.stream))
        else:
            busy.append((span, k.stream))
    if not io:
        return None
    copy = _union([span for span, _ in io])
    # A copy hides only beside kernels of other streams: work on its own stream runs before or
    # after it, never beside it (the anchor's copy on the compute stream hides nothing).
    hidden_spans = []
    for stream in {stream for _, stream in io}:
        mine = _union([span for span, s in io if s == stream])
        others = _union([span for span, s in busy if s != stream])
        hidden_spans += _intersection(mine, others)
    total, hidden = _length(copy), _length(_union(hidden_spans))
    return dict(io_seconds=total / steps, hidden_seconds=hidden / steps,
                hidden_fraction=hidden / total if total > 0 else 0.0)


def _instruction_of(kernel: KernelTime, instructions: dict[str, Instruction]) -> Instruction | None:
    """The HLO instruction a kernel ran for: the trace's hlo_op, or, inside a command buffer (a
    captured CUDA graph, whose kernels all carry the command buffer's name), the instruction the
    kernel is named after (XLA names a fusion's kernel after it, '.' written '_')."""
    found = instructions.get(kernel.hlo_op)
    if found is not None and found.opcode != "command-buffer" and not kernel.hlo_op.startswith("command_buffer"):
        return found
    return instructions.get(kernel.kernel) or instructions.get(kernel.kernel.replace("_", "."))


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
    """

    seconds: dict[str, float]
    step_seconds: float
    roofline_seconds: float
    bytes: dict[str, float]
    bandwidths: dict[str, float]
    top_kernels: list[tuple[str, str, float]]
    io_overlap: dict | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def summarize(kernels: Iterable[KernelTime], instructions: dict[str, Instruction], steps: int):
    """(category -> seconds per step, top kernels) of the kernels of `steps` decode steps."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel: dict[tuple[str, str], float] = {}
    for k in kernels:
        category = classify(k.kernel, _instruction_of(k, instructions))
        seconds[category] += k.seconds / steps
        per_kernel[(category, k.kernel)] = per_kernel.get((category, k.kernel), 0.0) + k.seconds / steps
    top = sorted(((c, n, s) for (c, n), s in per_kernel.items()), key=lambda t: -t[2])[:12]
    return seconds, top


# --------------------------------------------------------------------------- bandwidths and bytes


def _median_seconds(fn, *args, reps: int = 5, calls: int = 20) -> float:
    """Median seconds per call of `reps` timings of `calls` back-to-back calls (dispatch overlaps
    the device work, as it does in a decode loop)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready([fn(*args) for _ in range(calls)])
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def hbm_bandwidth(nbytes: int | None = None) -> float:
    """Bytes/s the device reads weights at: the faster of a sum over `nbytes` (default 2 GiB, 256
    MiB on CPU) and a matrix-vector product with a bf16 matrix of `nbytes` (what a decode step
    does with its weights). The roofline's bytes are reads (weights, keys, records)."""
    nbytes = nbytes or (2**28 if jax.default_backend() == "cpu" else 2**31)
    x = jnp.ones((nbytes // 4,), jnp.float32)
    summed = nbytes / _median_seconds(jax.jit(jnp.sum), x)
    del x
    w = jnp.ones((4096, nbytes // (2 * 4096)), jnp.bfloat16)
    v = jnp.ones((1, 4096), jnp.bfloat16)
    matvec = nbytes / _median_seconds(jax.jit(lambda v, w: v @ w), v, w)
    return max(summed, matvec)


def host_link_bandwidth(record_bytes: int, streams: int = 64, k: int = 2048, reps: int = 5) -> float:
    """Bytes/s RESOLVE fetches from pinned host memory when every selected record misses."""
    from .. import CacheConfig, alloc_host_pool, init_hot_cache, resolve

    config = CacheConfig(num_layers=1, stream_shape=(streams,), pool_records=4 * k, hot_slots=k, top_k=k,
                         record_width=record_bytes // 4, dtype=np.float32)
    pool = alloc_host_pool(config)
    sealed = jnp.full((streams,), 4 * k, jnp.int32)
    # The pool is an argument: a closed-over array would be a constant of the program, on device.
    call = jax.jit(lambda cache, pool, sel: resolve(cache, pool, sel, sealed, 0), donate_argnums=0)
    times = []
    for rep in range(reps + 1):
        cache = init_hot_cache(config)  # empty: every id misses
        sel = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32) + (rep % 4) * k, (streams, k))
        jax.block_until_ready((cache, sel))
        t0 = time.perf_counter()
        jax.block_until_ready(call(cache, pool, sel))
        if rep:
            times.append(time.perf_counter() - t0)
    return streams * k * record_bytes / float(np.median(times))


def weight_bytes(weights, batch: int, config=None) -> float:
    """Bytes of weights one step reads: every weight, but only `batch` rows of the embedding, and
    of a mixture of experts' routed experts (hisparse_jax.models.moe) only those a step is
    expected to use: batch x experts_per_token (token, expert) pairs land on the layer's local
    experts, which under uniform routing leave E (1 - 1/E)^pairs of them idle. The grouped
    matmul reads no idle expert, so a roofline that counted every expert would be too slow."""
    total = 0.0
    for path, leaf in jax.tree_util.tree_flatten_with_path(weights)[0]:
        names = {getattr(key, "name", None) for key in path}
        share = 1.0
        if config is not None and "moe" in names and "routed" in names and config.experts > 0:
            pairs = batch * config.experts_per_token
            share = expected_active_experts(config.experts, pairs) / config.experts
        total += leaf.nbytes * share
    embed = weights.embed
    return total - embed.nbytes + batch * embed.shape[1] * embed.dtype.itemsize


def step_bytes(family, config, weights, batch: int, context: int, misses_per_step: float) -> dict[str, float]:
    """Bytes one decode step must move: weights, the family's metadata, the attended records
    (HBM), and the miss IO (host link)."""
    cache = config.cache_config(batch)
    streams = int(np.prod(cache.stream_shape))
    attended = cache.num_layers * streams * (config.top_k + 1) * config.record_bytes
    return {
        "weights": float(weight_bytes(weights, batch, config)),
        "metadata": float(batch * family.metadata_bytes_read(config, context)),
        "attended KV": float(attended),
        "miss IO": float(misses_per_step * config.record_bytes),
    }


# --------------------------------------------------------------------------- the profiled call


def measure_bandwidths(record_bytes: int) -> dict[str, float]:
    """The roofline's bandwidths, measured now: "hbm" (reading 2 GiB), "host link" (RESOLVE
    fetching records of `record_bytes` from pinned host memory, every selected record a miss)."""
    return {"hbm": hbm_bandwidth(), "host link": host_link_bandwidth(record_bytes)}


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
    hlo = traced.lower().compile().as_text()
    instructions = hlo_instructions(hlo)
    module = re.match(r"HloModule ([\w.\-]+)", hlo)
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="hisparse-profile-")
    os.makedirs(trace_dir, exist_ok=True)
    with open(os.path.join(trace_dir, "program.hlo.txt"), "w") as f:  # kernel names -> model scopes
        f.write(hlo)
    jax.block_until_ready((state, first_tokens))
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        t0 = time.perf_counter()
        generated = decode.generate(family, config, weights, state, first_tokens, steps, **options)
        out, misses, state = generated.tokens, generated.misses, generated.state
        jax.block_until_ready(out)
        wall = (time.perf_counter() - t0) / steps
    kernels = device_kernels(trace_dir, module.group(1) if module else None)
    seconds, top = summarize(kernels, instructions, steps)
    overlap = io_overlap(kernels, instructions, steps)
    if bandwidths is None:
        bandwidths = measure_bandwidths(config.record_bytes)
    moved = step_bytes(family, config, weights, batch, context, float(np.asarray(misses).sum()) / steps)
    hbm = moved["weights"] + moved["metadata"] + moved["attended KV"]
    roofline = hbm / bandwidths["hbm"] + moved["miss IO"] / bandwidths["host link"]
    return StepProfile(seconds, wall, roofline, moved, dict(bandwidths), top, overlap), out, state


def format_profile(rows: list[dict]) -> str:
    """A markdown table of profile rows (StepProfile fields plus mode, context, batch): device ms
    per step by category, the device sum, the step and its roofline."""
    head = ("| mode | context | trace | batch | " + " | ".join(CATEGORIES)
            + " | device sum | step | roofline | step / roofline | tokens/s / roofline tokens/s |")
    lines = [head, "|" + "---|" * (len(CATEGORIES) + 9)]
    for r in rows:
        cells = " | ".join(f"{r['seconds'][c] * 1e3:.3f}" for c in CATEGORIES)
        total = sum(r["seconds"].values())
        lines.append(f"| {r['mode']}{' + prefetch' if r.get('run') == 'prefetch' else ''} | {r['context']} | {r.get('trace') or '-'} | {r['batch']} | {cells} | "
                     f"{total * 1e3:.3f} | {r['step_seconds'] * 1e3:.3f} | {r['roofline_seconds'] * 1e3:.3f} | "
                     f"{r['step_seconds'] / r['roofline_seconds']:.2f} | "
                     f"{r['roofline_seconds'] / r['step_seconds']:.0%} |")
    lines += ["", "ms per step of the profiled call; roofline = (weights + metadata + attended KV) / HBM + "
                  "miss IO / host link (routed experts: the bytes of the experts expected to receive a token)"]
    for r in rows:
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in r["bytes"].items())
        bw = ", ".join(f"{k} {v / 1e9:.0f} GB/s" for k, v in r["bandwidths"].items())
        run = " (prefetch)" if r.get("run") == "prefetch" else ""
        lines.append(f"- {r['mode']}{run} @ {r['context']}: {parts}; {bw}")
        overlap = r.get("io_overlap")
        if overlap:
            lines.append(f"  record copy (fetch kernels) {overlap['io_seconds'] * 1e3:.3f} ms per step, "
                         f"{overlap['hidden_seconds'] * 1e3:.3f} ms of it beside other kernels: "
                         f"{overlap['hidden_fraction']:.0%} hidden")
        if not any(r["seconds"].values()):
            lines.append("  (no device kernels in the trace: on CPU XLA records no per-kernel events; "
                         "profile on a GPU)")
    return "\n".join(lines)

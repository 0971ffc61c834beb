"""Per-kernel table of a profiled decode call: what each kernel of a category costs a step and
how fast it reads what it reads.

    python3 benchmarks/kernel_table.py PROFILE_DIR STEPS [--category weights/FFN] [--hbm 4.358e12]

PROFILE_DIR is one run's directory under `hisparse-bench decode --profile --profile-dir D`
(D/<mode>-<context>-<trace>: program.hlo.txt and plugins/profile/*/): the kernels of the profiled
call, grouped by kernel name, with launches per step, microseconds per call (min / median / max),
microseconds per step, and for kernels XLA named after an instruction the bytes of that
instruction's operands (what a matmul fusion reads: its weight, the activations), the bandwidth
that implies and the model scope of the instruction. Custom-call kernels (the grouped matmul)
carry their CUDA names and no operand shapes: their bytes come from the model's shapes
(hisparse_jax.bench.roofline). STEPS is the --steps of the run (16 by default).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys

from hisparse_jax import hlo
from hisparse_jax.bench.device_trace import device_kernels, instruction_of
from hisparse_jax.bench.kernel_categories import classify, hlo_instructions

_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "s8": 1, "u8": 1,
          "pred": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2}


def array_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape ('bf16[4,8]{1,0}', or a tuple of them)."""
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        n = 1
        for d in dims.split(","):
            n *= int(d) if d else 1
        total += n * _BYTES.get(dtype, 4)
    return total


def table(profile_dir: str, steps: int, category: str | None, hbm: float) -> str:
    text = open(f"{profile_dir}/program.hlo.txt").read()
    module = hlo.parse(text)
    instructions = hlo_instructions(module)
    raw = dict(module.instructions)
    raw.update({name.replace(".", "_"): inst for name, inst in module.instructions.items()})
    calls: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    totals: dict[str, float] = collections.Counter()
    for k in device_kernels(profile_dir, module.name):
        c = classify(k.kernel, instruction_of(k, instructions))
        totals[c] += k.seconds / steps
        calls[(c, k.kernel)].append(k.seconds)
    lines = ["per step (ms): " + ", ".join(f"{c} {s * 1e3:.3f}" for c, s in sorted(totals.items(), key=lambda t: -t[1])),
             "", "| category | kernel | per step | us per call min / median / max | us per step | operand MB | "
             "TB/s at the median | of HBM | shapes | scope |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (c, name), secs in sorted(calls.items(), key=lambda t: -sum(t[1])):
        if category and c != category:
            continue
        med = statistics.median(secs)
        inst = raw.get(name)
        mb = rate = share = shapes = scope = ""
        if inst is not None:
            operands = [raw[o] for o in inst.operands if o in raw]
            read = sum(array_bytes(o.shape.split("{")[0]) for o in operands)
            mb = f"{read / 1e6:.2f}"
            rate = f"{read / med / 1e12:.2f}"
            share = f"{read / med / hbm:.0%}"
            shapes = " ".join(o.shape.split("{")[0] for o in operands) + " -> " + inst.shape.split("{")[0]
            scope = inst.scope
            if not scope and inst.fusion_body in module.computations:
                scopes = [i.scope for i in module.computations[inst.fusion_body] if i.scope]
                scope = scopes[-1] if scopes else ""
            scope = scope.split("decode_step/")[-1]
        lines.append(f"| {c} | {name[:90]} | {len(secs) / steps:.2f} | {min(secs) * 1e6:.2f} / {med * 1e6:.2f} / "
                     f"{max(secs) * 1e6:.2f} | {sum(secs) / steps * 1e6:.1f} | {mb} | {rate} | {share} | {shapes} | {scope} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile_dir", help="the --profile-dir of a profiled hisparse-bench decode run")
    p.add_argument("steps", type=int, help="decode steps in the profiled call (per-step figures divide by it)")
    p.add_argument("--category", default="weights/FFN", help="one category, or 'all'")
    p.add_argument("--hbm", type=float, default=4.358e12, help="HBM bytes/s for the 'of HBM' column")
    a = p.parse_args(argv)
    print(table(a.profile_dir, a.steps, None if a.category == "all" else a.category, a.hbm))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

A bad argument or a profile that is not one (no such folder, no program.hlo.txt or one without an
HloModule, no trace or one that is not a readable gzipped JSON trace, no device kernels: a CPU
run's) is refused in one line naming it, exit status 2. program.hlo.txt is read within
HLO_MAX_BYTES and the trace within hisparse_jax.bench.device_trace.TRACE_MAX_BYTES decompressed.
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import re
import statistics
import sys

from hisparse_jax import hlo
from hisparse_jax.bench.device_trace import device_kernels, instruction_of
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.kernel_categories import CATEGORIES, classify, hlo_instructions
from hisparse_jax.bench.user_files import read_bounded_text

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import one_line_errors  # noqa: E402

# A profiled program's HLO text is a few MB (1.4 MB for a GLM-5.1 slice); a file far past that is
# not one, and is refused before it is read (parsing takes several times its size).
HLO_MAX_BYTES = 256 << 20
_WANTED = "one profiled run's folder (hisparse-bench decode --profile --profile-dir D: D/<mode>-<context>-<trace>)"

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


def program(profile_dir: str) -> hlo.Module:
    """The parsed program.hlo.txt of a profiled run's folder, read within HLO_MAX_BYTES, or
    BenchError in one line: no such folder, no readable regular file, no HloModule in it."""
    if not os.path.isdir(profile_dir):
        what = "a file, not a folder" if os.path.exists(profile_dir) else "no such folder"
        raise BenchError(f"PROFILE_DIR {profile_dir!r}: {what}; pass {_WANTED}")
    path = os.path.join(profile_dir, "program.hlo.txt")
    text = read_bounded_text(path, HLO_MAX_BYTES, f"{_WANTED}, which holds the profiled program's program.hlo.txt")
    try:
        module = hlo.parse(text)
    except (ValueError, IndexError, KeyError, AttributeError, TypeError, RecursionError) as err:
        raise BenchError(f"{path}: not HLO text ({type(err).__name__}: {str(err)[:80]}); pass {_WANTED}") from None
    if module.name is None:
        raise BenchError(f"{path}: no 'HloModule NAME' line at its top, so not a compiled program's HLO text; "
                         f"pass {_WANTED}")
    return module


def table(profile_dir: str, steps: int, category: str | None, hbm: float) -> str:
    """The table, or BenchError in one line naming the file that is not what a profiled run holds."""
    module = program(profile_dir)
    if not glob.glob(os.path.join(profile_dir, "plugins", "profile", "*", "*.trace.json.gz")):
        raise BenchError(f"PROFILE_DIR {profile_dir!r}: no trace in it (plugins/profile/<run>/*.trace.json.gz); "
                         f"pass {_WANTED}")
    kernels = device_kernels(profile_dir, module.name)
    if not kernels:
        raise BenchError(f"PROFILE_DIR {profile_dir!r}: its trace has no device kernels of {module.name} (a CPU "
                         f"run's has none); pass {_WANTED} on a GPU")
    try:
        return _rows(module, kernels, steps, category, hbm)
    except ValueError as err:  # a dimension too long for int() in a shape: not XLA's text
        raise BenchError(f"{profile_dir}/program.hlo.txt: a shape that is not an HLO shape ({str(err)[:80]}); "
                         f"pass {_WANTED}") from None


def _rows(module: hlo.Module, kernels, steps: int, category: str | None, hbm: float) -> str:
    instructions = hlo_instructions(module)
    raw = dict(module.instructions)
    raw.update({name.replace(".", "_"): inst for name, inst in module.instructions.items()})
    calls: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    totals: dict[str, float] = collections.Counter()
    for k in kernels:
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
            if med > 0:  # a median call of 0 us (below the trace's resolution) has no rate
                rate, share = f"{read / med / 1e12:.2f}", f"{read / med / hbm:.0%}"
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
    p = one_line_errors(argparse.ArgumentParser(prog="kernel_table.py", description=__doc__.split("\n\n")[0]))
    p.add_argument("profile_dir", help="one run's folder under the --profile-dir of a profiled hisparse-bench "
                                       "decode run (D/<mode>-<context>-<trace>)")
    p.add_argument("steps", type=int, help="decode steps in the profiled call, >= 1 (per-step figures divide by it)")
    p.add_argument("--category", default="weights/FFN", choices=(*CATEGORIES, "all"), metavar="CATEGORY",
                   help=f"one category ({', '.join(CATEGORIES)}), or 'all'")
    p.add_argument("--hbm", type=float, default=4.358e12, help="HBM bytes/s for the 'of HBM' column, > 0")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error(f"argument steps: expected the profiled call's decode steps, an integer >= 1, got {a.steps}")
    if not (math.isfinite(a.hbm) and a.hbm > 0):
        p.error(f"argument --hbm: expected HBM bytes/s, a finite number > 0, got {a.hbm}")
    try:
        print(table(a.profile_dir, a.steps, None if a.category == "all" else a.category, a.hbm))
    except BenchError as err:
        print(f"kernel_table: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

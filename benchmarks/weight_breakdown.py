"""The weights/FFN category of a profiled glm5-h200 decode call, kernel by kernel, next to the
bytes each kernel must read (the deployment slice's shapes) and the time those bytes take at HBM.

    python3 benchmarks/weight_breakdown.py PROFILE_DIR BATCH [--hbm 4.362e12] [--steps 16]

PROFILE_DIR: one run's directory of `hisparse-bench decode --deployment glm5-h200 --profile
--profile-dir D` (program.hlo.txt or .gz, plugins/profile/*). Each row: the kernel, the weight it
reads (XLA's kernels: named from their operands' shapes; the grouped matmul's: from its template,
the routed experts at the expected count of busy experts E (1 - (1 - 1/E)^(8 b)) the roofline
uses), launches per step, us per call min / median / max, us per step, the weight's MB, its time
at HBM, the median over that bound, and the excess per step. Kernels without a weight operand
(the split-K partial sums XLA adds up in separate or consumer fusions) have a bound of 0.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import math
import os
import re
import statistics
import sys

from hisparse_jax import hlo
from hisparse_jax.bench.device_trace import device_kernels, instruction_of
from hisparse_jax.bench.kernel_categories import classify, hlo_instructions

# kernel_table.py sits beside this script: importable when this file is run as a script and when
# it is imported as a module (tests/test_cli_help.py reads every script's options).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_table import array_bytes  # noqa: E402

# glm5-h200's per-layer weights as XLA's fusions see them (split-K views included).
NAMES = {
    "bf16[6144,2048]": "w_q_a", "bf16[2048,16384]": "w_q_b", "bf16[2048,64,256]": "w_q_b", "bf16[6144,576]": "w_kv",
    "bf16[64,192,512]": "w_uk", "bf16[64,512,256]": "w_uv", "bf16[64,256,6144]": "w_o", "bf16[16384,6144]": "w_o",
    "bf16[8,2048,6144]": "w_o", "bf16[6144,4096]": "i_q", "bf16[6144,32,128]": "i_q", "bf16[8,768,4096]": "i_q",
    "bf16[6144,128]": "i_k", "bf16[6144,32]": "i_head", "bf16[32,192,32]": "i_head", "f32[6144,256]": "router",
    "f32[32,192,256]": "router", "bf16[6144,15885]": "unembed", "bf16[4,1536,15885]": "unembed",
    "bf16[6144,15872]": "unembed", "bf16[4,1536,15872]": "unembed",
}
# The decode layout's merged input projections (hisparse_jax.kit.inputs): [D, r + dc + dr + HI dI + dI + HI].
MERGED_INPUTS = (6144, 2048 + 576 + 32 * 128 + 128 + 32)


def weight_name(shape: str) -> str | None:
    """The glm5-h200 weight an operand of HLO type `shape` is (a split-K view of the merged input
    matrix too: its rows split, its 6880 columns kept), or None."""
    if shape in NAMES:
        return NAMES[shape]
    dims = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])]
    if shape.startswith("bf16[") and dims and dims[-1] == MERGED_INPUTS[1] and \
            math.prod(dims) == MERGED_INPUTS[0] * MERGED_INPUTS[1]:
        return "inputs (w_q_a + w_kv + i_q + i_k + i_head, merged)"
    return None


EXPERTS, PER_TOKEN, GATE_UP, DOWN = 32, 8, 4096 * 6144, 6144 * 2048  # fp8: one byte a weight


def rows(profile_dir: str, batch: int, hbm: float, steps: int):
    path = os.path.join(profile_dir, "program.hlo.txt")
    text = gzip.open(path + ".gz", "rt").read() if os.path.exists(path + ".gz") else open(path).read()
    module = hlo.parse(text)
    instructions = hlo_instructions(module)
    raw = dict(module.instructions)
    raw.update({name.replace(".", "_"): inst for name, inst in module.instructions.items()})
    busy = EXPERTS * (1 - (1 - 1 / EXPERTS) ** (PER_TOKEN * batch))
    calls = collections.defaultdict(list)
    for k in device_kernels(profile_dir, module.name):
        if classify(k.kernel, instruction_of(k, instructions)) == "weights/FFN":
            calls[k.kernel].append(k.seconds)
    for name, secs in sorted(calls.items(), key=lambda t: -sum(t[1])):
        inst, what, weight = raw.get(name), "", 0.0
        template = re.search(r"GroupedMatmulKernel<(\w+), (\d), (\d), (\d), (\w+)>", name)
        if template:  # the split kernel is the shared expert's, wt2 the routed gate_up, wt1 the routed down
            if template.group(5) == "true":
                what, weight = "shared gate_up, down (E = 1, split K; mean of the two)", (GATE_UP + DOWN) / 2
            elif template.group(2) == "2":
                what, weight = f"routed gate_up ({busy:.2f} busy experts expected)", busy * GATE_UP
            else:
                what, weight = f"routed down ({busy:.2f} busy experts expected)", busy * DOWN
        elif inst is not None:
            shapes = [raw[o].shape.split("{")[0] for o in inst.operands if o in raw]
            named = [s for s in shapes if weight_name(s)]
            what = " + ".join(weight_name(s) for s in named) or " ".join(shapes) + " -> " + inst.shape.split("{")[0]
            weight = sum(array_bytes(s) for s in named)
        per_call, bound = statistics.median(secs), weight / hbm
        yield dict(kernel=name, weight=what, per_step=len(secs) / steps, us=(min(secs) * 1e6, per_call * 1e6, max(secs) * 1e6),
                   us_per_step=sum(secs) / steps * 1e6, mb=weight / 1e6, bound_us=bound * 1e6,
                   excess_us_per_step=(sum(secs) / steps - bound * len(secs) / steps) * 1e6)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile_dir", help="the --profile-dir of a profiled hisparse-bench decode run")
    p.add_argument("batch", type=int, help="the profiled mode's batch (sets the routed experts' expected busy count)")
    p.add_argument("--hbm", type=float, default=4.362e12, help="HBM read bytes/s for the byte bounds")
    p.add_argument("--steps", type=int, default=16, help="decode steps in the profiled call")
    a = p.parse_args(argv)
    print("| kernel | reads | per step | us per call min / median / max | us per step | weight MB | us at HBM | "
          "median / bound | excess us per step |\n|---|---|---|---|---|---|---|---|---|")
    total = bound = 0.0
    for r in rows(a.profile_dir, a.batch, a.hbm, a.steps):
        total += r["us_per_step"]
        bound += r["bound_us"] * r["per_step"]
        ratio = f"{r['us'][1] / r['bound_us']:.2f}x" if r["bound_us"] else "-"
        print(f"| {r['kernel'][:64]} | {r['weight']} | {r['per_step']:.0f} | {r['us'][0]:.1f} / {r['us'][1]:.1f} / "
              f"{r['us'][2]:.1f} | {r['us_per_step']:.0f} | {r['mb']:.1f} | {r['bound_us']:.1f} | {ratio} | "
              f"{r['excess_us_per_step']:.0f} |")
    print(f"\nweights/FFN {total / 1e3:.3f} ms per step; its kernels' weights at HBM {bound / 1e3:.3f} ms "
          f"({total / bound:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

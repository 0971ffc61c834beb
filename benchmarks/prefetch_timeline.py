"""Device timeline of one decode step from a `hisparse-bench decode --profile --profile-dir DIR`
trace: which kernels ran on which stream, so that the prefetch's record copy (RESOLVE's fetch
kernel on a stream of its own) can be seen beside the compute it overlaps.

    python benchmarks/prefetch_timeline.py DIR/hisparse-prefetch-131072-glm-5.1 --steps 16 --out timeline.png

Prints, for the step in the middle of the profiled call, every stream's busy time by category and
the fetch kernels with what ran beside each; writes a PNG of that step (one lane per stream).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys

from hisparse_jax.bench import device_trace, kernel_categories, outputs
from hisparse_jax.bench.errors import BenchError

COLORS = {"weights/FFN": "tab:blue", "attention": "tab:orange", "indexer": "tab:green", "top-k": "tab:olive",
          "resolve": "tab:purple", "IO": "tab:red", "copies": "tab:gray", "other": "tab:cyan"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir", help="one run's folder under --profile-dir (holds program.hlo.txt and plugins/)")
    p.add_argument("--steps", type=int, default=16, help="decode steps of the profiled call")
    p.add_argument("--out", default=None, help="PNG of the middle step (default: no plot)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"argument --steps: {args.steps} is below 1; give the profiled call's decode steps")
    if args.out is not None:  # checked before any work: a plot that cannot be written is a usage mistake
        try:
            outputs.check_file("--out", args.out)
        except BenchError as err:
            p.error(str(err))
        if importlib.util.find_spec("matplotlib") is None:
            p.error("--out draws with matplotlib, which is not installed: pip install matplotlib (or drop --out)")
    hlo_path = os.path.join(args.trace_dir, "program.hlo.txt")
    if not os.path.exists(hlo_path):
        sys.exit(f"prefetch_timeline: {hlo_path} not found; pass a run folder of --profile-dir")
    instructions = kernel_categories.hlo_instructions(open(hlo_path).read())
    kernels = device_trace.device_kernels(args.trace_dir)
    if not kernels:
        sys.exit(f"prefetch_timeline: no device kernels in the trace under {args.trace_dir}")
    begin = min(k.start for k in kernels)
    end = max(k.start + k.seconds for k in kernels)
    step = (end - begin) / args.steps
    lo = begin + step * (args.steps // 2)
    hi = lo + step
    shown = [k for k in kernels if lo <= k.start < hi]
    category = {id(k): kernel_categories.classify(k.kernel, device_trace.instruction_of(k, instructions))
                for k in shown}
    busy = collections.defaultdict(lambda: collections.Counter())
    for k in shown:
        busy[k.stream][category[id(k)]] += k.seconds
    print(f"step {args.steps // 2} of {args.steps}: {step * 1e3:.3f} ms (the call's span / steps)")
    for stream, by in sorted(busy.items()):
        parts = ", ".join(f"{c} {s * 1e3:.3f}" for c, s in by.most_common())
        print(f"  stream {stream}: {sum(by.values()) * 1e3:.3f} ms busy ({parts})")
    overlap = device_trace.io_overlap(shown, instructions, 1)
    if overlap:
        print(f"  record copy {overlap['io_seconds'] * 1e3:.3f} ms, {overlap['hidden_seconds'] * 1e3:.3f} ms beside "
              f"other kernels: {overlap['hidden_fraction']:.0%} hidden")
    for k in sorted((k for k in shown if category[id(k)] == "IO"), key=lambda k: k.start):
        beside = collections.Counter(category[id(o)] for o in shown if o.stream != k.stream
                                     and o.start < k.start + k.seconds and o.start + o.seconds > k.start)
        print(f"  fetch on stream {k.stream} at +{(k.start - lo) * 1e3:.3f} ms for {k.seconds * 1e3:.3f} ms; beside: "
              + (", ".join(f"{c} x{n}" for c, n in beside.most_common()) or "nothing"))
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        streams = sorted(busy)
        fig, ax = plt.subplots(figsize=(11, 1.2 + 0.6 * len(streams)))
        for row, stream in enumerate(streams):
            for k in shown:
                if k.stream == stream:
                    ax.broken_barh([((k.start - lo) * 1e3, k.seconds * 1e3)], (row - 0.4, 0.8),
                                   color=COLORS[category[id(k)]])
        ax.set_yticks(range(len(streams)), labels=[f"stream {s}" for s in streams])
        ax.set_xlabel("ms into the step")
        ax.set_title(os.path.basename(os.path.normpath(args.trace_dir)) + ": one decode step, device kernels",
                     fontsize=9)
        ax.legend(handles=[matplotlib.patches.Patch(color=c, label=n) for n, c in COLORS.items()], fontsize=7,
                  ncol=4, loc="upper right")
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""select_topk under jit: the XLA reference (lax.top_k, full sorts on a GPU) against the FFI
custom call (the radix-select kernel on a GPU, the C++ handler on a CPU), at the shapes of
ffi/bench/topk_bench.cu: k = 2048, R in {32768, 131072, 262144}, rows in {1, 2, 8, 10, 80, 160},
every row fully sealed, scores normal(0, 1) drawn once per shape.

Each timing is wall time around `--calls` back-to-back calls of the jitted function closed by
one jax.block_until_ready, divided by the number of calls; --reps such timings (after a warm-up
that compiles and runs the function) give min / median / max per call. Both implementations
are checked to select the same ids first. Prints a table and writes JSON.

  python benchmarks/topk_xla_bench.py results/topk_xla.json               # the GPU run
  python benchmarks/topk_xla_bench.py results/topk_xla.json --quick       # R = 131072, rows 2 and 80
  python benchmarks/topk_xla_bench.py out.json --records 32768 --rows 1 2  # a subset (also on CPU)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np

import hisparse_jax as hs
from hisparse_jax.bench import outputs
from hisparse_jax.bench.errors import BenchError

TOP_K = 2048


def time_calls(fn, args, calls: int, reps: int) -> list[float]:
    """Microseconds per call of `reps` timings, each over `calls` back-to-back calls."""
    jax.block_until_ready(fn(*args))  # compile and warm up
    jax.block_until_ready(fn(*args))
    per_call = []
    for _ in range(reps):
        start = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSON output path")
    parser.add_argument("--records", type=int, nargs="+", default=[32768, 131072, 262144],
                        help="records R per row (scores per row), every one sealed")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 10, 80, 160],
                        help="rows selected from per call")
    parser.add_argument("--calls", type=int, default=50, help="calls per timing")
    parser.add_argument("--reps", type=int, default=7, help="timings per shape and implementation")
    parser.add_argument("--quick", action="store_true", help="R = 131072, rows 2 and 80")
    args = parser.parse_args()
    if args.out is not None:  # checked before anything is timed: a run must not end unwritable
        try:
            outputs.check_file("out", args.out)
        except BenchError as err:
            parser.error(str(err))
    if args.quick:
        args.records, args.rows = [131072], [2, 80]
    implementations = ["reference", "ffi"] if hs.has_ffi() else ["reference"]
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.device_kind} ({jax.default_backend()}); k = {TOP_K}; "
          f"{args.reps} timings of {args.calls} calls each; implementations {implementations}\n")
    print("| R | rows | implementation | min us/call | median us/call | max us/call | median us/row |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    results = []
    rng = np.random.default_rng(0)
    for records in args.records:
        for rows in args.rows:
            scores = jax.device_put(rng.standard_normal((rows, records)).astype(np.float32), device)
            sealed = jax.device_put(np.full((rows,), records, np.int32), device)
            selected = {}
            for implementation in implementations:
                fn = jax.jit(lambda s, n, impl=implementation: hs.select_topk(s, n, TOP_K, implementation=impl))
                selected[implementation] = np.asarray(fn(scores, sealed))
                us = time_calls(fn, (scores, sealed), args.calls, args.reps)
                row = dict(records=records, rows=rows, implementation=implementation, us_min=min(us),
                           us_median=statistics.median(us), us_max=max(us))
                row["us_per_row_median"] = row["us_median"] / rows
                results.append(row)
                print(f"| {records} | {rows} | {implementation} | {row['us_min']:.1f} | {row['us_median']:.1f} | "
                      f"{row['us_max']:.1f} | {row['us_per_row_median']:.2f} |", flush=True)
            if len(selected) == 2 and not np.array_equal(selected["reference"], selected["ffi"]):
                raise SystemExit(f"R={records} rows={rows}: the implementations selected different ids")
    with open(args.out, "w") as f:
        json.dump(dict(jax=jax.__version__, device=device.device_kind, backend=jax.default_backend(),
                       top_k=TOP_K, calls=args.calls, reps=args.reps, results=results), f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

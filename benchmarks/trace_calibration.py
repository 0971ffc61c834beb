"""Locality of the calibrated selection trace: step overlap and miss rates under four eviction policies.

Reproduces the generator figures of docs/synthetic.md. For each named calibration and context n it
generates the ids one selecting layer of one stream picks at each step (hisparse_jax.selection.synthetic, top-k
of the trace scores among n sealed records) and replays them through a cache of B records with
the simulator of hisparse_jax.selection.policies (docs/policies.md has each rule):

- "lru": RESOLVE's own order (docs/contract.md, rule 4): untouched records, then the records just
  fetched (miss order), then the hits (old order); victims from the least recently used end;
- "fifo": victims in order of insertion;
- "random": victims drawn uniformly (seeded);
- "optimal": Belady's rule ("belady" in cache_policies), the record whose next use is farthest
  (never used again first).

Every step's k ids must be resident after it (B >= k): victims are never ids of the current step.
Misses count from step `warm` on. A second table gives the overlap of two adjacent selecting
layers at the same step (innovations chained with rho_layer). CPU is enough (about 80 s for the
defaults on two CPU cores):

  python benchmarks/trace_calibration.py                      # both calibrations, n = 32K, 64K, 128K
  python benchmarks/trace_calibration.py --contexts 65536 --seeds 0 1 2 3
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from hisparse_jax.selection import policies, synthetic

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import one_line_errors  # noqa: E402

POLICIES = ("lru", "fifo", "random", "optimal")
LIBRARY_NAMES = {"optimal": "belady"}  # this script's table says "optimal"
# A trace of n records holds a few float32 arrays of n (the trace state, a step's scores and top-k:
# 1.2 GiB peak for the process at 2^24 on CPU, 10 steps in 46 s) and each step costs time in n;
# the ids are int32, so n stays far below 2^31 either way. The replays hold every selected id, steps x k of
# them in a few int32 and int64 copies (2^26 ids: 256 MiB a copy; the layer table holds two
# layers' ids for --warm + 20 steps), and each step is a jitted call and a Python step of each
# replay, so the steps are bounded too.
MAX_CONTEXT = 1 << 24
MAX_STEPS = 1 << 16
MAX_IDS = 1 << 26
# JAX without x64 keeps a seed's low 32 bits (2^32 would replay seed 0).
SEEDS = 1 << 32


def check(parser: argparse.ArgumentParser, args) -> None:
    """Refuses (parser.error: one line, exit status 2) a value the trace or the replay cannot take,
    naming the argument and its range."""
    for n in args.contexts:
        if not 1 <= n <= MAX_CONTEXT:
            parser.error(f"argument --contexts: expected sealed records n in [1, {MAX_CONTEXT}] (2^24: the trace "
                         f"holds float32 arrays of n, about 1 GiB at the bound), got {n}")
    if not 1 <= args.k <= min(args.contexts):
        parser.error(f"argument --k: expected records selected per step in [1, {min(args.contexts)}] (at most the "
                     f"smallest --contexts: top-k of n records), got {args.k}")
    most = min(MAX_STEPS, MAX_IDS // args.k)
    if not 1 <= args.steps <= most:
        parser.error(f"argument --steps: expected steps in [1, {most}] (at most 2^16, and 2^26 selected ids at --k "
                     f"{args.k}: the replays hold them all), got {args.steps}")
    if not 0 <= args.warm < args.steps:
        parser.error(f"argument --warm: expected warm-up steps in [0, {args.steps - 1}] (below --steps {args.steps}: "
                     f"misses count from step --warm on), got {args.warm}")
    for seed in args.seeds:
        if not 0 <= seed < SEEDS:
            parser.error(f"argument --seeds: expected seeds in [0, 2^32) (JAX keeps a seed's low 32 bits: a larger "
                         f"one would repeat a smaller one's trace), got {seed}")
    repeatable = (("--calibrations", args.calibrations), ("--contexts", args.contexts), ("--seeds", args.seeds))
    for flag, values in repeatable:
        if len(set(values)) != len(values):
            parser.error(f"argument {flag}: {', '.join(sorted({str(v) for v in values if values.count(v) > 1}))} "
                         "given twice; give each once")


def trace_ids(config: synthetic.TraceConfig, n: int, k: int, steps: int, seed: int,
              layers: int = 1) -> list[np.ndarray]:
    """The ids the trace selects at each step: `steps` arrays [layers, k] of distinct int32 ids in
    [0, n) (layers = 1: arrays [k])."""
    state = synthetic.init_trace(config, layers, (1,), n, seed=seed)
    sealed = np.full((1,), n, np.int32)

    @jax.jit
    def step(state):
        state = synthetic.advance(state)
        top = [jax.lax.top_k(synthetic.scores(state, l, sealed)[0], k)[1] for l in range(layers)]
        return state, top[0] if layers == 1 else jnp.stack(top)

    out = []
    for _ in range(steps):
        state, ids = step(state)
        out.append(np.asarray(ids))
    return out


def miss_rate(selections: list[np.ndarray], capacity: int, warm: int, policy: str, seed: int = 0) -> float:
    """Records fetched per record selected, from step `warm` on, for a cache of `capacity` records."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    ids = np.stack(selections)[:, None, :]  # [steps, one stream, k]
    misses = policies.simulate(ids, capacity, LIBRARY_NAMES.get(policy, policy), seed=seed)
    return misses[warm:].sum() / np.count_nonzero(ids[warm:] >= 0)


def main(argv=None) -> int:
    p = one_line_errors(argparse.ArgumentParser(prog="trace_calibration.py", description=__doc__.split("\n\n")[0]))
    p.add_argument("--calibrations", nargs="+", default=list(synthetic.CALIBRATIONS), choices=list(synthetic.CALIBRATIONS),
                   help="the synthetic calibrations replayed (default: all)")
    p.add_argument("--contexts", type=int, nargs="+", default=[32768, 65536, 131072],
                   help="sealed records n, each in [1, 2^24]")
    p.add_argument("--k", type=int, default=2048, help="records selected per step (top-k), in [1, the smallest n]")
    p.add_argument("--steps", type=int, default=140,
                   help="steps generated, warm-up included: at least 1, at most 2^16 and 2^26 / k")
    p.add_argument("--warm", type=int, default=40, help="steps before misses count, in [0, --steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3],
                   help="one generated trace per seed, each in [0, 2^32)")
    args = p.parse_args(argv)
    check(p, args)
    k = args.k
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; k = {k}; one stream, one selecting layer; "
          f"{args.steps - args.warm} steps counted after {args.warm} of warm-up")
    print("| calibration | n | n/k | seed | step overlap | LRU B=k | LRU B=2k | LRU B=4k | FIFO B=2k | "
          "random B=2k | optimal B=2k |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.calibrations:
        config = synthetic.TraceConfig.calibration(name)
        for n in args.contexts:
            for seed in args.seeds:
                sel = trace_ids(config, n, k, args.steps, seed)
                overlap = policies.step_overlap(np.stack(sel[args.warm:])[:, None, None, :])[0]
                rates = [miss_rate(sel, c * k, args.warm, "lru") for c in (1, 2, 4)]
                rates += [miss_rate(sel, 2 * k, args.warm, policy) for policy in ("fifo", "random", "optimal")]
                print(f"| {name} | {n} | {n / k:g} | {seed} | {overlap:.3f} | "
                      + " | ".join(f"{r:.1%}" for r in rates) + " |", flush=True)
    print()
    print("| calibration | n | seed | adjacent-layer overlap (same step) |")
    print("|---|---|---|---|")
    for name in args.calibrations:
        config = synthetic.TraceConfig.calibration(name)
        for n in args.contexts:
            for seed in args.seeds:
                sel = trace_ids(config, n, k, args.warm + 20, seed, layers=2)[args.warm:]
                overlap = policies.layer_overlap(np.stack(sel)[:, :, None, :])[0]
                print(f"| {name} | {n} | {seed} | {overlap:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The lightning indexer under jit on the GPU: the fused CUDA custom call against XLA.

Three programs per shape (H = 64, d = 128, q bfloat16, lengths = T), bf16 and fp8 keys:
  ffi        hisparse_jax.index_scores(implementation="ffi"): one kernel, keys read once.
  reference  implementation="reference": the contract in float32 at HIGHEST precision.
  einsum     what the DSA model did before the op: einsum of bf16 q and keys (fp8 keys widened
             to bf16, scale applied to the dots) with float32 accumulation, relu, einsum with w;
             the [b, H, T] float32 intermediate goes through HBM.
Each program is jitted and called --iters times back to back (asynchronous dispatch keeps the
GPU busy for all but the smallest shapes; dispatch is then part of the time, as in a real jitted
step), ending with block_until_ready; the per-call time is the median over --reps such runs.
Successive calls read different copies of the keys (at least 256 MiB of them, as memory allows)
so small shapes are not served from L2. GB/s = key bytes (fp8: 132 B per token) / time.
Before timing, the ffi result is checked against the reference within the contract's bound
(ffi/indexer.h); a failing shape is reported and makes the script exit 1.

  PYTHONPATH=SITE python benchmarks/indexer_xla_bench.py --out results/indexer_xla.json
  PYTHONPATH=SITE python benchmarks/indexer_xla_bench.py --rows 8 --tokens 32768 --iters 20   # quick
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import hisparse_jax as hs
from hisparse_jax.bench import outputs
from hisparse_jax.bench.errors import BenchError

H, D = 64, 128
ROTATE_BYTES = 256 << 20


def make_keys(key, b, T, fp8):
    keys = jax.random.normal(key, (b, T, D), jnp.bfloat16)
    if not fp8:
        return keys, None
    return hs.quantize_keys_fp8(keys)


def einsum_model(q, w, keys, lengths, scale):
    """The model's previous formulation (bf16 operands, float32 accumulation)."""
    dots = jnp.einsum("bhd,btd->bht", q, keys.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    if scale is not None:
        dots = dots * scale[:, None, :]
    scores = jnp.einsum("bht,bh->bt", jax.nn.relu(dots), w)
    t = jnp.arange(keys.shape[1])
    return jnp.where(t[None, :] < lengths[:, None], scores, -jnp.inf)


PROGRAMS = {
    "ffi": jax.jit(lambda q, w, k, n, s: hs.index_scores(q, w, k, n, key_scale=s, implementation="ffi")),
    "reference": jax.jit(lambda q, w, k, n, s: hs.index_scores(q, w, k, n, key_scale=s, implementation="reference")),
    "einsum": jax.jit(einsum_model),
}


def bound(q, w, keys, scale):
    """The contract's rounding bound (d + H + 4) 2^-23 sum_h |w_h| sum_i |q_hi| |k_i| |s|."""
    hi = jax.lax.Precision.HIGHEST
    mag = jnp.einsum("bhd,btd->bht", jnp.abs(q.astype(jnp.float32)), jnp.abs(keys.astype(jnp.float32)), precision=hi)
    if scale is not None:
        mag = mag * jnp.abs(scale)[:, None, :]
    return (D + H + 4) * 2.0**-23 * jnp.einsum("bht,bh->bt", mag, jnp.abs(w), precision=hi)


def check(q, w, keys, lengths, scale) -> float:
    """max |ffi - reference| / (2 x bound) over the scored tokens (<= 1: within the contract)."""
    got = PROGRAMS["ffi"](q, w, keys, lengths, scale)
    want = PROGRAMS["reference"](q, w, keys, lengths, scale)
    if not bool(jnp.all(jnp.isneginf(got) == jnp.isneginf(want))):
        return math.inf
    err = jnp.where(jnp.isneginf(want), 0.0, jnp.abs(got - want))
    # Both are within the bound of the exact value, so within twice the bound of each other.
    return float(jnp.max(err / jnp.maximum(2 * bound(q, w, keys, scale), 1e-30)))


def time_program(fn, args_of, iters, reps) -> float:
    jax.block_until_ready(fn(*args_of(0)))  # compile and warm up
    per_call = []
    for _ in range(reps):
        start = time.perf_counter()
        out = None
        for i in range(iters):
            out = fn(*args_of(i))
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - start) / iters)
    return statistics.median(per_call)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON path")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 10, 16, 80],
                        help="rows b per shape (each row scores its own T keys)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072],
                        help="key tokens T per row")
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS),
                        help="the programs timed (default: all)")
    parser.add_argument("--iters", type=int, default=30, help="back-to-back calls per timing")
    parser.add_argument("--reps", type=int, default=5, help="timings per shape and program (the median is reported)")
    args = parser.parse_args()
    if args.out is not None:  # checked before anything is timed: a run must not end unwritable
        try:
            outputs.check_file("--out", args.out)
        except BenchError as err:
            parser.error(str(err))
    if jax.default_backend() != "gpu":
        print("indexer_xla_bench: needs a GPU backend (the ffi program is a CUDA kernel)", file=sys.stderr)
        return 2
    device = jax.devices()[0]
    print(f"# Lightning indexer under jit\n\n{device.device_kind}, jax {jax.__version__}; H = {H}, d = {D}, "
          f"q bf16, lengths = T; {args.iters} calls x {args.reps} reps (median)\n")
    print("| keys | b | T | program | ms | GB/s | vs reference | check |\n|---|---|---|---|---|---|---|---|")
    rows_out, failed = [], False
    root = jax.random.key(0)
    for fp8 in (False, True):
        for T in args.tokens:
            for b in args.rows:
                token_bytes = D + 4 if fp8 else 2 * D
                key_bytes = b * T * token_bytes
                copies = max(1, min(8, math.ceil(ROTATE_BYTES / key_bytes)))
                kq, kw, kk = jax.random.split(jax.random.fold_in(root, b * 1000003 + T + fp8), 3)
                q = jax.random.normal(kq, (b, H, D), jnp.bfloat16)
                w = jax.random.normal(kw, (b, H), jnp.float32) / math.sqrt(H * D)
                lengths = jnp.full((b,), T, jnp.int32)
                keys = [make_keys(jax.random.fold_in(kk, c), b, T, fp8) for c in range(copies)]
                ratio = check(q, w, keys[0][0], lengths, keys[0][1])
                ok = ratio <= 1.0
                failed |= not ok
                times = {}
                for name in args.programs:
                    fn = PROGRAMS[name]
                    times[name] = time_program(
                        fn, lambda i: (q, w, keys[i % copies][0], lengths, keys[i % copies][1]), args.iters, args.reps
                    )
                for name, seconds in times.items():
                    gbs = key_bytes / seconds / 1e9
                    vs = times.get("reference", math.nan) / seconds
                    print(f"| {'fp8' if fp8 else 'bf16'} | {b} | {T} | {name} | {seconds * 1e3:.3f} | {gbs:.0f} | "
                          f"{vs:.2f}x | {'ok' if ok else 'FAIL'} ({ratio:.2f}) |", flush=True)
                    rows_out.append(dict(keys="fp8" if fp8 else "bf16", b=b, T=T, program=name, seconds=seconds,
                                         key_bytes=key_bytes, gbs=gbs, check_ratio=ratio, check_ok=ok))
                del keys
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=device.device_kind, jax=jax.__version__, heads=H, dim=D, iters=args.iters,
                           reps=args.reps, results=rows_out, all_checks_passed=not failed), f, indent=1)
        print(f"\nJSON: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

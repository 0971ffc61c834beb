"""One MoE layer of a deployment slice (glm5-h200 by default) inside a jitted loop: its shared
expert beside the routed experts (grouped_matmul_pair, what hisparse_jax.models.moe runs) against
one after the other (two grouped_matmul calls per projection, the layout before the pair). Same
bits asserted first.

    python3 benchmarks/moe_layer_bench.py OUT.json [--deployment glm5-h200] [--batches 1,2,10,17,41]

Each variant runs `--iters` layers in a lax.fori_loop (each iteration's input depends on the
last output, so nothing is hoisted), the loop timed on the wall clock `--reps` times after a
warm-up; microseconds per layer, min / median / max over the reps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hisparse_jax.bench.deployments import get_deployment
from hisparse_jax.models import dsa, layers, moe


def one_after_the_other(config, w: moe.MoEWeights, x: jax.Array) -> jax.Array:
    """moe.moe with the shared expert's two grouped matmuls after the routed ones' (the layout
    before grouped_matmul_pair): the same arithmetic, one launch at a time."""
    c = config
    T, k, E = x.size // x.shape[-1], c.experts_per_token, c.experts
    h = layers.rms_norm(x.reshape(T, x.shape[-1]), w.norm, c.norm_eps)
    chosen, weights = moe.route(c, w.router, h)
    local = (chosen % E).reshape(T * k)
    order = jnp.argsort(local, stable=True)
    group_sizes = jnp.bincount(local, length=E).astype(jnp.int32)
    sorted_out = moe.swiglu_experts(c, w.routed, jnp.take(h, order // k, axis=0), group_sizes)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(T * k, dtype=order.dtype), unique_indices=True)
    per_choice = jnp.take(sorted_out, inverse, axis=0).reshape(T, k, -1)
    y = weights[:, 0, None] * per_choice[:, 0]
    for j in range(1, k):
        y = y + weights[:, j, None] * per_choice[:, j]
    y = y + moe.swiglu_experts(c, w.shared, h, jnp.full((1,), T, jnp.int32))
    return y.astype(x.dtype).reshape(x.shape)


def beside(config, w, x):
    return moe.moe(config, w, x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--deployment", default="glm5-h200")
    p.add_argument("--batches", default="1,2,10,17,41")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args(argv)
    config = dsa.Config.realistic(**get_deployment(a.deployment).derive().overrides)
    w = moe.init_layer(config, 0, 0)
    rows = []
    for b in [int(v) for v in a.batches.split(",")]:
        x = jax.random.normal(jax.random.PRNGKey(b), (b, config.d_model), jnp.float32).astype(config.dtype)
        once = {n: jax.jit(lambda w, x, f=f: f(config, w, x)) for n, f in
                (("one after the other", one_after_the_other), ("beside", beside))}
        bits = {n: np.asarray(f(w, x)).view(np.uint16) for n, f in once.items()}
        same = bool(np.array_equal(bits["beside"], bits["one after the other"]))
        for name, f in (("one after the other", one_after_the_other), ("beside", beside)):
            def loop(w, x, f=f):
                def body(_, carry):  # the next input depends on this output: nothing is hoisted
                    return carry + f(config, w, carry) * jnp.asarray(1e-3, carry.dtype)
                return jax.lax.fori_loop(0, a.iters, body, x)
            run = jax.jit(loop)
            jax.block_until_ready(run(w, x))
            times = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                jax.block_until_ready(run(w, x))
                times.append((time.perf_counter() - t0) / a.iters * 1e6)
            row = dict(batch=b, variant=name, us_min=min(times), us_median=statistics.median(times),
                       us_max=max(times), same_bits=same)
            rows.append(row)
            print(f"| {b} | {name} | {min(times):.1f} / {statistics.median(times):.1f} / {max(times):.1f} | "
                  f"{'yes' if same else 'NO'} |", flush=True)
    with open(a.out, "w") as f:
        json.dump(dict(device=jax.devices()[0].device_kind, deployment=a.deployment, iters=a.iters, rows=rows), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

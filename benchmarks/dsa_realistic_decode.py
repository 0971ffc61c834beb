"""End-to-end decode of the realistic DSA preset at long context, HiSparse vs full-KV.

Prefills a batch of ragged random prompts, decodes `--steps` greedy tokens in
each mode with the same weights, checks that tokens and logits of "hisparse"
and "device" are bitwise equal, and prints the median step time of each mode
and the HiSparse miss rate.

  python benchmarks/dsa_realistic_decode.py --context 32768 --batch 4 --steps 32
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from hisparse_jax import decode
from hisparse_jax.models import dsa


def run_mode(config, weights, prompts, lengths, mode, steps, reps):
    batch = prompts.shape[0]
    state = dsa.init_state(config, batch, mode)
    state, logits = decode.prefill(dsa, config, weights, state, prompts, lengths)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out = decode.generate(dsa, config, weights, state, first, steps, return_logits=True)
    tokens, step_logits, misses, state = out.tokens, out.logits, out.misses, out.state
    jax.block_until_ready(tokens)
    out = dict(tokens=np.asarray(tokens), logits=np.asarray(step_logits), misses=np.asarray(misses))
    times = []
    nxt = tokens[-1]
    for _ in range(reps):  # same compiled program: continue decoding from where it stopped
        t0 = time.perf_counter()
        out = decode.generate(dsa, config, weights, state, nxt, steps, return_logits=True)
        more, state = out.tokens, out.state
        jax.block_until_ready(more)
        times.append((time.perf_counter() - t0) / steps)
        nxt = more[-1]
    out["step_s"] = float(np.median(times))
    if mode == "hisparse":
        out["pool_memory_kind"] = state.store.host_pool.sharding.memory_kind
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    margin = args.steps * (args.reps + 1)
    config = dsa.Config.realistic(max_context=args.context + margin, num_layers=args.num_layers)
    weights = dsa.init_weights(config, seed=0)
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, config.vocab, (args.batch, args.context)), jnp.int32)
    lengths = jnp.asarray(
        [args.context - 97 * i for i in range(args.batch)], jnp.int32
    )  # ragged prompts
    results = {m: run_mode(config, weights, prompts, lengths, m, args.steps, args.reps) for m in ("hisparse", "device")}
    h, d = results["hisparse"], results["device"]
    equal_tokens = bool(np.array_equal(h["tokens"], d["tokens"]))
    equal_logits = bool(np.array_equal(h["logits"], d["logits"]))
    k, L = config.top_k, config.num_layers
    miss_rate = float(h["misses"][1:].sum() / (k * L * args.batch * (args.steps - 1)))
    summary = dict(
        device=str(jax.devices()[0].device_kind), jax=jax.__version__, context=args.context,
        batch=args.batch, steps=args.steps, layers=L, top_k=k, hot_slots=config.hot_slots,
        tokens_equal=equal_tokens, logits_equal=equal_logits,
        hisparse_step_ms=h["step_s"] * 1e3, device_step_ms=d["step_s"] * 1e3,
        hisparse_miss_rate_after_first_step=miss_rate, pool_memory_kind=h["pool_memory_kind"],
    )
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if not (equal_tokens and equal_logits):
        raise SystemExit("hisparse and device decodes differ")


if __name__ == "__main__":
    main()

"""`hisparse-bench bitwise`: HiSparse vs full-KV decode at a realistic shape, bit for bit.

Prefills a batch of ragged random prompts (request i holds context - 97 i tokens) in each mode
with the same seeded weights, decodes --steps greedy tokens, and checks that the tokens and
logits of "hisparse" (the pool in pinned host memory, RESOLVE fetching misses) and "device" (all
KV in HBM) are bitwise equal; then times --reps more calls of each mode with the decode runner
(hisparse_jax.bench.decode.runner) and prints the median step of each, the HiSparse miss rate
and where its pool lives. Exit status 1 when the modes differ.

  hisparse-bench bitwise --context 32768 --batch 4 --steps 16 --reps 2
"""

from __future__ import annotations

import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ... import decode
from ...models import get_family
from ...models.family import decode_weights
from .. import outputs
from ..errors import BenchError
from .capacity import account
from .plan import device_memory_limit, host_memory_limit
from .report import MODE_NAMES, fmt_bytes
from .runner import DecodeRun, time_in_turns, tokens_needed, warm_up

MODES = ("hisparse", "device")
RAGGED = 97  # request i's prompt is this many tokens shorter than request i - 1's


def bitwise_config(family, preset: str, context: int, steps: int, reps: int, num_layers: int):
    """The preset at `num_layers`, with room for the prompt and every call: the compared one, the
    runner's untimed one and `reps` timed ones."""
    needed = tokens_needed(context, steps, reps + 1) + 1
    try:
        page = family.Config.preset(preset, num_layers=num_layers).page_size
    except ValueError as err:
        raise BenchError(f"--preset {preset} --num-layers {num_layers}: {err}") from None
    max_context = -(-needed // page) * page
    try:
        return family.Config.preset(preset, num_layers=num_layers, max_context=max_context)
    except ValueError as err:
        # max_context follows from --context, --steps and --reps: name them, not only the field.
        raise BenchError(f"--preset {preset} --context {context} --steps {steps} --reps {reps} "
                         f"(max_context {max_context}): {err}") from None


def check_runs_here(args, config) -> None:
    """A bfloat16 config is refused on XLA:CPU, which cannot run its dots (hisparse-bench decode
    refuses it the same way); the bitwise preset `realistic` is one."""
    if jax.default_backend() == "cpu" and jnp.dtype(config.dtype) == jnp.bfloat16:
        raise BenchError(f"the {args.family} {args.preset} config computes in bfloat16, which XLA:CPU cannot run "
                         "(it has no bf16 x bf16 -> f32 dot); pass --preset tiny, or run on a GPU")


def memory_needed(family, config, batch: int, context: int, steps: int) -> dict[str, dict[str, dict[str, int]]]:
    """Bytes of the arrays a comparison allocates, from shapes alone (nothing is allocated):
    mode -> memory ("device" / "host") -> part -> bytes. One mode's state lives at a time (a
    mode's is freed before the next is made); the weights in both layouts, the prompts as drawn
    (int64) and as fed (int32) and both modes' logits live throughout."""
    weights = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                  for x in jax.tree.leaves(jax.eval_shape(lambda: family.init_weights(config, 0))))
    logits = len(MODES) * steps * batch * config.vocab * 4
    prompts = batch * context * (8 + 4)
    out = {}
    for mode in MODES:
        state = account(family, config, batch, mode)
        out[mode] = dict(device={"the weights (both layouts)": 2 * weights,
                                 f"the {MODE_NAMES[mode]} state on the device": state.total("device"),
                                 "the logits of both modes": logits},
                         host={f"the {MODE_NAMES[mode]} host pool": state.total("host"), "the prompts": prompts})
    return out


def check_memory(args, family, config) -> None:
    """The comparison's arrays (memory_needed) must fit, mode by mode: on a CPU together in half
    the RAM, on a GPU the device's in its memory and the host's in half the RAM. Refused in one
    line before anything is allocated (--batch 1000 --context 100000 was a NumPy MemoryError
    traceback)."""
    host_limit, host_source = host_memory_limit()
    device_limit, device_source = device_memory_limit()
    on_cpu = jax.default_backend() == "cpu"
    for need in memory_needed(family, config, args.batch, args.context, args.steps).values():
        if on_cpu:  # device arrays and host pools share the RAM
            checks = [({**need["device"], **need["host"]}, host_limit, host_source)]
        else:
            checks = [(need["device"], device_limit, device_source), (need["host"], host_limit, host_source)]
        for parts, limit, source in checks:
            total = sum(parts.values())
            if limit is not None and total > limit:
                largest = max(parts, key=parts.get)
                raise BenchError(f"--context {args.context} --batch {args.batch} --num-layers {args.num_layers}: the "
                                 f"comparison needs at least {fmt_bytes(total)} ({largest}: "
                                 f"{fmt_bytes(parts[largest])}), beyond {source} ({fmt_bytes(limit)}); lower "
                                 "--context, --batch or --num-layers")


def ragged_prompts(config, batch: int, context: int, seed: int = 0):
    """(prompts [batch, context] int32, lengths [batch]: context - 97 i) of seeded random tokens."""
    if context - RAGGED * (batch - 1) < 1:
        raise BenchError(f"--context {context}: request {batch - 1} of --batch {batch} would hold "
                         f"{context - RAGGED * (batch - 1)} tokens (each request {RAGGED} fewer than the last)")
    rng = np.random.default_rng(seed)
    prompts = jnp.asarray(rng.integers(0, config.vocab, (batch, context)), jnp.int32)
    return prompts, jnp.asarray([context - RAGGED * i for i in range(batch)], jnp.int32)


def decode_mode(family, config, weights, prompts, lengths, mode: str, steps: int, reps: int) -> dict:
    """One mode: the compared call's tokens, logits and misses (numpy), then the runner's timing of
    `reps` more calls from where it stopped (median seconds per step) and the pool's memory kind."""
    state = family.init_state(config, prompts.shape[0], mode)
    state, logits = decode.prefill(family, config, weights, state, prompts, lengths)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    generated = decode.generate(family, config, weights, state, first, steps, return_logits=True)
    tokens = jax.block_until_ready(generated.tokens)
    out = dict(tokens=np.asarray(tokens), logits=np.asarray(generated.logits), misses=np.asarray(generated.misses))
    run = warm_up(DecodeRun(family, config, weights, int(prompts.shape[1]), steps, generated.state, tokens),
                  tokens[-1])
    (timing,) = time_in_turns([run], reps)
    out["step_s"] = timing.step_seconds
    out["pool_memory_kind"] = run.state.store.host_pool.sharding.memory_kind if mode == "hisparse" else None
    return out


def compare(args) -> dict:
    """The summary of both modes at the command line's shape."""
    family = get_family(args.family)
    config = bitwise_config(family, args.preset, args.context, args.steps, args.reps, args.num_layers)
    check_runs_here(args, config)
    if args.context - RAGGED * (args.batch - 1) >= 1:  # else ragged_prompts names --context and --batch
        check_memory(args, family, config)
    weights = decode_weights(family, config, family.init_weights(config, 0))  # the layout decode timings read
    prompts, lengths = ragged_prompts(config, args.batch, args.context)
    results = {m: decode_mode(family, config, weights, prompts, lengths, m, args.steps, args.reps) for m in MODES}
    h, d = results["hisparse"], results["device"]
    selected = h["misses"][1:].size * config.top_k  # misses: [steps, layers, *streams]
    return dict(
        device=str(jax.devices()[0].device_kind), jax=jax.__version__, family=args.family, preset=args.preset,
        context=args.context, batch=args.batch, steps=args.steps, layers=config.num_layers, top_k=config.top_k,
        hot_slots=config.hot_slots,
        tokens_equal=bool(np.array_equal(h["tokens"], d["tokens"])),
        logits_equal=bool(np.array_equal(h["logits"], d["logits"])),
        hisparse_step_ms=h["step_s"] * 1e3, device_step_ms=d["step_s"] * 1e3,
        hisparse_miss_rate_after_first_step=float(h["misses"][1:].sum() / selected) if selected else 0.0,
        pool_memory_kind=h["pool_memory_kind"],
    )


def run(args) -> int:
    """hisparse-bench bitwise: prints the summary (JSON), writes it to --json; 1 if the modes differ."""
    if args.json is not None:  # "" too: check_file refuses an empty path
        outputs.check_file("--json", args.json)
    summary = compare(args)
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        try:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
        except OSError as err:
            raise BenchError(f"--json {args.json!r}: the summary could not be written ({err}); it is printed "
                             "above", status=1) from None
    if not (summary["tokens_equal"] and summary["logits_equal"]):
        print("hisparse-bench: error: hisparse and full-KV decodes differ", file=sys.stderr)
        return 1
    return 0

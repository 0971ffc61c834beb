"""Multi-device checks of hisparse_jax.sharding, run in a fresh process with N CPU devices.

The CPU device count is fixed when JAX starts its backends, and the rest of the suite
runs with one device, so tests/test_sharding.py launches this script in a subprocess
(JAX_NUM_CPU_DEVICES=N) and asserts on the JSON it prints as its last line:
{"checks": {name: {"ok": bool, ...details}}, "info": {...}}.
Run it by hand: JAX_NUM_CPU_DEVICES=4 PYTHONPATH=/tmp/site_shard python tests/sharding_worker.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

DEVICES = int(os.environ.get("HISPARSE_SHARD_DEVICES", "4"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", DEVICES)
if os.environ.get("HISPARSE_TEST_FULL_OPT") != "1":  # as tests/models/conftest.py: compile time
    jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import hisparse_jax as hs  # noqa: E402
from hisparse_jax import decode  # noqa: E402
from hisparse_jax import sharding as hsh  # noqa: E402
from hisparse_jax.models import dsa  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_compiled_program import Hlo  # noqa: E402  (the HLO reader of the single-device tests)

AXIS = "data"
COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter",
               "collective-broadcast")
CHECKS: dict[str, dict] = {}
INFO: dict[str, object] = {}


def check(name: str):
    """Runs fn() -> (ok, details); an exception is a failed check with its traceback."""

    def wrap(fn):
        start = time.perf_counter()
        try:
            ok, details = fn()
        except Exception:  # noqa: BLE001 - reported to the parent test
            ok, details = False, {"error": traceback.format_exc()[-3000:]}
        CHECKS[name] = {"ok": bool(ok), "seconds": round(time.perf_counter() - start, 2), **details}
        return fn

    return wrap


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind == "f" else x


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def host_values(x) -> np.ndarray:
    return hsh.host_values(x)


def hlo_report(text: str, pool_shape: str) -> dict:
    """Collectives, ops whose result has the pool shard's shape, and the pool's memory space."""
    hlo = Hlo(text)
    params, result = hlo.entry_layout()
    return {
        "collectives": {c: len(re.findall(rf"\b{c}(?:-start)?\(", text)) for c in COLLECTIVES},
        "ops_producing_pool": sorted(hlo.ops_producing(pool_shape)),
        "pool_params_in_S5": [p for p in params if p.startswith(pool_shape + "{")],
        "resolve_executions": hlo.executions("hisparse_resolve"),
        "pool_write_executions": hlo.executions("hisparse_pool_write"),
        "num_partitions": int(re.search(r"num_partitions=(\d+)", hlo.header).group(1)),
    }


def hlo_clean(rep: dict, pool_shape: str, allowed_pool_ops=("custom-call", "parameter", "get-tuple-element",
                                                              "tuple", "while", "bitcast")) -> bool:
    return (
        not any(rep["collectives"].values())
        and set(rep["ops_producing_pool"]) <= set(allowed_pool_ops)
        and rep["pool_params_in_S5"]
        and all(p.endswith(":S(5)}") for p in rep["pool_params_in_S5"])
    )


# --------------------------------------------------------------------------- cache level

CFG = hs.CacheConfig(num_layers=2, stream_shape=(2 * DEVICES, 2), pool_records=24, hot_slots=6, top_k=4,
                     record_width=2)
STEPS = 5


def random_inputs(rng):
    S, k, R = CFG.stream_shape, CFG.top_k, CFG.pool_records
    pool = rng.standard_normal(CFG.pool_shape).astype(np.float32)
    sels = [rng.integers(-1, R + 3, (STEPS, CFG.num_layers, *S, k)).astype(np.int32)]
    sels[0][..., 1] = sels[0][..., 0]  # duplicates
    sealed = rng.integers(0, R + 1, (STEPS, *S)).astype(np.int32)
    return pool, sels[0], sealed


def scan_program(resolve_fn):
    """STEPS x L resolves in nested lax.scans, the cache donated: the shape of a decode loop."""

    def program(cache, pool, sels, sealed):
        def step(cache, xs):
            sel_t, sealed_t = xs

            def layer(cache, ys):
                l, sel = ys
                result, cache = resolve_fn(cache, pool, sel, sealed_t, l)
                return cache, result

            return jax.lax.scan(layer, cache, (jnp.arange(CFG.num_layers, dtype=jnp.int32), sel_t))

        return jax.lax.scan(step, cache, (sels, sealed))

    return jax.jit(program, donate_argnums=0)


@check("sharded_resolve_bitwise")
def _():
    mesh = hsh.stream_mesh()
    pool_np, sels, sealed = random_inputs(np.random.default_rng(0))
    out = {}
    for impl in ("ffi", "reference"):
        # single device
        cache1 = hs.init_hot_cache(CFG)
        pool1 = jax.device_put(pool_np, hs.pinned_host_sharding())
        single = jax.jit(lambda c, p, s, n, l: hs.resolve(c, p, s, n, l, implementation=impl), donate_argnums=0)
        # sharded: eager-style step calls of the jitted shard_map, cache donated
        cache2, pool2 = hsh.shard_cache(CFG, mesh)
        pool2 = jax.device_put(pool_np, pool2.sharding)
        sharded = jax.jit(hsh.sharded_resolve(mesh, implementation=impl), donate_argnums=0)
        stream = NamedSharding(mesh, P(AXIS))
        equal = True
        for t in range(STEPS):
            for l in range(CFG.num_layers):
                r1, cache1 = single(cache1, pool1, sels[t, l], sealed[t], np.int32(l))
                r2, cache2 = sharded(cache2, pool2, jax.device_put(sels[t, l], stream),
                                     jax.device_put(sealed[t], stream), np.int32(l))
                for a, b in zip(jax.tree.leaves((r1, cache1)), jax.tree.leaves((r2, cache2))):
                    equal &= same_bits(host_values(a), host_values(b))
        out[impl] = {"equal": bool(equal), "misses": int(np.asarray(r1.misses).sum()),
                     "result_sharding": str(r2.slots.sharding.spec)}
    # the same sequence as one scanned program (the ffi path)
    cache1 = hs.init_hot_cache(CFG)
    pool1 = jax.device_put(pool_np, hs.pinned_host_sharding())
    scan1 = scan_program(lambda *a: hs.resolve(*a, implementation="ffi"))
    c1, r1 = scan1(cache1, pool1, sels, sealed)
    cache2, pool2 = hsh.shard_cache(CFG, mesh)
    pool2 = jax.device_put(pool_np, pool2.sharding)
    scan2 = scan_program(hsh.sharded_resolve(mesh, implementation="ffi"))
    sel_sh = NamedSharding(mesh, P(None, None, AXIS))
    args = (cache2, pool2, jax.device_put(sels, sel_sh), jax.device_put(sealed, NamedSharding(mesh, P(None, AXIS))))
    text = scan2.lower(*args).compile().as_text()
    c2, r2 = scan2(*args)
    scan_equal = all(same_bits(host_values(a), host_values(b))
                     for a, b in zip(jax.tree.leaves((c1, r1)), jax.tree.leaves((c2, r2))))
    local = (CFG.num_layers, CFG.stream_shape[0] // DEVICES, *CFG.stream_shape[1:], CFG.pool_records,
             *CFG.record_shape)
    pool_shape = "f32[" + ",".join(map(str, local)) + "]"
    rep = hlo_report(text, pool_shape)
    ok = (
        all(v["equal"] for v in out.values())
        and scan_equal
        and hlo_clean(rep, pool_shape)
        and rep["resolve_executions"] == STEPS * CFG.num_layers
        and rep["num_partitions"] == DEVICES
    )
    return ok, {"steps": out, "scan_equal": scan_equal, "hlo": rep, "pool_shard_shape": pool_shape}


@check("pool_shards_pinned_per_device")
def _():
    mesh = hsh.stream_mesh()
    cache, pool = hsh.shard_cache(CFG, mesh)
    shards = pool.addressable_shards
    devices = [s.device.id for s in shards]
    kinds = [s.data.sharding.memory_kind for s in shards]
    shapes = [tuple(s.data.shape) for s in shards]
    cache_kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(cache)}
    want = (CFG.num_layers, CFG.stream_shape[0] // DEVICES, *CFG.pool_shape[2:])
    ok = (
        pool.sharding.memory_kind == "pinned_host"
        and len(shards) == DEVICES
        and sorted(devices) == sorted({d.id for d in jax.devices()})
        and set(kinds) == {"pinned_host"}
        and set(shapes) == {want}
        and cache_kinds == {"device"}
    )
    return ok, {"devices": devices, "kinds": kinds, "shapes": [list(s) for s in shapes],
                "cache_kinds": sorted(cache_kinds)}


# --------------------------------------------------------------------------- DSA tiny decode

DSA = dsa.Config.tiny(num_layers=2, top_k=8, hot_slots=12)
LENGTHS = np.array([37, 20, 5, 40, 12, 1, 30, 25, 9, 33, 17, 2, 40, 28, 6, 21], np.int32)[: 2 * DEVICES]
T, DECODE_STEPS = 40, 12


def prompts():
    rng = np.random.default_rng(0)
    return rng.integers(0, DSA.vocab, (len(LENGTHS), T)).astype(np.int32), LENGTHS


def run(family, state, weights, p, lengths, sampling="greedy"):
    state, prefill_logits = decode.prefill(family, DSA, weights, state, jnp.asarray(p), jnp.asarray(lengths))
    first = jnp.argmax(prefill_logits, axis=-1).astype(jnp.int32)
    out = decode.generate(family, DSA, weights, state, first, DECODE_STEPS, sampling=sampling, return_logits=True)
    return {"prefill_logits": np.asarray(prefill_logits), "tokens": np.asarray(out.tokens),
            "logits": np.asarray(out.logits), "misses": np.asarray(out.misses)}, out.state


def state_arrays(state) -> list[np.ndarray]:
    return [host_values(x) for x in jax.tree.leaves(state)]


SHARDED = {}


@check("sharded_dsa_decode_bitwise")
def _():
    """Sharded decode of 2 streams per device == the single-device decode of those streams.

    XLA:CPU reductions are not batch-invariant (a row's sum depends on how many rows the
    op has), so a single-device decode of the whole batch differs in the last bits from a
    decode of part of it, sharded or not. The exact claim: every device computes what one
    device computes alone on its streams; the reference is the single-device decode run
    shard by shard, concatenated on the batch. (Measured on jax 0.10.2 CPU: the whole batch of
    8 decoded on one device differs from it by up to ~2e-6 in prefill logits and, after a
    greedy token flips, in tokens.)
    """
    mesh = hsh.stream_mesh()
    weights = dsa.init_weights(DSA, 0)
    p, lengths = prompts()
    per = len(lengths) // DEVICES
    parts = []
    for d in range(DEVICES):
        rows = slice(d * per, (d + 1) * per)
        out, state = run("dsa", dsa.init_state(DSA, per, "hisparse"), weights, p[rows], lengths[rows])
        parts.append((out, state_arrays(state)))
    batch_dims = jax.tree.leaves(hsh.state_batch_dims("dsa", DSA, "hisparse"))
    axes = {"prefill_logits": 0, "tokens": 1, "logits": 1, "misses": 2}
    want = {k: np.concatenate([o[k] for o, _ in parts], axis=a) for k, a in axes.items()}
    want_state = [np.concatenate([s[i] for _, s in parts], axis=d) for i, d in enumerate(batch_dims)]

    family = hsh.sharded_family("dsa", mesh)
    weights_r = hsh.replicate(weights, mesh)
    state0 = hsh.init_sharded_state("dsa", DSA, len(lengths), "hisparse", mesh)
    got, state = run(family, state0, weights_r, p, lengths)
    SHARDED.update(mesh=mesh, family=family, weights=weights_r, state=state, got=got)
    equal = {k: same_bits(got[k], want[k]) for k in want}
    state_equal = all(same_bits(a, b) for a, b in zip(state_arrays(state), want_state))
    pool = state.store.host_pool
    placement = {
        "pool_kind": pool.sharding.memory_kind,
        "pool_shard_kinds": sorted({s.data.sharding.memory_kind for s in pool.addressable_shards}),
        "pool_shard_devices": sorted(s.device.id for s in pool.addressable_shards),
    }
    ok = (
        all(equal.values()) and state_equal and placement["pool_kind"] == "pinned_host"
        and placement["pool_shard_kinds"] == ["pinned_host"]
        and placement["pool_shard_devices"] == sorted(d.id for d in jax.devices())
        and int(want["misses"].sum()) > 0
    )
    return ok, {"equal": equal, "state_equal": state_equal, "placement": placement,
                "misses": int(want["misses"].sum())}


@check("sharded_dsa_decode_hlo")
def _():
    """The sharded generate program: per-device shapes, one RESOLVE per layer per step,
    the pool shard an S(5) parameter aliased to its output, no collective, no pool copy."""
    s = SHARDED
    if not s:
        return False, {"error": "sharded_dsa_decode_bitwise did not run"}
    first = jnp.asarray(s["got"]["tokens"][-1])
    traced = decode.trace_generate(s["family"], DSA, s["weights"], s["state"], first, 3)
    text = traced.lower().compile().as_text()
    per = len(LENGTHS) // DEVICES
    pool_shape = f"f32[{DSA.num_layers},{per},{DSA.num_records},{DSA.page_size},{DSA.record_width}]"
    rep = hlo_report(text, pool_shape)
    hlo = Hlo(text)
    _, result = hlo.entry_layout()
    rep["pool_result_in_S5"] = f"{pool_shape}{{4,3,2,1,0:S(5)}}" in result
    ok = (
        hlo_clean(rep, pool_shape) and rep["pool_result_in_S5"]
        and rep["resolve_executions"] == 3 * DSA.num_layers
        and rep["pool_write_executions"] == 3
        and rep["num_partitions"] == DEVICES
    )
    return ok, {"hlo": rep}


@check("sharded_dsa_prefetch_bitwise")
def _():
    """Sharded decode with prefetch (Config.prefetch, a shared indexer) == the same sharded decode
    without: every device runs its own resolve_prefetch and join calls on its own streams."""
    mesh = hsh.stream_mesh()
    shared = dataclasses.replace(DSA, index_share=2)
    weights = hsh.replicate(dsa.init_weights(shared, 0), mesh)
    p, lengths = prompts()
    outs = {}
    for prefetch in (False, True):
        config = dataclasses.replace(shared, prefetch=prefetch)
        family = hsh.sharded_family("dsa", mesh)
        state0 = hsh.init_sharded_state("dsa", config, len(lengths), "hisparse", mesh)
        state, logits = decode.prefill(family, config, weights, state0, jnp.asarray(p), jnp.asarray(lengths))
        first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out = decode.generate(family, config, weights, state, first, DECODE_STEPS, return_logits=True)
        outs[prefetch] = ([np.asarray(out.tokens), np.asarray(out.logits), np.asarray(out.misses)],
                          state_arrays(out.state), out.state.store.prefetch)
    equal = [same_bits(a, b) for a, b in zip(outs[True][0], outs[False][0])]
    state_equal = all(same_bits(a, b) for a, b in zip(outs[True][1], outs[False][1]))
    ok = all(equal) and state_equal and outs[True][2] and int(outs[False][0][2].sum()) > 0
    return ok, {"equal": equal, "state_equal": state_equal, "prefetching_store": outs[True][2]}


@check("sharded_sampling_draws")
def _():
    """sampling="sample": sampling runs outside shard_map on the sharded logits, and threefry
    draws do not depend on the sharding, so each step's tokens are the single-device
    categorical draw from that step's logits (fold_in(key(seed), step))."""
    mesh = hsh.stream_mesh()
    family = hsh.sharded_family("dsa", mesh)
    weights = hsh.replicate(dsa.init_weights(DSA, 0), mesh)
    p, lengths = prompts()
    got, _ = run(family, hsh.init_sharded_state("dsa", DSA, len(lengths), "hisparse", mesh), weights, p,
                 lengths, sampling="sample")
    key = jax.random.key(0)
    draw = jax.jit(lambda i, logits: jax.random.categorical(jax.random.fold_in(key, i), logits, axis=-1))
    want = np.stack([np.asarray(draw(np.int32(i), jnp.asarray(got["logits"][i])))
                     for i in range(DECODE_STEPS)]).astype(np.int32)
    return bool(np.array_equal(want, got["tokens"])), {"steps": DECODE_STEPS}


@check("sharded_state_checks")
def _():
    """A batch that does not split over the mesh is a ValueError naming the fix."""
    mesh = hsh.stream_mesh()
    try:
        hsh.init_sharded_state("dsa", DSA, DEVICES + 1, "hisparse", mesh)
    except ValueError as err:
        return "multiple of" in str(err), {"message": str(err)}
    return False, {"message": "no error"}


@check("sharded_family_refuses_benchmark_only_state")
def _():
    """Traces and no-IO stores are single-device benchmark features: a named error, not a
    shard_map pytree mismatch."""
    mesh = hsh.stream_mesh()
    family = hsh.sharded_family("dsa", mesh)
    messages = []
    try:
        family.selecting_layout(DSA, DEVICES)
    except ValueError as err:
        messages.append(str(err))
    state = hsh.init_sharded_state("dsa", DSA, DEVICES, "hisparse", mesh)
    quiet = dataclasses.replace(state, store=dataclasses.replace(state.store, fetch=False))
    try:
        family.decode_step(DSA, hsh.replicate(dsa.init_weights(DSA, 0), mesh), quiet,
                           jnp.zeros((DEVICES,), jnp.int32))
    except ValueError as err:
        messages.append(str(err))
    ok = len(messages) == 2 and all("single-device benchmark features" in m for m in messages)
    return ok, {"messages": messages}


if __name__ == "__main__":
    INFO.update(jax=jax.__version__, devices=len(jax.devices()), backend=jax.default_backend(),
                hisparse_jax=str(Path(hs.__file__).parent))
    print(json.dumps({"checks": CHECKS, "info": INFO}))

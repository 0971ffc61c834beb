"""The decode step's weight matmuls that XLA compiles (MLA projections, the indexer's projections,
the router, the read-out), alone, at the glm5-h200 slice shapes, in the forms the model writes and
in candidate rewrites; device time per call from the profiler's kernel events.

    python3 benchmarks/projection_bench.py OUT.json [--batches 2,17] [--calls 30]

Each candidate is its own jitted program; all run `--calls` times inside one profiler trace after
a warm-up call; a call's time is the sum of its kernels' device durations (launch gaps excluded),
so a form XLA splits into a matmul and a reduce is charged both; between calls an uncounted
program rewrites `--flush-mb` MiB (default 256, past the H200's L2) so every call reads its weights
from HBM, as in a decode step (--flush-mb 0: the earlier L2-warm runs). Reported per candidate: the
kernels of one call, microseconds min / median / max over the calls, the weight bytes and the
share of `--hbm` they imply.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

D, H, R, DN, DR, DC, DV, HI, DI, V, ROUTED = 6144, 64, 2048, 192, 64, 512, 256, 32, 128, 15885, 256
BF16 = jnp.float32 if os.environ.get("PROJECTION_BENCH_F32") else jnp.bfloat16  # f32: a CPU smoke run


def _w(key, shape, dtype=BF16):
    return (jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32) / np.sqrt(shape[0])).astype(dtype)


def router_candidates(h, router, b):
    """The router as the model writes it (float32 at HIGHEST, [D, E]) and its alternatives. At
    float32 (float32 products of float32 operands; the order of the sum is the kernel's): the
    weight stored [E, D] (K contiguous, transposed once at load), and that layout as a multiply +
    row reduce (one XLA reduction fusion, no GEMM, no split-K; it reads the weight once per row
    of h, the rows after the first mostly from L2). For reference, two that change the numerics:
    bf16 operands with float32 accumulation, and TF32 x 3 (tensor cores, ~float32 precision)."""
    f32, hp = jnp.float32, jax.lax.Precision.HIGHEST
    router_t, router_bf16 = router.T.copy(), router.astype(BF16)
    out = [
        ("router f32 HIGHEST", lambda x, w: jnp.einsum("md,de->me", x.astype(f32), w, precision=hp,
                                                       preferred_element_type=f32), (h, router), b(router)),
        ("router f32 HIGHEST, [E, D]", lambda x, w: jnp.einsum("md,ed->me", x.astype(f32), w, precision=hp,
                                                               preferred_element_type=f32), (h, router_t), b(router_t)),
        ("router f32 [E, D], multiply + row reduce", lambda x, w: jnp.sum(x.astype(f32)[:, None, :] * w[None], axis=-1),
         (h, router_t), b(router_t)),
        ("router bf16 operands, f32 accumulate (other numerics)",
         lambda x, w: jnp.einsum("md,de->me", x, w, preferred_element_type=f32), (h, router_bf16), b(router_bf16)),
    ]
    if jax.default_backend() == "gpu":  # XLA:CPU has no TF32 algorithm
        out.append(("router TF32 x 3 (other numerics)", lambda x, w: jnp.einsum(
            "md,de->me", x.astype(f32), w, precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
            preferred_element_type=f32), (h, router), b(router)))
    return out


def candidates(m: int):
    """(name, fn, args, weight bytes) at batch m."""
    f32 = jnp.float32
    h = _w(1, (m, D))
    lat = _w(2, (m, R))
    qn = _w(3, (m, H, DN))
    cl = _w(4, (m, H, DC))
    hv = _w(5, (m, H, DV))
    w_q_a, w_kv, i_q, i_k, i_head = _w(10, (D, R)), _w(11, (D, DC + DR)), _w(12, (D, HI, DI)), _w(13, (D, DI)), _w(14, (D, HI))
    w_in = jnp.concatenate([w_q_a, w_kv, i_q.reshape(D, -1), i_k, i_head], axis=1)
    w_q_b = _w(15, (R, H, DN + DR))
    w_uk, w_uv, w_o = _w(16, (H, DN, DC)), _w(17, (H, DC, DV)), _w(18, (H, DV, D))
    unembed = _w(19, (D, V))
    unembed_pad = _w(19, (D, (V + 63) // 64 * 64))
    unembed_t = _w(19, (V, D))
    router = _w(20, (D, ROUTED), f32)
    b = lambda *ws: sum(int(np.prod(w.shape)) * w.dtype.itemsize for w in ws)

    def inputs_sep(h, a, kv, q, k, hd):
        return (jnp.einsum("md,dr->mr", h, a), jnp.einsum("md,dw->mw", h, kv), jnp.einsum("md,dje->mje", h, q),
                jnp.einsum("md,de->me", h, k), jnp.einsum("md,dj->mj", h, hd, preferred_element_type=f32))

    def inputs_mla(h, a, kv):
        return jnp.einsum("md,dr->mr", h, a), jnp.einsum("md,dw->mw", h, kv)

    def inputs_cat(h, w):
        y = jnp.einsum("md,dn->mn", h, w)
        return y[:, :R], y[:, R:R + DC + DR], y[:, R + DC + DR:]

    def inputs_model(h, w):  # as hisparse_jax.kit.inputs.apply: float32 out, each piece cast to what its einsum gave
        y = jnp.einsum("md,dn->mn", h, w, preferred_element_type=f32)
        return (y[:, :R].astype(BF16), y[:, R:R + DC + DR].astype(BF16), y[:, R + DC + DR:-HI].astype(BF16),
                y[:, -HI:])

    # the shared expert (E = 1, F = 2048, fp8 codes with a float32 scale per output channel)
    sg = jax.random.normal(jax.random.PRNGKey(21), (2 * 2048, D), jnp.float32).astype(jnp.float8_e4m3fn)
    sd = jax.random.normal(jax.random.PRNGKey(22), (D, 2048), jnp.float32).astype(jnp.float8_e4m3fn)
    sg_scale, sd_scale = jnp.full((2 * 2048,), 0.01, f32), jnp.full((D,), 0.01, f32)
    act = _w(23, (m, 2048))

    def xla_fp8(x, w, scale):  # the codes widened inside the dot (exact), the scale after it
        return jnp.einsum("mk,nk->mn", x, w.astype(x.dtype), preferred_element_type=f32) * scale

    out = [
        ("shared gate_up by XLA (fp8 widened in the dot)", xla_fp8, (h, sg, sg_scale), b(sg, sg_scale)),
        ("shared down by XLA (fp8 widened in the dot)", xla_fp8, (act, sd, sd_scale), b(sd, sd_scale)),
        ("inputs: q_a, kv, i_q, i_k, i_head apart", inputs_sep, (h, w_q_a, w_kv, i_q, i_k, i_head),
         b(w_q_a, w_kv, i_q, i_k, i_head)),
        ("inputs: q_a, kv apart", inputs_mla, (h, w_q_a, w_kv), b(w_q_a, w_kv)),
        ("inputs: one [D, 6880] weight", inputs_cat, (h, w_in), b(w_in)),
        ("inputs: one [D, 6880] weight, f32 out (kit.inputs)", inputs_model, (h, w_in), b(w_in)),
        ("q_b", lambda x, w: jnp.einsum("mr,rhe->mhe", x, w), (lat, w_q_b), b(w_q_b)),
        ("w_uk (f32 out)", lambda x, w: jnp.einsum("mhn,hnc->mhc", x, w, preferred_element_type=f32), (qn, w_uk), b(w_uk)),
        ("w_uv", lambda x, w: jnp.einsum("mhc,hcv->mhv", x, w), (cl, w_uv), b(w_uv)),
        ("w_o", lambda x, w: jnp.einsum("mhv,hvd->md", x, w), (hv, w_o), b(w_o)),
        ("unembed [D, V]", lambda x, w: jnp.einsum("md,dv->mv", x, w, preferred_element_type=f32), (h, unembed), b(unembed)),
        ("unembed [D, V padded to 64]", lambda x, w: jnp.einsum("md,dv->mv", x, w, preferred_element_type=f32)[:, :V],
         (h, unembed_pad), b(unembed_pad)),
        ("unembed [V, D]", lambda x, w: jnp.einsum("md,vd->mv", x, w, preferred_element_type=f32), (h, unembed_t), b(unembed_t)),
        *router_candidates(h, router, b),
    ]
    try:  # the house kernel (hisparse_jax.grouped_matmul, E = 1, bf16) on the same weights, [1, N, K]
        from hisparse_jax.grouped_matmul import grouped_matmul
        from hisparse_jax import ffi_platforms
        if "cuda" not in ffi_platforms():
            raise ImportError("no CUDA handlers")
        gm = lambda x, w: grouped_matmul(x, w, jnp.full((1,), x.shape[0], jnp.int32), implementation="ffi")
        gm8 = lambda x, w, s: grouped_matmul(x, w, jnp.full((1,), x.shape[0], jnp.int32), s, implementation="ffi")
        out.append(("shared gate_up, house kernel", gm8, (h, sg[None], sg_scale[None]), b(sg, sg_scale)))
        out.append(("shared down, house kernel", gm8, (act, sd[None], sd_scale[None]), b(sd, sd_scale)))
        for name, w in (("house kernel: inputs [6880, D]", w_in.T[None]), ("house kernel: q_a + kv [2624, D]",
                        jnp.concatenate([w_q_a, w_kv], axis=1).T[None]), ("house kernel: unembed [V, D]", unembed_t[None]),
                        ("house kernel: q_b [16384, R]", w_q_b.reshape(R, -1).T[None])):
            x = lat if w.shape[-1] == R else h
            out.append((name, gm, (x, jnp.asarray(w)), b(w)))
    except ImportError as e:
        print(f"(no house-kernel candidates: {e})", flush=True)
    return out


def kernel_events(trace_dir: str):
    files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))
    with gzip.open(files[-1]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:GPU" in str(e.get("args", {}).get("name", ""))}
    return [e for e in events if e.get("ph") == "X" and e.get("pid") in devices]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", help="JSON file for the results")
    p.add_argument("--batches", default="2,17", help="comma-separated batch sizes")
    p.add_argument("--calls", type=int, default=30, help="timed calls per matmul")
    p.add_argument("--hbm", type=float, default=4.358e12, help="HBM read bytes/s for the share column")
    p.add_argument("--flush-mb", type=int, default=256,
                   help="MiB rewritten between calls so weights come from HBM, not L2 (0: no flush, as before)")
    a = p.parse_args(argv)
    rows = []
    for m in [int(x) for x in a.batches.split(",")]:
        progs = []
        for i, (name, fn, args, wbytes) in enumerate(candidates(m)):
            fn.__name__ = f"cand_{m}_{i}"
            j = jax.jit(fn)
            jax.block_until_ready(j(*args))
            progs.append((name, j, args, wbytes, f"jit_cand_{m}_{i}"))
        # Between calls, a program of its own (not counted) rewrites a buffer larger than L2, so
        # every call reads its weights from HBM as in a decode step (a layer's weights are long
        # evicted when the next step reaches it); without it a weight under L2's size (the
        # router's 6.3 MB) is read from L2 after the first call.
        flush = jax.jit(lambda x: x + 1, donate_argnums=0)
        scratch = jnp.zeros((a.flush_mb << 18,), jnp.float32) if a.flush_mb else None
        trace_dir = tempfile.mkdtemp(prefix="projbench-")
        with jax.profiler.trace(trace_dir):
            for name, j, args, _, _ in progs:
                for _ in range(a.calls):
                    if scratch is not None:
                        scratch = jax.block_until_ready(flush(scratch))
                    jax.block_until_ready(j(*args))
        events = kernel_events(trace_dir)
        by_module = collections.defaultdict(list)
        for e in events:
            by_module[str(e.get("args", {}).get("hlo_module", ""))].append(e)
        for name, _, _, wbytes, module in progs:
            # This candidate's module only: "jit_cand_2_1" is also the start of "jit_cand_2_10" and on.
            mine = lambda mod: mod == module or (mod.startswith(module) and not mod[len(module)].isdigit())
            evs = sorted((e for mod, es in by_module.items() if mine(mod) for e in es), key=lambda e: e["ts"])
            per_call = len(evs) // a.calls if a.calls else 0
            times = [sum(e["dur"] for e in evs[c * per_call:(c + 1) * per_call]) for c in range(a.calls)] if per_call else [0.0]
            names = [e["name"] for e in evs[:per_call]]
            med = statistics.median(times)
            row = dict(batch=m, candidate=name, kernels=names, us_min=min(times), us_median=med, us_max=max(times),
                       weight_mb=wbytes / 1e6, hbm_share=(wbytes / (med * 1e-6) / a.hbm) if med else 0.0)
            rows.append(row)
            print(f"| {m} | {name} | {per_call} ({', '.join(n[:40] for n in names)}) | {min(times):.2f} / {med:.2f} / "
                  f"{max(times):.2f} | {wbytes / 1e6:.1f} | {row['hbm_share']:.0%} |", flush=True)
    with open(a.out, "w") as f:
        json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

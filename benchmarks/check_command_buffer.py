"""Does XLA capture RESOLVE into CUDA graphs (command buffers) inside a jitted scan?

Compiles a decode-shaped program (lax.scan over steps around lax.scan over
layers, RESOLVE per layer plus a gather from the hot buffer, cache donated),
runs it, and reports where `hisparse_resolve` sits in the optimized HLO: inside
a command-buffer computation (captured into a CUDA graph) or as a plain thunk.

  python benchmarks/check_command_buffer.py
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np

import hisparse_jax as hs


def main():
    L, batch, steps = 4, 8, 3
    cfg = hs.CacheConfig(num_layers=L, stream_shape=(batch,), pool_records=4096, hot_slots=512,
                         top_k=256, record_width=576, dtype=jnp.bfloat16)
    pool = hs.alloc_host_pool(cfg)
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.standard_normal((L, batch, 4096, 1, 576)), jnp.bfloat16)
    pool = hs.write_records_inplace(pool, rows, jnp.zeros(batch, jnp.int32))
    cache = hs.init_hot_cache(cfg)
    selections = jnp.asarray(rng.integers(0, 4096, (steps, L, batch, 256)), jnp.int32)
    sealed = jnp.full((batch,), 4096, jnp.int32)

    def program(cache, pool, selections):
        def step(cache, sel_step):
            def layer(cache, xs):
                sel, l = xs
                res, cache = hs.resolve(cache, pool, sel, sealed, l)
                records = jnp.take_along_axis(cache.hot[l], res.slots[..., None, None], axis=1)
                return cache, (records.astype(jnp.float32).sum(), res.misses.sum())
            return jax.lax.scan(layer, cache, (sel_step, jnp.arange(L, dtype=jnp.int32)))

        return jax.lax.scan(step, cache, selections)

    jitted = jax.jit(program, donate_argnums=0)
    compiled = jitted.lower(cache, pool, selections).compile()
    hlo = compiled.as_text()
    cache, (sums, misses) = jitted(cache, pool, selections)
    jax.block_until_ready(sums)

    # Computations whose name marks a command buffer, and the resolve calls in them.
    blocks = re.split(r"\n(?=\S)", hlo)
    in_cmd = [b.split("(", 1)[0] for b in blocks if "hisparse_resolve" in b and "command_buffer" in b.split("\n", 1)[0]]
    calls = hlo.count('custom_call_target="hisparse_resolve"')
    report = dict(
        backend=jax.default_backend(), jax=jax.__version__, ffi=hs.ffi_platforms(),
        resolve_calls_in_hlo=calls,
        command_buffer_computations_with_resolve=in_cmd,
        captured=bool(in_cmd),
        command_buffer_computations=[b.split("(", 1)[0] for b in blocks if "command_buffer" in b.split("\n", 1)[0]],
        resolve_call_context=[line.strip()[:160] for line in hlo.splitlines() if "hisparse_resolve" in line],
        misses_per_step=np.asarray(misses).sum(axis=1).tolist(),
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

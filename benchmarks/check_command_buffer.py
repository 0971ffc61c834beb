"""Does XLA capture RESOLVE into CUDA graphs (command buffers) inside a jitted scan?

Compiles and runs a decode-shaped program (lax.scan over steps around lax.scan
over layers, RESOLVE per layer plus a gather from the hot buffer, cache
donated) with XLA's dumps on, then reads the thunk sequence XLA executes:
RESOLVE is captured when its kCustomCall sits under a kCommandBuffer thunk.
Extra XLA flags (e.g. --xla_gpu_enable_command_buffer=...) pass through XLA_FLAGS.

  python benchmarks/check_command_buffer.py
"""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile

DUMP = tempfile.mkdtemp(prefix="hisparse-xla-dump-")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP}".strip()

import jax  # noqa: E402  (XLA_FLAGS must be set before the backend starts)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hisparse_jax as hs  # noqa: E402


def _program(pool, sealed, num_layers):
    def step(cache, sel_step):
        def layer(cache, xs):
            sel, l = xs
            res, cache = hs.resolve(cache, pool, sel, sealed, l)
            records = jnp.take_along_axis(cache.hot[l], res.slots[..., None, None], axis=1)
            return cache, (records.astype(jnp.float32).sum(), res.misses.sum())

        return jax.lax.scan(layer, cache, (sel_step, jnp.arange(num_layers, dtype=jnp.int32)))

    return step


def main():
    L, batch, steps, R, B, k = 4, 8, 3, 4096, 512, 256
    cfg = hs.CacheConfig(num_layers=L, stream_shape=(batch,), pool_records=R, hot_slots=B,
                         top_k=k, record_width=576, dtype=jnp.bfloat16)
    rng = np.random.default_rng(0)
    pool = hs.write_records_inplace(
        hs.alloc_host_pool(cfg),
        jnp.asarray(rng.standard_normal((L, batch, R, 1, 576)), jnp.bfloat16),
        jnp.zeros(batch, jnp.int32),
    )
    selections = jnp.asarray(rng.integers(0, R, (steps, L, batch, k)), jnp.int32)
    step = _program(pool, jnp.full((batch,), R, jnp.int32), L)
    def decode_like(cache, sels):
        return jax.lax.scan(step, cache, sels)

    cache, (sums, misses) = jax.jit(decode_like, donate_argnums=0)(hs.init_hot_cache(cfg), selections)
    jax.block_until_ready(sums)

    sequences = [p for p in glob.glob(f"{DUMP}/*thunk_sequence.txt") if "jit_decode_like" in p]
    lines = open(sequences[0]).read().splitlines() if sequences else []
    # Indentation nests thunks: the custom call is captured when a kCommandBuffer encloses it.
    enclosing, captured, path = [], False, None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        enclosing = [(d, kind) for d, kind in enclosing if d < depth]
        kind = re.search(r"\b(k[A-Z]\w+)", line)
        if kind and kind.group(1) == "kCustomCall":
            captured |= any(k == "kCommandBuffer" for _, k in enclosing)
            path = [k for _, k in enclosing] + ["kCustomCall"]
        if kind:
            enclosing.append((depth, kind.group(1)))
    print(json.dumps(dict(
        backend=jax.default_backend(), jax=jax.__version__, ffi=hs.ffi_platforms(),
        thunk_sequence_found=bool(lines),
        command_buffer_thunks=sum("kCommandBuffer" in line for line in lines),
        resolve_thunk_path=path,
        resolve_captured_in_command_buffer=captured,
        misses_per_step=np.asarray(misses).sum(axis=1).tolist(),
        dump=DUMP,
    ), indent=1))


if __name__ == "__main__":
    main()

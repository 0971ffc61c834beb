"""GQA transformer pieces shared by the page-granular families (Quest, NSA).

Heads are laid out [..., h, g, hd]: h = KV heads (the stream dim of the store), g = query heads
per KV head (G = n_heads // n_kv_heads). A token's record of one KV head is [rope(k), v],
2 * head_dim wide, in the model dtype.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import common


def init_normal(seed: int, specs: dict[str, tuple[tuple[int, ...], int]], dtype) -> dict[str, jax.Array]:
    """Normal(0, 1/fan_in) parameters from one seeded draw: {name: (shape, fan_in)} -> {name: array}.

    One flat draw instead of one per parameter: XLA:CPU compiles each threefry kernel for
    seconds, so a draw per parameter costs tens of seconds of compile in CPU tests. The jitted
    draw is keyed on the shapes alone, so configs that differ only in cache sizes share it.
    """
    names = tuple(specs)
    shapes = tuple(tuple(int(d) for d in specs[n][0]) for n in names)
    scales = tuple(1.0 / math.sqrt(specs[n][1]) for n in names)
    arrays = _draw(shapes, scales, np.dtype(dtype), seed)
    return dict(zip(names, arrays))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _draw(shapes, scales, dtype, seed):
    sizes = [math.prod(s) for s in shapes]
    flat = jax.random.normal(jax.random.key(seed), (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    return tuple(
        (flat[o : o + n] * scale).astype(dtype).reshape(s)
        for o, n, s, scale in zip(offsets, sizes, shapes, scales)
    )


def query(h: jax.Array, w_q: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """h [b, ..., D], w_q [D, h, g, hd], positions [b, ...] -> rope(q) [b, ..., h, g, hd] in h.dtype."""
    q = jnp.einsum("...d,dhgk->...hgk", h, w_q)
    return common.rope(q, positions[..., None, None], theta)


def kv_record(h: jax.Array, w_k: jax.Array, w_v: jax.Array, positions: jax.Array, theta: float, dtype):
    """h [b, ..., D], w_k/w_v [D, h, hd], positions [b, ...] -> [b, ..., h, 2hd] = [rope(k), v] in dtype."""
    k = common.rope(jnp.einsum("...d,dhk->...hk", h, w_k), positions[..., None], theta)
    v = jnp.einsum("...d,dhk->...hk", h, w_v)
    return jnp.concatenate([k, v], axis=-1).astype(dtype)


def attention_out(heads: jax.Array, w_o: jax.Array, dtype) -> jax.Array:
    """heads [..., h, g, hd] (float32), w_o [h, g, hd, D] -> [..., D] in dtype."""
    return jnp.einsum("...hgk,hgkd->...d", heads.astype(dtype), w_o)


def commit(state, sharding=None):
    """`state` with every device-memory leaf committed to `sharding` (default: the first device).

    jnp.zeros makes uncommitted arrays, and a jit's outputs are uncommitted when all its inputs
    are: a state from init_state would then reach decode.generate uncommitted on its first call
    and committed on the next, two compile-cache keys for one program (the second call would
    recompile). Leaves in host memory (the pinned pool) are already committed and stay put.
    """
    target = sharding if sharding is not None else jax.sharding.SingleDeviceSharding(jax.devices()[0])
    on_host = lambda x: jax.typeof(x).memory_space == jax.memory.Space.Host
    return jax.tree.map(lambda x: x if on_host(x) else jax.device_put(x, target), state)


def per_stream(x: jax.Array, kv_heads: int) -> jax.Array:
    """[b] -> [b, kv_heads]: a per-request value broadcast to the (b, kvh) stream shape."""
    return jnp.broadcast_to(x[:, None], (x.shape[0], kv_heads))

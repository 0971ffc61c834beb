"""AdamW with global-norm gradient clipping (float32 state), and a warm-up + cosine schedule."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class AdamW:
    """Hyperparameters (hashable: a static jit argument)."""

    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # on matrices only (ndim >= 2), not on norms and biases
    clip: float = 1.0



def learning_rate(peak: float, step: int, steps: int, warmup: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine from `peak` down to final_fraction * peak at
    step `steps` - 1 (a host-side float: the program takes it as an argument, so a schedule
    never recompiles it)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(max((step - warmup) / max(steps - 1 - warmup, 1), 0.0), 1.0)
    return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def init(params):
    """(first moments, second moments, step) of zeros."""
    zeros = lambda p: jnp.zeros(p.shape, jnp.float32)
    return jax.tree.map(zeros, params), jax.tree.map(zeros, params), jnp.zeros((), jnp.int32)


def global_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(tree)))


def update(opt: AdamW, grads, state, params, lr):
    """One step at learning rate `lr`: (new params, new state, gradient norm before clipping)."""
    m, v, step = state
    norm = global_norm(grads)
    scale = jnp.minimum(1.0, opt.clip / jnp.maximum(norm, 1e-12))
    grads = jax.tree.map(lambda g: g * scale, grads)
    m = jax.tree.map(lambda m, g: opt.b1 * m + (1 - opt.b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: opt.b2 * v + (1 - opt.b2) * g * g, v, grads)
    t = (step + 1).astype(jnp.float32)
    correct1, correct2 = 1 - opt.b1**t, 1 - opt.b2**t

    def apply(p, m, v):
        delta = (m / correct1) / (jnp.sqrt(v / correct2) + opt.eps)
        decay = opt.weight_decay * p if p.ndim >= 2 else 0.0
        return p - lr * (delta + decay)

    return jax.tree.map(apply, params, m, v), (m, v, step + 1), norm

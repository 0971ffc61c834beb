"""The MoE's routing bookkeeping without sorts: a token's k best experts and the grouping of its
(token, choice) pairs by local expert, as comparison counts that XLA fuses into a few reductions.

Why: at decode sizes the sort-based form (lax.top_k over the router's scores, a stable argsort of
the pairs by expert, a bincount and the inverse permutation's scatter) is a chain of small kernels
(two sorts of ~4-5 us each, several 1-2 us scatters and gathers a layer on an H200: BENCHMARKS.md,
the MoE's bookkeeping). Counting does the same selection exactly:

  - top-k: expert e's rank is the number of experts that beat it (a higher score in the total
    order of floats lax.top_k uses: -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN; on equal
    scores the lower id beats the higher). The j-th choice is the expert of rank j.
  - grouping: pair p's place in the stable sort by local expert is the number of pairs before it
    in (expert, pair) order: exactly the inverse permutation of argsort(local, stable=True).

Every output is an integer or a value picked from the input, so both forms give the same bits
(tests/models/test_routing.py holds them equal, ties and non-finite scores included). Counting
costs N^2 comparisons a token for N router scores and P^2 for P pairs, so each form is used
where its count pays (H200, glm5-h200's 256 scores and 8 choices a token, BENCHMARKS.md): the
grouping up to 2048 pairs (at 136 pairs its three reductions took 3.5 us a layer less than the
argsort, bincount and scatter); the top-k only up to 4 tokens (at 2 tokens it saved ~1 us a
layer; at 17 its 1.1M comparisons made it ~1 us slower than lax.top_k's sort).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Most comparisons a counting reduction may spell out: T x N x N for the top-k (4 tokens of 256
# scores), P x P for the grouping (2048 pairs; 2^22 comparisons summed in int32 is one fusion of a
# few us).
TOP_K_COUNT_LIMIT = 1 << 18
GROUPING_COUNT_LIMIT = 1 << 22


def top_k_counts(tokens: int, scores: int) -> bool:
    """Whether the top-k of `tokens` rows of `scores` router scores is counted (static shapes: the
    choice is made at trace time, never per value)."""
    return tokens * scores * scores <= TOP_K_COUNT_LIMIT


def grouping_counts(pairs: int) -> bool:
    """Whether the grouping of `pairs` (token, choice) pairs is counted."""
    return pairs * pairs <= GROUPING_COUNT_LIMIT


def _total_order_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 whose signed order is the floats' total order (lax.top_k's, NaNs by sign)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return bits ^ ((bits >> 31) & jnp.int32(0x7FFFFFFF))


# Score dtypes the counting top-k orders exactly: its key is the float32 bit pattern (bfloat16
# widens to float32 exactly, NaN payloads included); others go to lax.top_k.
_COUNTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def top_k(scores: jax.Array, k: int, *, counting: bool) -> tuple[jax.Array, jax.Array]:
    """scores [T, N] -> (values [T, k], ids [T, k] int32), best first: lax.top_k's result, by
    counting when `counting` and the scores are float32 or bfloat16, else lax.top_k itself."""
    n = scores.shape[-1]
    if not 0 <= k <= n:
        raise ValueError(f"routing.top_k: k must be in [0, {n}] (the scores per row), got {k}")
    if not counting or scores.dtype not in _COUNTED_DTYPES:
        values, ids = jax.lax.top_k(scores, k)
        return values, ids.astype(jnp.int32)
    key = _total_order_key(scores)
    ids = jnp.arange(n, dtype=jnp.int32)
    mine, other = key[..., :, None], key[..., None, :]
    beats = (other > mine) | ((other == mine) & (ids[None, :] < ids[:, None]))  # [T, N (e), N (e')]
    rank = jnp.sum(beats, axis=-1, dtype=jnp.int32)  # [T, N]: a permutation of 0..N-1 per row
    ranks = jnp.arange(k, dtype=jnp.int32)
    chosen = jnp.sum(jnp.where(rank[..., None, :] == ranks[:, None], ids, 0), axis=-1, dtype=jnp.int32)
    return jnp.take_along_axis(scores, chosen, axis=-1), chosen


def group_pairs(local: jax.Array, experts: int, *, counting: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """local [P] int32 (each pair's local expert, in [0, experts)) -> (order [P], inverse [P],
    group_sizes [experts] int32): order lists the pairs by expert, each expert's in pair order
    (argsort(local, stable=True)); inverse[p] is pair p's place in it; group_sizes counts each
    expert's pairs."""
    P = local.shape[0]
    if not counting:
        order = jnp.argsort(local, stable=True).astype(jnp.int32)
        inverse = jnp.zeros_like(order).at[order].set(jnp.arange(P, dtype=jnp.int32), unique_indices=True)
        return order, inverse, jnp.bincount(local, length=experts).astype(jnp.int32)
    pair = jnp.arange(P, dtype=jnp.int32)
    mine, other = local[:, None], local[None, :]
    before = (other < mine) | ((other == mine) & (pair[None, :] < pair[:, None]))  # [P (p), P (q)]
    inverse = jnp.sum(before, axis=-1, dtype=jnp.int32)
    order = jnp.sum(jnp.where(inverse[None, :] == pair[:, None], pair[None, :], 0), axis=-1, dtype=jnp.int32)
    group_sizes = jnp.sum(local[None, :] == jnp.arange(experts, dtype=jnp.int32)[:, None], axis=-1, dtype=jnp.int32)
    return order, inverse, group_sizes

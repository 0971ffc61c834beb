"""MoE ROUTE: a layer's whole routing bookkeeping in one call. From the router's scores, a token's
k best experts, their weights, and the grouping of the (token, choice) pairs by local expert that
the grouped matmul consumes.

Why a custom call: in XLA this is a chain of small kernels a layer, a launch apart (the top-k's
counts or sort, the picked scores, their normalization, the grouping's three reductions: about
eight fusions of 1-4 us each on an H200, BENCHMARKS.md's short kernels), and a decode step of a
MoE model runs it in every layer. "hisparse_moe_route" does it in one launch: in C++ on CPU, in
one CUDA thread block on GPU. The contract, total order of floats and float rounding included,
is ffi/moe_route.h; every implementation gives the same bits, the XLA reference below included.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _dispatch, _ffi, targets
from ._dispatch import Implementation
from .models import routing

_OP = "route_experts"

# The CUDA kernel's limits (ffi/moe_route_cuda.h; tests hold them equal): "auto" runs the XLA
# reference on a GPU outside them, "ffi" refuses there.
CUDA_MAX_PAIRS = 1 << 16  # T x k
CUDA_MAX_SCORES = 1 << 16  # N
CUDA_MAX_EXPERTS = 1024  # E
# The one NaN a weight is stored as (ffi/moe_route.h, kMoeRouteNanBits): CPUs carry an operand's
# payload into a NaN result, GPUs make their own.
NAN_BITS = 0x7FC00000


class RoutedPairs(NamedTuple):
    """What a MoE layer needs from its router, for T tokens, k choices, E local experts
    (pair p = token p // k, its choice p % k)."""

    chosen: jax.Array  # [T, k] int32: a token's expert ids, best first (lax.top_k's order)
    weights: jax.Array  # [T, k] float32: (score / the chosen scores' sum) * scaling
    order: jax.Array  # [T k] int32: the pairs by local expert (chosen mod E), each expert's in pair order
    inverse: jax.Array  # [T k] int32: pair p's place in order
    group_sizes: jax.Array  # [E] int32: pairs of each local expert


def route_experts(scores: jax.Array, k: int, experts: int, scaling: float, *,
                  implementation: Implementation = "auto") -> RoutedPairs:
    """Routes T tokens: their k best of N experts, the weights, and the pairs grouped by local expert.

    Args:
      scores: [T, N] float32 router scores (e.g. the sigmoid of the router's logits).
      k: Python int in [1, N], the experts a token picks.
      experts: Python int >= 1, E: the local experts; a pair's local expert is its chosen id mod E.
      scaling: finite Python float, the weights' factor (a float32 attribute).
      implementation: "ffi" (the C++/CUDA handler), "reference" (XLA ops) or "auto" (the handler
        where one is registered for the default backend, on a GPU only inside its limits).
    Returns:
      RoutedPairs. chosen[t] are the ids of the k largest scores of token t in IEEE 754
      totalOrder (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN), ties to the lower id,
      best first: jax.lax.top_k's indices. weights[t, j] = (top_j x (1 / sum)) x scaling with top_j the
      chosen score and sum their float32 sum from left to right (a NaN weight is the quiet NaN
      0x7FC00000 on every platform). order lists the pairs by local
      expert (a stable sort), inverse[p] is pair p's place in it, group_sizes[e] counts expert
      e's pairs.
    Works under jit and inside lax.scan; not under vmap (the grouping spans every token).
    """
    _check_route(scores, k, experts, scaling)
    on_cuda = _ffi.platform_of(jax.default_backend()) == "cuda"
    domain = cuda_domain_error(*jax.typeof(scores).shape, k, experts) if on_cuda else ""
    impl = _dispatch.choose_implementation(_OP, implementation, targets.MOE_ROUTE, domain)
    if impl == "reference":
        return route_experts_reference(scores, k, experts, scaling)
    _dispatch.require_handler(_OP, targets.MOE_ROUTE, domain)
    T = jax.typeof(scores).shape[0]
    call = jax.ffi.ffi_call(
        targets.MOE_ROUTE,
        (
            jax.ShapeDtypeStruct((T, k), jnp.int32),
            jax.ShapeDtypeStruct((T, k), jnp.float32),
            jax.ShapeDtypeStruct((T * k,), jnp.int32),
            jax.ShapeDtypeStruct((T * k,), jnp.int32),
            jax.ShapeDtypeStruct((experts,), jnp.int32),
        ),
    )
    return RoutedPairs(*call(scores, k=np.int64(k), experts=np.int64(experts), scaling=np.float32(scaling)))


def route_experts_reference(scores: jax.Array, k: int, experts: int, scaling: float, *,
                            counting: bool = True) -> RoutedPairs:
    """route_experts in XLA ops (models/routing.py): the top-k and the grouping by comparison
    counts where routing.py's limits say they pay (`counting`), by lax.top_k and a stable argsort
    elsewhere; the weights summed left to right. The same bits either way, and the handler's on
    each platform: on a GPU XLA compiles the reciprocal to PTX div.full.f32 (within 2 ulp of the
    IEEE quotient, not always it) and the CUDA kernel takes that instruction too (ffi/moe_route.h)."""
    T = scores.shape[0]
    _, chosen = routing.top_k(scores, k, counting=counting and routing.top_k_counts(T, scores.shape[-1]))
    top = jnp.take_along_axis(scores, chosen, axis=-1)  # the scores' own bits (NaN payloads kept)
    total = top[:, 0]
    for j in range(1, k):  # left to right, as the contract sums: XLA never reassociates floats
        total = total + top[:, j]
    # The reciprocal once, then a multiply per choice: what XLA compiles `top / total[:, None]` to
    # anyway (it rewrites a divide by a broadcast), so the model's weights keep their earlier bits.
    weights = top * (jnp.float32(1) / total)[:, None] * jnp.float32(scaling)
    nan = jax.lax.bitcast_convert_type(jnp.uint32(NAN_BITS), jnp.float32)
    weights = jnp.where(jnp.isnan(weights), nan, weights)  # one NaN on every platform
    local = (chosen % experts).reshape(T * k)
    order, inverse, group_sizes = routing.group_pairs(local, experts, counting=counting and routing.grouping_counts(T * k))
    return RoutedPairs(chosen, weights, order, inverse, group_sizes)


def cuda_domain_error(tokens: int, scores: int, k: int, experts: int) -> str:
    """Why the CUDA kernel cannot route `tokens` x `scores` router scores, k choices, `experts`
    local experts ("" when it can; the CPU handler takes every size)."""
    T, N = tokens, scores
    for what, value, limit in (("pairs T x k", T * k, CUDA_MAX_PAIRS), ("scores N", N, CUDA_MAX_SCORES),
                               ("experts E", experts, CUDA_MAX_EXPERTS)):
        if value > limit:
            return (f"{what} = {value} exceeds the CUDA kernel's limit of {limit}; "
                    "pass implementation='reference' (or 'auto')")
    return ""


def _is_int(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


def _check_route(scores, k, experts, scaling) -> None:
    """Trace-time checks of route_experts' arguments, each naming the argument and the fix."""
    shape, dtype = tuple(jax.typeof(scores).shape), np.dtype(jax.typeof(scores).dtype)
    if len(shape) != 2:
        raise ValueError(f"{_OP}: scores must be [T, N] (tokens x router scores), got shape {shape}; "
                         "flatten the token axes first")
    if dtype != np.float32:
        raise TypeError(f"{_OP}: scores must be float32, got {dtype}; cast it with .astype(jnp.float32)")
    T, N = shape
    if N < 1:
        raise ValueError(f"{_OP}: scores has N = 0 router scores a token; give every expert a score")
    if not _is_int(k):
        raise TypeError(f"{_OP}: k must be a Python int (static), got {k!r}")
    if not 1 <= k <= N:
        raise ValueError(f"{_OP}: k={k} must lie in [1, N={N}] (N = scores.shape[1]); pick fewer experts")
    if not _is_int(experts):
        raise TypeError(f"{_OP}: experts must be a Python int (static), got {experts!r}")
    if not 1 <= experts <= np.iinfo(np.int32).max:
        raise ValueError(f"{_OP}: experts={experts} must lie in [1, 2^31 - 1]; it is the local experts E")
    if T * k > np.iinfo(np.int32).max:
        raise ValueError(f"{_OP}: T x k = {T} x {k} pairs must fit in int32; route fewer tokens a call")
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float, np.integer, np.floating)):
        raise TypeError(f"{_OP}: scaling must be a Python float, got {scaling!r}")
    if not (math.isfinite(float(scaling)) and abs(float(scaling)) <= float(np.finfo(np.float32).max)):
        raise ValueError(f"{_OP}: scaling={scaling!r} must be a finite float32; pass the routed scaling factor")

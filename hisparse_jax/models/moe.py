"""The mixture-of-experts feed-forward branch, in place of the dense SwiGLU MLP when Config.experts > 0.

A token's branch input h = rms_norm(x) is scored by a sigmoid router over experts x expert_groups
experts (float32); the token goes to its experts_per_token best (jax.lax.top_k's choice: ties go
to the lower id; counted instead of sorted at decode sizes, models/routing.py, or all of it in
one custom call, moe_route.py), weighted by their scores normalized to sum 1, times routed_scaling (DeepSeek-V3's routing without its group limit
and score bias). Each routed expert is a SwiGLU of width
expert_d_ff; a shared expert of width shared_experts x expert_d_ff (if any) sees every token.

Expert parallelism. A deployment spreads a layer's experts x G routed experts over the G GPUs of
its expert-parallel group, `experts` on each; every GPU's tokens are routed over all of them and
an all-to-all brings each GPU the (token, expert) pairs of its own experts. This module runs one
GPU of such a group with no communication: its b local tokens stand for the batch of every GPU
of the group. The router scores all experts x G experts, and each of the b x experts_per_token
choices runs on the local expert (choice mod experts). A real EP GPU receives on average
b x G x k / G = b x k pairs (b tokens on each of G GPUs, each pair landing on one of the G), so
this GPU computes as many pairs as one EP GPU, spread over its experts as evenly (uniform
routing); the experts it must read, those with at least one pair, number
E (1 - (1 - 1/E)^(b k)) on average (`expected_active_experts`), and the expert bytes a decode step
reads grow with the batch like one EP GPU's. Left out: the all-to-all's time and the load
imbalance of trained routers.

The expert matmuls are hisparse_jax.grouped_matmul (the CUDA kernel reads only experts with
rows; elsewhere an XLA reference): the pairs are put in local expert order (a stable sort's
order; at decode sizes counted, models/routing.py), run as groups, and brought back to token order
by a gather with the inverse permutation. No float scatter-add anywhere: each token sums its k
weighted expert outputs in choice order, in float32, so a decode step gives the same bits on every
run and in every decode mode.

Weights: expert matrices are [E, N, K] with K the contiguous axis (grouped_matmul's layout):
w_gate_up [E, 2F, D] (an expert's gate rows, then its up rows) and w_down [E, D, F]; with
expert_dtype "fp8", float8_e4m3fn codes and a float32 scale per expert and output channel
(fp8.quantize_rows). The router is kept in float32 (D x experts x G: a few MB
at most, read once per step): routing is a discrete choice, and bf16 logits would tie or swap
near-equal experts that float32 keeps apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import fp8
from ..grouped_matmul import grouped_matmul
from ..moe_route import RoutedPairs, route_experts, route_experts_reference
from . import layers
from .config import ModelConfig, is_positive_int
from .weights import init_normal, ones

# init_normal stream of the expert weights: (_STREAM, layer), apart from the family's own draws.
_STREAM = 0x4D6F45


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExpertWeights:
    """E SwiGLU experts of width F, in grouped_matmul's [E, N, K] layout."""

    w_gate_up: jax.Array  # [E, 2F, D]: an expert's F gate rows, then its F up rows
    w_down: jax.Array  # [E, D, F]
    gate_up_scale: jax.Array | None  # [E, 2F] float32 with fp8 codes, else None
    down_scale: jax.Array | None  # [E, D] float32 with fp8 codes, else None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MoEWeights:
    """One layer's mixture of experts (its branch input norm included)."""

    norm: jax.Array  # [D]
    router: jax.Array  # [D, experts * expert_groups] float32
    routed: ExpertWeights  # E = experts, F = expert_d_ff
    shared: ExpertWeights | None  # E = 1, F = shared_experts * expert_d_ff; None without a shared expert


# --------------------------------------------------------------------------- weights


# Jitted, XLA fuses the quantization's elementwise steps: op by op, each would leave a float32
# temporary of the whole expert tensor.
_quantize = jax.jit(fp8.quantize_rows)  # one scale per expert and output channel


def _experts(config: ModelConfig, gate_up: jax.Array, down: jax.Array) -> ExpertWeights:
    if config.expert_dtype == "fp8":
        (gate_up, gate_up_scale), (down, down_scale) = _quantize(gate_up), _quantize(down)
        return ExpertWeights(gate_up, down, gate_up_scale, down_scale)
    return ExpertWeights(gate_up, down, None, None)


def init_layer(config: ModelConfig, seed: int, layer: int) -> MoEWeights:
    """Layer `layer`'s MoE weights: normal with 1/fan_in variance, drawn in config.dtype (fp8
    experts quantized from those draws), the norm at 1. One layer at a time, so a large model
    never holds more than one layer's experts in a wider dtype."""
    c = config
    D, E, F, S = c.d_model, c.experts, c.expert_d_ff, c.shared_experts * c.expert_d_ff
    specs = {
        "router": ((D, E * c.expert_groups), D),
        "w_gate_up": ((E, 2 * F, D), D),
        "w_down": ((E, D, F), F),
    }
    if S:
        specs.update(shared_gate_up=((1, 2 * S, D), D), shared_down=((1, D, S), S))
    w = init_normal(seed, specs, c.dtype, stream=(_STREAM, layer))
    return MoEWeights(
        norm=ones((D,), c.dtype),
        router=w["router"].astype(jnp.float32),
        routed=_experts(c, w["w_gate_up"], w["w_down"]),
        shared=_experts(c, w["shared_gate_up"], w["shared_down"]) if S else None,
    )


def feed_forward_weights(config: ModelConfig, seed: int, drawn: dict[str, jax.Array]) -> tuple[dict, ...]:
    """Per layer, the fields {"mlp": layers.MLPWeights | None, "moe": MoEWeights | None} of its
    feed-forward branch: the dense MLP from `drawn` (the family's draw of layers.mlp_specs, [L, ...]
    each) when the config has no experts, else the MoE (init_layer)."""
    L, D = config.num_layers, config.d_model
    if config.experts:
        return tuple(dict(mlp=None, moe=init_layer(config, seed, i)) for i in range(L))
    return tuple(
        dict(mlp=layers.MLPWeights(ones((D,), config.dtype), drawn["w_gate"][i], drawn["w_up"][i],
                                   drawn["w_down"][i]), moe=None)
        for i in range(L)
    )


# --------------------------------------------------------------------------- forward


def feed_forward(config: ModelConfig, w: Any, x: jax.Array) -> jax.Array:
    """The feed-forward branch of a layer whose weights `w` hold `mlp` and `moe` (one of them
    None): moe(config, w.moe, x) when the config has experts, else the dense SwiGLU. -> [..., D]."""
    if config.experts:
        return moe(config, w.moe, x)
    return layers.mlp(w.mlp, x, config.norm_eps)


def add_feed_forward(config: ModelConfig, w: Any, x: jax.Array) -> jax.Array:
    """x + feed_forward(config, w, x): the second residual branch of every family's layer,
    decode and prefill alike, under the named scope "mlp"."""
    with jax.named_scope("mlp"):
        return x + feed_forward(config, w, x)


def route(config: ModelConfig, router: jax.Array, h: jax.Array) -> RoutedPairs:
    """h [T, D] -> RoutedPairs: the chosen global expert ids [T, k] int32, their routing weights
    [T, k] float32, and the T k (token, choice) pairs grouped by local expert (chosen mod
    experts: order, inverse, group_sizes), by config.routing_implementation.

    Sigmoid scores in float32 at full precision (on GPUs XLA's default would round the float32
    operands to TF32), the k best as lax.top_k picks them (equal scores: the lower id first),
    weights = the chosen scores over their sum (left to right), times routed_scaling:
    hisparse_jax.moe_route's contract, the same bits for "count", "sort" and "fused".
    """
    # One float32 dot here (XLA:CPU compiles it as one fusion). On an H200 XLA's autotuner makes it
    # a split-K GEMM plus a partial-sum fusion at 6-9x its bytes (BENCHMARKS.md, weights/FFN at
    # 128K): [b, D] x [D, E] at HIGHEST has too few output tiles to spread D x E x 4 bytes over the
    # SMs, and no tensor cores. Same-numerics alternatives: benchmarks/projection_bench.py.
    logits = layers.weight_einsum("...d,de->...e", h.astype(jnp.float32), router.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    scores = jax.nn.sigmoid(logits).reshape(-1, router.shape[-1])
    k, E, scaling = config.experts_per_token, config.experts, config.routed_scaling
    if config.routing_implementation == "fused":  # one custom call (its XLA reference elsewhere)
        return route_experts(scores, k, E, scaling)
    return route_experts_reference(scores, k, E, scaling, counting=config.routing_implementation == "count")


def swiglu_experts(config: ModelConfig, w: ExpertWeights, rows: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """rows [M, D] sorted by expert, group_sizes [E] int32 -> [M, D] float32: each row through
    its expert's SwiGLU (the activation in float32, cast to config.dtype for the down matmul)."""
    impl = config.expert_implementation
    gate_up = grouped_matmul(rows, w.w_gate_up, group_sizes, w.gate_up_scale, implementation=impl)  # [M, 2F]
    F = w.w_down.shape[-1]
    act = (jax.nn.silu(gate_up[:, :F]) * gate_up[:, F:]).astype(config.dtype)
    return grouped_matmul(act, w.w_down, group_sizes, w.down_scale, implementation=impl)


def _expert_dot(x: jax.Array, weight: jax.Array, scale: jax.Array | None) -> jax.Array:
    """x [T, K] times one expert's weight [1, N, K] (fp8 codes widened inside the dot: exact)
    -> [T, N] float32, times its output channels' scale [1, N] (fp8) after the sum."""
    w = weight[0].astype(x.dtype)
    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None  # no TF32 on GPUs
    y = layers.weight_einsum("...k,nk->...n", x, w, precision=precision, preferred_element_type=jnp.float32)
    return y if scale is None else y * scale[0]


def dense_swiglu(config: ModelConfig, w: ExpertWeights, h: jax.Array) -> jax.Array:
    """One expert (E = 1: the shared expert) over every row of h [T, D] as XLA matmuls -> [T, D]
    float32, the activation as swiglu_experts'. XLA sums in its own order: within rounding of the
    grouped matmul, not bit for bit; every decode mode runs the same program."""
    gate_up = _expert_dot(h, w.w_gate_up, w.gate_up_scale)  # [T, 2F]
    F = w.w_down.shape[-1]
    act = (jax.nn.silu(gate_up[:, :F]) * gate_up[:, F:]).astype(config.dtype)
    return _expert_dot(act, w.w_down, w.down_scale)


def moe(config: ModelConfig, w: MoEWeights, x: jax.Array) -> jax.Array:
    """The MoE branch of a layer: x [..., D] (decode [b, D], prefill [b, T, D]) -> [..., D] in x.dtype.

    Every token of x is routed on its own (the leading axes are flattened).
    """
    c = config
    T, k = x.size // x.shape[-1], c.experts_per_token
    h = layers.rms_norm(x.reshape(T, x.shape[-1]), w.norm, c.norm_eps)
    _, weights, order, inverse, group_sizes = route(c, w.router, h)
    sorted_out = swiglu_experts(c, w.routed, jnp.take(h, order // k, axis=0), group_sizes)  # [T k, D] f32
    per_choice = jnp.take(sorted_out, inverse, axis=0).reshape(T, k, -1)
    y = weights[:, 0, None] * per_choice[:, 0]
    for j in range(1, k):  # choice order, float32: a fixed sum
        y = y + weights[:, j, None] * per_choice[:, j]
    # The shared expert in a launch of its own. As more experts of the routed launch it ran slower
    # on an H200 from batch 10 up (its 8-41 rows take more passes than a routed expert's few, and
    # the launch waits for them; grouped_matmul_bench --slices, E = 33): only at batch 1-2 was
    # that faster, by 6-9 us a layer.
    if w.shared is not None and c.shared_expert_implementation == "dot":
        y = y + dense_swiglu(c, w.shared, h)
    elif w.shared is not None:
        y = y + swiglu_experts(c, w.shared, h, jnp.full((1,), T, jnp.int32))
    return y.astype(x.dtype).reshape(x.shape)


def expected_active_experts(experts: int, pairs: int) -> float:
    """Expected local experts with at least one of `pairs` (token, expert) pairs under uniform
    routing: E (1 - (1 - 1/E)^pairs). A decode step of batch b reads about this many experts
    with pairs = b x experts_per_token (see the module docstring)."""
    if not is_positive_int(experts):
        raise ValueError(f"expected_active_experts: experts must be a positive int, got {experts!r}")
    if isinstance(pairs, bool) or not isinstance(pairs, (int, np.integer)) or pairs < 0:
        raise ValueError(f"expected_active_experts: pairs must be an int >= 0, got {pairs!r}")
    return experts * (1.0 - (1.0 - 1.0 / experts) ** pairs)

"""The mixture-of-experts branch (hisparse_jax.models.moe), DSA's query LoRA and the weight-bytes
account: moe() against a NumPy oracle, routing corner cases, every family decoding an MoE model
alike in "hisparse" and "device" mode, config errors, weight_bytes by component.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import FEW_LAYERS, assert_bitwise_equal

from hisparse_jax.models import dsa, layers, mla, moe
from hisparse_jax.models.weights import COMPONENTS, weight_bytes

BF16 = np.dtype(jnp.bfloat16)
# A small MoE: 4 local experts of 2 GPUs (8 routed in all), 2 per token, one shared expert.
MOE = dict(experts=4, experts_per_token=2, expert_d_ff=16, shared_experts=1, expert_groups=2, routed_scaling=2.5)


def _config(**overrides):
    return dsa.Config.tiny(**{**MOE, **overrides})


def _f64(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


# --------------------------------------------------------------------------- a NumPy oracle


def _dequantized(w: moe.ExpertWeights):
    """The experts' exact values [E, N, K] in float64: fp8 codes times their scale."""
    mats = []
    for codes, scale in ((w.w_gate_up, w.gate_up_scale), (w.w_down, w.down_scale)):
        mats.append(_f64(codes) * (_f64(scale)[..., None] if scale is not None else 1.0))
    return mats


def _oracle_expert(config, w: moe.ExpertWeights, e: int, h: np.ndarray) -> np.ndarray:
    """Expert e's SwiGLU of one row h [D] in float64; the activation rounded to config.dtype, as
    the down projection receives it."""
    gate_up, down = _dequantized(w)
    F = down.shape[-1]
    y = gate_up[e] @ h
    gate, up = y[:F], y[F:]
    act = gate / (1.0 + np.exp(-gate)) * up
    return down[e] @ act.astype(config.dtype).astype(np.float64)


def oracle_moe(config, w: moe.MoEWeights, x) -> tuple[np.ndarray, np.ndarray]:
    """moe() from its definition, token by token: (y [..., D] float64 before the final rounding,
    chosen global experts [T, k]). Asserts no token's k-th and (k+1)-th score are within 1e-4
    (else rounding could pick different experts and the comparison would not be about the MoE)."""
    x64 = _f64(x).reshape(-1, x.shape[-1])
    norm = _f64(w.norm)
    h = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + config.norm_eps) * norm
    h = h.astype(config.dtype).astype(np.float64)  # the experts read h in the model dtype
    scores = 1.0 / (1.0 + np.exp(-(h @ _f64(w.router))))
    k, E = config.experts_per_token, config.experts
    out, chosen = np.zeros_like(x64), np.zeros((len(h), k), np.int64)
    for t in range(len(h)):
        order = np.argsort(-scores[t], kind="stable")  # equal scores: the lower id first
        chosen[t] = order[:k]
        if k < len(order):
            assert scores[t, order[k - 1]] - scores[t, order[k]] > 1e-4, "test data with a near tie"
        top = scores[t, chosen[t]]
        for j, expert in enumerate(chosen[t]):
            out[t] += top[j] / top.sum() * config.routed_scaling * _oracle_expert(config, w.routed, expert % E, h[t])
        if w.shared is not None:
            out[t] += _oracle_expert(config, w.shared, 0, h[t])
    return out.reshape(x.shape), chosen


def _tolerance(config, want: np.ndarray) -> float:
    """Absolute tolerance of moe() against the oracle, relative to the largest output.

    Both see the same operand values (h rounded to the model dtype, the fp8 codes' exact values,
    so fp8 adds no error of its own); they differ by float32 against float64 accumulation over
    D = 64 and F = 16 terms (~1e-6 relative; 1e-5 allowed) and, in bfloat16, by the rounding of
    the output (half an ulp, 2^-9 relative) and of activations lying within ~1e-6 of a rounding
    midpoint (one ulp of one activation: far below 2^-9 of the output). 2^-7 covers bfloat16
    with room.
    """
    bound = np.abs(want).max()
    return (2.0**-7 if config.dtype == BF16 else 1e-5) * bound


@functools.cache
def _jitted(config):
    return jax.jit(functools.partial(moe.moe, config))


@pytest.mark.parametrize(
    "dtype, expert_dtype, shape, shared",
    [("float32", None, (3, 64), "grouped"), ("float32", "fp8", (2, 3, 64), "grouped"),
     ("bfloat16", None, (3, 64), "grouped"), ("bfloat16", "fp8", (2, 3, 64), "grouped"),
     ("float32", None, (3, 64), "dot"), ("bfloat16", "fp8", (2, 3, 64), "dot"), ("bfloat16", "fp8", (1, 64), "dot")],
    ids=["f32-decode", "f32-fp8-prefill", "bf16-decode", "bf16-fp8-prefill", "f32-decode-shared-dot",
         "bf16-fp8-prefill-shared-dot", "bf16-fp8-one-row-shared-dot"],
)
def test_moe_matches_a_numpy_oracle(dtype, expert_dtype, shape, shared):
    """Either implementation of the shared expert: the grouped matmul of one expert, or XLA's dots
    (moe.dense_swiglu, a single row through layers.weight_einsum)."""
    config = _config(dtype=dtype, expert_dtype=expert_dtype, shared_expert_implementation=shared)
    w = moe.init_layer(config, 0, 0)
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), config.dtype)
    got = _jitted(config)(w, x)
    assert got.shape == x.shape and got.dtype == x.dtype
    want, chosen = oracle_moe(config, w, x)
    h = jax.jit(lambda x: layers.rms_norm(x.reshape(-1, 64), w.norm, config.norm_eps))(x)
    np.testing.assert_array_equal(np.asarray(moe.route(config, w.router, h)[0]), chosen)
    np.testing.assert_allclose(_f64(got), want, rtol=0, atol=_tolerance(config, want))
    if expert_dtype == "fp8":
        assert w.routed.w_gate_up.dtype == jnp.float8_e4m3fn and w.routed.gate_up_scale.dtype == jnp.float32
        assert w.shared.w_down.dtype == jnp.float8_e4m3fn and w.shared.down_scale.shape == (1, 64)
    assert w.router.dtype == jnp.float32 and w.router.shape == (64, 8)


# --------------------------------------------------------------------------- routing corner cases


def _router(config, columns) -> jax.Array:
    """A router whose logit for expert c is columns[c] x mean(h): exactly columns[c] for h of ones
    (c / 64 and its partial sums are exact in float32)."""
    return jnp.asarray(np.tile(np.asarray(columns, np.float32) / config.d_model, (config.d_model, 1)))


def test_ties_go_to_the_lower_expert_id():
    config = _config(experts_per_token=3)
    h = jnp.ones((5, config.d_model), jnp.float32)
    # Scores by id: 3 at ids 2 and 4, then 2 at ids 3 and 5: the third choice is id 3.
    chosen, weights, *_ = moe.route(config, _router(config, [0, 1, 3, 2, 3, 2, -1, 0]), h)
    np.testing.assert_array_equal(np.asarray(chosen), np.broadcast_to([2, 4, 3], (5, 3)))
    s = 1 / (1 + np.exp(-np.array([3.0, 3.0, 2.0])))
    np.testing.assert_allclose(np.asarray(weights), np.broadcast_to(s / s.sum() * 2.5, (5, 3)), rtol=1e-6)
    # All scores equal: the k lowest ids, equal weights.
    chosen, weights, *_ = moe.route(config, jnp.zeros((config.d_model, 8), jnp.float32), h)
    np.testing.assert_array_equal(np.asarray(chosen), np.broadcast_to([0, 1, 2], (5, 3)))
    np.testing.assert_allclose(np.asarray(weights), 2.5 / 3, rtol=1e-6)


def test_every_expert_chosen_when_experts_per_token_is_all_of_them():
    config = _config(experts_per_token=8)  # experts x expert_groups = 4 x 2
    w = moe.init_layer(config, 0, 0)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 64)), jnp.float32)
    want, chosen = oracle_moe(config, w, x)
    np.testing.assert_array_equal(np.sort(chosen, axis=1), np.broadcast_to(np.arange(8), (3, 8)))
    np.testing.assert_allclose(_f64(_jitted(config)(w, x)), want, rtol=0, atol=_tolerance(config, want))


def test_choices_of_other_gpus_run_on_the_local_expert_mod_experts():
    """With 2 GPUs' experts (ids 0-7 over 4 local experts), choices 1 and 5 both run local
    expert 1: the output is routed_scaling x expert 1, as a 1-GPU model routing to expert 1 alone."""
    grouped = _config(shared_experts=0)
    w = moe.init_layer(grouped, 0, 0)
    w = dataclasses.replace(w, router=_router(grouped, [0, 5, 1, 2, 0, 4, 3, 1]))
    x = jnp.ones((4, 64), jnp.float32)  # rms_norm(x) is within 1e-6 of ones: logits within 1e-5 of the columns
    np.testing.assert_array_equal(np.asarray(moe.route(grouped, w.router, x)[0]), np.broadcast_to([1, 5], (4, 2)))
    single = _config(shared_experts=0, expert_groups=1, experts_per_token=1)
    alone = dataclasses.replace(w, router=_router(single, [0, 1, 0, 0]))
    a, b = np.asarray(_jitted(grouped)(w, x)), np.asarray(_jitted(single)(alone, x))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max())  # weights 1/(1+r) + r/(1+r) = 1
    assert np.abs(b).max() > 0


def test_expected_active_experts():
    # Exact expectation of distinct experts among `pairs` uniform draws, by enumeration.
    for E, pairs in ((3, 3), (4, 2), (1, 5), (5, 0)):
        outcomes = list(itertools.product(range(E), repeat=pairs))
        exact = np.mean([len(set(o)) for o in outcomes]) if pairs else 0.0
        assert moe.expected_active_experts(E, pairs) == pytest.approx(exact, rel=1e-12)
    assert moe.expected_active_experts(32, 10_000) == pytest.approx(32)
    for experts, pairs, name in ((0, 1, "experts"), (4, -1, "pairs"), (4, 1.5, "pairs"), (True, 1, "experts")):
        with pytest.raises(ValueError, match=f"expected_active_experts: {name} must be"):
            moe.expected_active_experts(experts, pairs)


# --------------------------------------------------------------------------- every family with experts

# Per family: the MoE model decoded in both modes. NSA and Quest run bfloat16 with fp8 experts (the
# GPU kernel's operands); DSA runs float32 with float32 experts and the query LoRA (XLA:CPU cannot
# run DSA's bfloat16 prefill: its absorbed query is a batched bf16 x bf16 -> f32 matmul its
# DotThunk lacks, whatever the MLP).
FAMILY_MOE = {
    "dsa": dict(dtype="float32", q_lora_rank=16),
    "nsa": dict(dtype="bfloat16", expert_dtype="fp8"),
    "quest": dict(dtype="bfloat16", expert_dtype="fp8"),
}


def test_an_moe_model_decodes_alike_in_hisparse_and_device_mode(case):
    config = case.config(**MOE, **FAMILY_MOE[case.family], **FEW_LAYERS[case.family])
    hisparse = case.run(config, "hisparse")
    assert_bitwise_equal(hisparse, case.run(config, "device"))
    assert hisparse.misses.any(), "nothing evicted: the comparison would not exercise the hot buffer"
    weights = case.weights(config)
    assert all(layer.mlp is None and layer.moe is not None for layer in weights.layers)
    if case.family == "dsa":
        assert all(layer.w_q is None and layer.w_q_b.shape == (16, 4, 24) for layer in weights.layers)


def test_dsa_query_lora_matches_a_numpy_oracle():
    config = dsa.Config.tiny(q_lora_rank=16)
    layer = dsa.init_weights(config, 0).layers[0]
    assert layer.w_q is None and layer.w_q_a.shape == (64, 16) and layer.q_norm.shape == (16,)
    rng = np.random.default_rng(4)
    h, pos = rng.standard_normal((3, 64)).astype(np.float32), np.array([0, 7, 100], np.int32)
    got = np.asarray(jax.jit(lambda h, p: mla.query(config, layer, h, p))(h, pos))
    latent = h @ _f64(layer.w_q_a)
    latent = latent / np.sqrt(np.mean(latent**2, -1, keepdims=True) + config.norm_eps) * _f64(layer.q_norm)
    q = np.einsum("br,rhe->bhe", latent, _f64(layer.w_q_b))
    dn, half = config.qk_nope_dim, config.qk_rope_dim // 2
    angle = pos[:, None, None] * config.rope_theta ** (-np.arange(half) / half)
    x1, x2 = q[..., dn : dn + half], q[..., dn + half :]
    rope = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
    want = np.concatenate([np.einsum("bhn,hnc->bhc", q[..., :dn], _f64(layer.w_uk)), rope], -1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(experts=4, experts_per_token=9, expert_d_ff=16, expert_groups=2), "experts_per_token"),
        (dict(shared_experts=1), "shared_experts"),  # an MoE field with experts=0
        (dict(expert_dtype="fp8"), "expert_dtype"),
        (dict(experts=4, experts_per_token=2, expert_d_ff=16, expert_dtype="int8"), "expert_dtype"),
        (dict(experts=4, experts_per_token=2, expert_d_ff=0), "expert_d_ff"),
        (dict(experts=-1), "experts"),
        (dict(experts=4, experts_per_token=2, expert_d_ff=16, shared_expert_implementation="cublas"),
         "shared_expert_implementation"),
        (dict(shared_expert_implementation="dot"), "shared_expert_implementation"),  # experts=0
        (dict(q_lora_rank=-1), "q_lora_rank"),
    ],
)
def test_bad_moe_fields_name_the_field_in_one_line(overrides, field):
    with pytest.raises(ValueError, match=rf"^Config\.{field}\b") as err:
        dsa.Config.tiny(**overrides)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- weight bytes


def _nbytes(tree) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def test_weight_bytes_by_component(case):
    """The parts of the dense and of the MoE model of each family (the configs of the other tests:
    their weights are cached), against the bytes of the arrays and formulas by component."""
    dense = case.config()
    parts = weight_bytes(case.family, dense)
    assert set(parts) == {*COMPONENTS, "total"} and parts["total"] == sum(parts[c] for c in COMPONENTS)
    assert parts["total"] == _nbytes(case.weights(dense))
    D, V = dense.d_model, dense.vocab
    assert parts["embeddings"] == (2 * V * D + D) * 4
    assert parts["dense MLP"] == dense.num_layers * (3 * D * dense.d_ff + D) * 4
    assert parts["attention"] > 0 and parts["routed experts"] == parts["shared experts"] == 0
    assert (parts["indexer"] > 0) == (case.family != "quest")

    experts = case.config(**MOE, **FAMILY_MOE[case.family], **FEW_LAYERS[case.family])
    parts = weight_bytes(case.module, experts)
    assert parts["total"] == _nbytes(case.weights(experts)) == sum(parts[c] for c in COMPONENTS)
    L, E, F, G, item = experts.num_layers, 4, 16, 2, experts.dtype.itemsize
    fp8 = experts.expert_dtype == "fp8"
    # Codes of 1 byte with float32 scales per output channel (fp8), or weights in dtype; the
    # float32 router; the norm in dtype.
    matrices = lambda n: 3 * n * F * D * (1 if fp8 else item) + ((n * 2 * F + n * D) * 4 if fp8 else 0)
    assert parts["routed experts"] == L * (matrices(E) + D * E * G * 4 + D * item)
    assert parts["shared experts"] == L * matrices(1)
    assert parts["dense MLP"] == 0 and parts["embeddings"] == (2 * V * D + D) * item
    assert weight_bytes(case.family, dataclasses.replace(experts, shared_experts=0))["shared experts"] == 0


def test_weight_bytes_allocates_nothing():
    """A realistic MoE slice (tens of GB of experts) is counted from shapes alone."""
    config = dsa.Config.realistic(experts=256, experts_per_token=8, expert_d_ff=2048, shared_experts=1,
                                  expert_dtype="fp8", q_lora_rank=1536, num_layers=8)
    parts = weight_bytes("dsa", config)
    D, F = config.d_model, 2048
    assert parts["routed experts"] == 8 * (256 * 3 * F * D + 256 * (2 * F + D) * 4 + D * 256 * 4 + D * 2)
    assert parts["shared experts"] == 8 * (3 * F * D + (2 * F + D) * 4)
    assert parts["attention"] > 0 and parts["indexer"] > 0 and parts["dense MLP"] == 0
    assert parts["total"] == sum(parts[c] for c in COMPONENTS) > 24 * 2**30

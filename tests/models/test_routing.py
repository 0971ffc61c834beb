"""The MoE's routing by comparison counts (hisparse_jax.models.routing) against the sort-based form
it replaces at decode sizes: the same expert ids, the same score bits and the same pair grouping,
ties and non-finite scores included; the MoE's output bit for bit with either form; no sort left
in the compiled decode-size program; the size rule and the config field's error.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_jax as hs
from hisparse_jax import targets
from hisparse_jax.models import dsa, moe, routing

MOE = dict(experts=4, experts_per_token=2, expert_d_ff=16, shared_experts=1, expert_groups=2, routed_scaling=2.5)


@functools.cache
def _top_k(k: int, counting: bool):
    return jax.jit(functools.partial(routing.top_k, k=k, counting=counting))


@functools.cache
def _group(experts: int, counting: bool):
    return jax.jit(functools.partial(routing.group_pairs, experts=experts, counting=counting))


def _assert_same_top_k(scores: np.ndarray, k: int) -> None:
    got_values, got_ids = _top_k(k, True)(scores)
    want_values, want_ids = _top_k(k, False)(scores)
    np.testing.assert_array_equal(np.asarray(got_ids), np.asarray(want_ids))
    # Bits, not values: NaN == NaN and -0 != +0 here.
    got_values, want_values = np.asarray(got_values), np.asarray(want_values)
    as_bits = f"u{got_values.dtype.itemsize}"
    np.testing.assert_array_equal(got_values.view(as_bits), want_values.view(as_bits))
    assert got_ids.dtype == jnp.int32


def _assert_same_groups(local: np.ndarray, experts: int) -> None:
    got = _group(experts, True)(jnp.asarray(local, jnp.int32))
    want = _group(experts, False)(jnp.asarray(local, jnp.int32))
    for name, g, w in zip(("order", "inverse", "group_sizes"), got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
        assert g.dtype == jnp.int32, name


# --------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("tokens, scores, k", [(1, 8, 1), (3, 8, 8), (17, 256, 8), (2, 256, 8), (4, 33, 5)])
def test_counted_top_k_is_lax_top_k_on_random_scores(tokens, scores, k):
    rng = np.random.default_rng(tokens * 1000 + scores)
    _assert_same_top_k(rng.random((tokens, scores), np.float32), k)


def test_counted_top_k_breaks_ties_like_lax_top_k():
    """Scores on a coarse grid (many equal) and whole rows equal: the lower id first."""
    rng = np.random.default_rng(7)
    coarse = (rng.integers(0, 4, (6, 64)) / 4).astype(np.float32)
    coarse[0] = 0.5  # one row all equal: ids 0..k-1
    _assert_same_top_k(coarse, 8)
    ids = np.asarray(_top_k(8, True)(coarse)[1])
    np.testing.assert_array_equal(ids[0], np.arange(8))


def test_counted_top_k_orders_non_finite_scores_like_lax_top_k():
    """lax.top_k's total order: -NaN < -inf < finite < +inf < +NaN, and -0 < +0."""
    row = np.array([1.0, np.nan, 2.0, -np.nan, np.inf, -0.0, 0.0, -np.inf, 0.5, np.nan], np.float32)
    _assert_same_top_k(np.stack([row, -row, row[::-1]]), 10)
    _assert_same_top_k(np.stack([row, -row]), 3)


def test_counted_top_k_orders_nan_payloads_and_subnormals_like_lax_top_k():
    """Bit patterns lax.top_k tells apart: NaN payloads of both signs (signalling ones too),
    subnormals of both signs, next to ordinary values."""
    bits = np.array([0x7FC00001, 0x7FC00000, 0x7F800001, 0xFFC00001, 0xFF800002, 1, 0x80000001, 0x00800000,
                     0x3F800000, 0xBF800000, 0, 0x80000000], np.uint32)
    row = bits.view(np.float32)
    _assert_same_top_k(np.stack([row, row[::-1]]), 12)
    _assert_same_top_k(np.stack([row, row[::-1]]), 5)


def test_counted_top_k_at_the_deployments_shape_with_ties_and_nans():
    """4 tokens of 256 scores, 8 choices (glm5-h200's router where the top-k is counted), on a
    coarse grid with NaNs and infinities: the shape at which XLA may pick another top-k kernel."""
    rng = np.random.default_rng(11)
    scores = (rng.integers(0, 16, (4, 256)) / 16).astype(np.float32)
    scores[1, [3, 200]] = np.nan
    scores[2, 7] = np.inf
    scores[3, :] = 0.25
    _assert_same_top_k(scores, 8)


def test_other_score_dtypes_take_lax_top_k_and_k_is_checked():
    """bfloat16 is counted (exact widening); int32 (not orderable by a float32 key) goes to
    lax.top_k; a k beyond the row is refused in one line, as lax.top_k refuses it."""
    rng = np.random.default_rng(5)
    _assert_same_top_k(jnp.asarray(rng.standard_normal((3, 64)), jnp.bfloat16), 8)
    ints = np.array([[16777216, 16777217, 3, 16777217]], np.int32)  # apart as ints, equal as float32
    np.testing.assert_array_equal(np.asarray(routing.top_k(ints, 2, counting=True)[1]), [[1, 3]])
    with pytest.raises(ValueError, match=r"^routing\.top_k: k must be in \[0, 4\]") as err:
        routing.top_k(jnp.zeros((2, 4), jnp.float32), 5, counting=True)
    assert "\n" not in str(err.value)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, float("inf"), float("-inf"), float("nan")]),
                min_size=12, max_size=12),
       st.integers(1, 12))
def test_counted_top_k_matches_on_drawn_rows(values, k):
    _assert_same_top_k(np.asarray(values, np.float32)[None], k)


# --------------------------------------------------------------------------- grouping


@pytest.mark.parametrize("local, experts", [
    ([0], 1),
    ([3, 3, 3, 3], 4),  # every pair on one expert: pair order
    ([3, 2, 1, 0], 4),  # every pair on its own expert: reversed
    ([1, 0, 1, 0, 2, 2, 0], 5),  # experts 3 and 4 empty
])
def test_counted_grouping_is_the_stable_argsort_on_named_cases(local, experts):
    _assert_same_groups(np.asarray(local), experts)


@pytest.mark.parametrize("pairs, experts", [(16, 32), (136, 32), (512, 32), (9, 3)])
def test_counted_grouping_is_the_stable_argsort_on_random_pairs(pairs, experts):
    local = np.random.default_rng(pairs).integers(0, experts, pairs)
    _assert_same_groups(local, experts)
    order, inverse, sizes = (np.asarray(a) for a in _group(experts, True)(jnp.asarray(local, jnp.int32)))
    np.testing.assert_array_equal(order[inverse], np.arange(pairs))  # inverse undoes order
    np.testing.assert_array_equal(sizes, np.bincount(local, minlength=experts))


def test_each_form_counts_up_to_its_limit_exactly():
    assert routing.top_k_counts(4, 256) and not routing.top_k_counts(5, 256)  # 4 x 256 x 256 = 2^18
    assert routing.top_k_counts(4096, 8) and not routing.top_k_counts(4097, 8)
    assert routing.grouping_counts(2048) and not routing.grouping_counts(2049)


# --------------------------------------------------------------------------- the MoE


@functools.cache
def _moe(config):
    return jax.jit(functools.partial(moe.moe, config))


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64), (1100, 64)],
                         ids=["both-counted", "both-counted-2d", "top-k-counted-grouping-sorted"])
def test_moe_output_is_the_same_bits_with_every_routing(shape):
    """The tiny config scores 8 experts, 2 choices a token: up to 1024 tokens both parts count;
    at 1100 the grouping (2200 pairs) sorts while the top-k still counts. "fused" is the custom
    call (hisparse_jax.moe_route) where a handler is registered, else its XLA reference."""
    count = dsa.Config.tiny(**MOE, dtype="bfloat16", expert_dtype="fp8")
    w = moe.init_layer(count, 0, 0)
    x = jnp.asarray(np.random.default_rng(3).standard_normal(shape), count.dtype)
    want = np.asarray(_moe(count)(w, x))
    for other in ("sort", "fused"):
        config = dsa.Config.tiny(**MOE, dtype="bfloat16", expert_dtype="fp8", routing_implementation=other)
        np.testing.assert_array_equal(np.asarray(_moe(config)(w, x)).view(np.uint16), want.view(np.uint16), err_msg=other)


@pytest.mark.skipif(not hs.has_ffi(), reason="no FFI handler on this backend")
def test_fused_routing_is_one_custom_call_and_no_sort():
    config = dsa.Config.tiny(**MOE, routing_implementation="fused")
    for tokens in (3, 1100):
        w = moe.init_layer(config, 0, 0)
        x = jax.ShapeDtypeStruct((tokens, config.d_model), config.dtype)
        hlo = jax.jit(functools.partial(moe.moe, config)).lower(w, x).compile().as_text()
        assert hlo.count(f'custom_call_target="{targets.MOE_ROUTE}"') == 1
        assert _sorts(config, tokens) == 0


def _sorts(config, tokens: int) -> int:
    """Sorts in the compiled MoE of `tokens` rows."""
    w = moe.init_layer(config, 0, 0)
    x = jax.ShapeDtypeStruct((tokens, config.d_model), config.dtype)
    hlo = jax.jit(functools.partial(moe.moe, config)).lower(w, x).compile().as_text()
    # A sort instruction, or XLA:CPU's TopK custom call (it rewrites lax.top_k's sort into one).
    return sum(" sort(" in line or 'custom_call_target="TopK"' in line for line in hlo.splitlines())


def test_decode_sizes_compile_without_a_sort_and_large_sizes_keep_them():
    count = dsa.Config.tiny(**MOE)
    assert _sorts(count, 3) == 0
    assert _sorts(dsa.Config.tiny(**MOE, routing_implementation="sort"), 3) >= 2  # top-k and the argsort
    # 8 router scores: the top-k counts up to 4096 tokens; 2 pairs a token: the grouping sorts
    # from 1025 tokens (2050 pairs) on, and the top-k from 4097.
    assert _sorts(count, 1025) == 1
    assert _sorts(count, 4097) >= 2


def test_a_bad_routing_implementation_names_the_field():
    with pytest.raises(ValueError, match=r"^Config\.routing_implementation\b") as err:
        dsa.Config.tiny(**MOE, routing_implementation="radix")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^Config\.routing_implementation\b"):
        dsa.Config.tiny(routing_implementation="sort")  # an MoE field with experts=0

"""Quest only: page bounds, the indexer's upper bound, dense layers attending in place, Quest's own
config rules. What every family does is in test_families.py.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import CASES, STEPS

from hisparse_jax.bench.decode.capacity import account
from hisparse_jax.models import gqa, layers, paging, quest

CASE = CASES["quest"]


def test_page_bounds_are_the_key_max_and_min_of_each_sealed_page():
    config, state = CASE.config(), CASE.device_baseline().state
    pages = np.stack([np.asarray(a) for a in state.store.device_kv])[..., : config.head_dim]  # [Ls, b, kvh, R, P, hd]
    sealed = np.asarray(state.store.sealed)  # [b, kvh]
    want_sealed = (np.asarray(CASE.lengths) + STEPS) // config.page_size
    np.testing.assert_array_equal(sealed, np.broadcast_to(want_sealed[:, None], sealed.shape))
    held = np.arange(pages.shape[3]) < sealed[..., None]  # [b, kvh, R]
    for got, want in ((state.page_max, pages.max(-2)), (state.page_min, pages.min(-2))):
        got = np.stack([np.asarray(a) for a in got])
        np.testing.assert_array_equal(got[:, held], want[:, held])
    # Dense layers keep every page on device in every mode, sealed in step with the sparse ones.
    np.testing.assert_array_equal(np.asarray(state.dense_store.sealed), sealed)
    hisparse = CASE.run(config, "hisparse").state
    assert hisparse.dense_store.mode == "dense" and hisparse.dense_store.host_pool is None
    for a, b in zip(hisparse.dense_store.device_kv, state.dense_store.device_kv):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_dense_layers_attend_in_place_with_the_bits_of_a_gather():
    """A dense layer reads its whole KV buffer in place; gathering every sealed page first (what
    the dense layers did before) gives the same bits."""
    config, state = CASE.config(), CASE.device_baseline().state
    store, tail = state.dense_store, state.tail[0]
    pos = jnp.broadcast_to(state.lengths[:, None] - 1, store.sealed.shape)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((*store.sealed.shape, config.group_size, config.head_dim)), jnp.float32)
    split = gqa.split(config)
    in_place, _, _ = paging.selected_parts(store, 0, None, tail, pos, split)
    R = store.device_kv[0].shape[2]
    every = jnp.where(jnp.arange(R) < store.sealed[..., None], jnp.arange(R, dtype=jnp.int32), -1)
    device = dataclasses.replace(store, mode="device")
    located, device = paging.locate(device, 0, every)
    gathered, _, _ = paging.selected_parts(device, 0, located, tail, pos, split)
    assert in_place[0].keys.shape == gathered[0].keys.shape
    a = np.asarray(layers.attend(q, in_place, gqa.scale(config)))
    b = np.asarray(layers.attend(q, gathered, gqa.scale(config)))
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_dense_layer_kv_counts_as_kv_in_the_byte_account():
    arrays = account(quest, quest.Config.realistic(), 1, "hisparse").arrays
    assert arrays["dense_store.device_kv[0]"][:2] == ("device", "kv records")
    assert arrays["page_max[0]"][1] == arrays["page_min[0]"][1] == "indexer metadata"
    assert arrays["store.host_pool"][:2] == ("host", "kv records")


def test_page_scores_are_quests_upper_bound():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # [b, kvh, G, hd]
    a, b = rng.standard_normal((2, 2, 3, 5, 8)).astype(np.float32)
    hi, lo = np.maximum(a, b), np.minimum(a, b)  # [b, kvh, R, hd]
    want = np.maximum(q[:, :, :, None] * hi[:, :, None], q[:, :, :, None] * lo[:, :, None]).sum((-1, 2))
    got = quest.page_scores(jnp.asarray(q), jnp.asarray(hi), jnp.asarray(lo))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # An upper bound of every key's dot product (summed over the group) inside the page.
    keys = lo[:, :, :, None] + rng.random((2, 3, 5, 6, 8)).astype(np.float32) * (hi - lo)[:, :, :, None]
    dots = np.einsum("bhgk,bhrtk->bhrt", q, keys)
    assert (dots.max(-1) <= np.asarray(got) + 1e-5).all()


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=17, hot_slots=17), "top_k"),  # more pages than the context holds
        (dict(n_kv_heads=3), "n_kv_heads"),
        (dict(dense_layers=4), "dense_layers"),
        (dict(head_dim=15), "head_dim"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"Config\.{field}\b"):
        quest.Config.tiny(**overrides)

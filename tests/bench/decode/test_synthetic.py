"""Synthetic long-context states (no prefill) and trace-steered selection, per family."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode, layout
from hisparse_jax.selection import synthetic as traces
from hisparse_jax.bench.decode import synthetic
from hisparse_jax.models import get_family

FAMILIES = ["dsa", "quest", "nsa"]
CONTEXT, BATCH, STEPS = 100, 2, 4


def _config(name):
    return get_family(name).Config.tiny(max_context=128)


def test_a_hashed_block_has_the_values_of_the_full_array():
    full = synthetic.hashed((3, 5, 40, 2, 8), jnp.float32, 11)
    block = synthetic.hashed((3, 5, 7, 2, 8), jnp.float32, 11, full_shape=(3, 5, 40, 2, 8), offset_axis=2,
                             offset=jnp.uint32(30))
    np.testing.assert_array_equal(np.asarray(block), np.asarray(full[:, :, 30:37]))
    values = np.asarray(full)
    assert np.all(values != 0) and abs(values.mean()) < 0.1 and 0.9 < values.var() < 1.1
    assert len(np.unique(values)) > 0.99 * values.size


@pytest.mark.parametrize("name", FAMILIES)
def test_synthetic_states_hold_the_same_records_in_every_mode(name):
    family, config = get_family(name), _config(name)
    sealed = CONTEXT // config.page_size
    hs = synthetic.synthetic_state(family, config, BATCH, "hisparse", CONTEXT, chunk_bytes=4096)
    dev = synthetic.synthetic_state(family, config, BATCH, "device", CONTEXT)
    assert hs.store.host_pool.sharding.memory_kind == "pinned_host"
    pool = np.asarray(jax.device_get(jax.device_put(hs.store.host_pool, hs.store.host_pool.sharding.with_memory_kind("device"))))
    kv = np.stack([np.asarray(a) for a in dev.store.device_kv])
    np.testing.assert_array_equal(pool[..., :sealed, :, :], kv[..., :sealed, :, :])
    assert np.all(pool[..., :sealed, :, :] != 0)
    np.testing.assert_array_equal(np.asarray(hs.lengths), CONTEXT)
    np.testing.assert_array_equal(np.asarray(hs.store.sealed), sealed)
    np.testing.assert_array_equal(np.asarray(hs.store.cache.slot_record), -1)  # hot caches start empty
    dev_leaves = {leaf.path: leaf.value for leaf in layout.leaves(dev)}
    for leaf in layout.leaves(hs):
        if not leaf.path.split(".")[0].endswith("store") and jnp.issubdtype(leaf.value.dtype, jnp.floating):
            np.testing.assert_array_equal(np.asarray(leaf.value), np.asarray(dev_leaves[leaf.path]), err_msg=leaf.path)
            assert np.all(np.asarray(leaf.value) != 0), leaf.path


def _selections(family, config):
    layers, streams, records = family.selecting_layout(config, BATCH)
    trace = traces.TraceConfig.for_page_size(config.page_size)
    return traces.selections(trace, layers, streams, records, config.top_k, jnp.full((BATCH,), CONTEXT, jnp.int32),
                             STEPS, config.page_size)


@functools.cache
def _decode(name, mode, weights_seed=0, fetch=True):
    """Tokens, logits and misses of STEPS trace-steered steps from a synthetic state (cached)."""
    family, config = get_family(name), _config(name)
    weights = family.init_weights(config, weights_seed)
    state = synthetic.synthetic_state(family, config, BATCH, mode, CONTEXT)
    if not fetch:
        state = synthetic.without_fetch(state)
    first = jnp.arange(BATCH, dtype=jnp.int32)
    out = decode.generate(family, config, weights, state, first, STEPS, return_logits=True,
                          forced=decode.ForcedTrace(_selections(family, config)))
    state = out.state
    assert state.store.mode != "hisparse" or state.store.host_pool.sharding.memory_kind == "pinned_host"
    return np.asarray(out.tokens), np.asarray(out.logits), np.asarray(out.misses), state


@pytest.mark.parametrize("name", FAMILIES)
def test_trace_steered_decode_is_bitwise_equal_across_modes(name):
    t_h, l_h, m_h, _ = _decode(name, "hisparse")
    t_d, l_d, _, _ = _decode(name, "device")
    np.testing.assert_array_equal(t_h, t_d)
    np.testing.assert_array_equal(l_h, l_d)
    assert m_h.sum() > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_the_trace_not_the_indexer_decides_the_selection(name):
    """Other weights change the tokens, not the misses (the selection)."""
    _, l_0, m_0, _ = _decode(name, "hisparse")
    _, l_1, m_1, _ = _decode(name, "hisparse", weights_seed=1)
    assert not np.array_equal(l_0, l_1)
    np.testing.assert_array_equal(m_0, m_1)


def test_a_no_io_state_resolves_the_same_misses_without_copying():
    _, _, m_h, _ = _decode("dsa", "hisparse")
    _, _, m_q, quiet = _decode("dsa", "hisparse", fetch=False)
    np.testing.assert_array_equal(m_q, m_h)  # the selection follows the trace, not the tokens
    assert quiet.store.fetch is False
    np.testing.assert_array_equal(np.asarray(quiet.store.cache.hot), 0)  # nothing was copied in


def test_context_must_leave_room_to_decode():
    family, config = get_family("dsa"), _config("dsa")
    with pytest.raises(ValueError, match=r"context=128 must lie in \[1, Config.max_context - 1 = 127\]"):
        synthetic.synthetic_state(family, config, 1, "device", 128)


def test_an_unknown_integer_array_is_an_error_not_a_guess():
    family, config = get_family("dsa"), _config("dsa")
    real_init = family.init_state

    def init_state(config, batch, mode, sharding=None):
        state = real_init(config, batch, mode)
        return dataclasses.replace(state, index_keys=(jnp.zeros((2, 2), jnp.int32),))

    fake = type("fake_family", (), {"init_state": staticmethod(init_state)})
    with pytest.raises(ValueError, match=r"no fill rule for the integer array index_keys\[0\]"):
        synthetic.synthetic_state(fake, config, 1, "device", 10)

"""DSA model: every decode mode gives the same bits; selection; config errors.

The end-to-end runs (prefill of 3 ragged prompts, 64 greedy steps) come from
the session cache in conftest.py; comparisons have zero tolerance.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.models import common, dsa, get_family, known_families

STEPS = 64


def _assert_misses_most_steps(run, fraction=0.9):
    per_step = run.misses.sum(axis=(1, 2))
    assert (per_step > 0).mean() >= fraction, f"misses per step: {per_step}"


# --------------------------------------------------------------------------- hisparse == device


def test_hisparse_matches_device_while_evicting(make_config, decode_run, bitwise_equal):
    config = make_config()  # k = 8, B = 12
    hisparse, device = decode_run(config, "hisparse"), decode_run(config, "device")
    assert hisparse.tokens.shape == (STEPS, 3)
    bitwise_equal(hisparse, device)
    _assert_misses_most_steps(hisparse)
    assert hisparse.misses.shape == (STEPS, config.n_layers, 3)
    assert not device.misses.any()
    assert hisparse.pool_memory_kind == "pinned_host"
    np.testing.assert_array_equal(hisparse.lengths, np.array([37, 20, 5]) + STEPS)


def test_hisparse_matches_device_when_hot_slots_equal_top_k(make_config, decode_run, bitwise_equal):
    config = make_config(hot_slots=8)
    # "device" mode never reads hot_slots (no hot buffer), so the B = 12 device
    # run is the baseline of this config too; this saves two compilations.
    baseline = make_config()
    assert dataclasses.replace(baseline, hot_slots=config.top_k) == config
    hisparse = decode_run(config, "hisparse")
    bitwise_equal(hisparse, decode_run(baseline, "device"))
    _assert_misses_most_steps(hisparse)


def test_dense_equals_sparse_when_top_k_covers_the_context(decode_run, bitwise_equal):
    # k = B = every record a stream can hold: the sparse selection is every
    # sealed id in position order, i.e. exactly the dense selection.
    config = dsa.Config.tiny(n_layers=2, max_context=128, top_k=128, hot_slots=128)
    hisparse, dense = decode_run(config, "hisparse"), decode_run(config, "dense")
    bitwise_equal(hisparse, dense)
    # Nothing is ever evicted: step 0 fetches the prompt, then one new record per step.
    np.testing.assert_array_equal(hisparse.misses[0], np.broadcast_to([37, 20, 5], (2, 3)))
    assert (hisparse.misses[1:] == 1).all()


SHARED = dict(n_layers=4, index_share=2, page_size=2, top_k=8, hot_slots=8)


def test_shared_indexer_with_pages_matches_device(decode_run, bitwise_equal):
    config = dsa.Config.tiny(**SHARED)
    hisparse, device = decode_run(config, "hisparse"), decode_run(config, "device")
    bitwise_equal(hisparse, device)
    _assert_misses_most_steps(hisparse)


def test_layers_of_a_group_share_one_selection(prompts, weights):
    config = dsa.Config.tiny(**SHARED)
    w = weights(config)
    state = dsa.init_state(config, 3, "hisparse")
    state, logits = decode.prefill("dsa", config, w, state, *prompts)
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    step = jax.jit(functools.partial(dsa.decode_step_with_selection, config), donate_argnums=1)
    anchors_differ = False
    for _ in range(4):
        sealed = np.asarray(state.store.sealed)
        state, logits, _, selection = step(w, state, tokens)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        selection = np.asarray(selection)  # [L, b, k]
        assert selection.shape == (4, 3, config.top_k)
        np.testing.assert_array_equal(selection[0], selection[1])
        np.testing.assert_array_equal(selection[2], selection[3])
        anchors_differ |= not np.array_equal(selection[0], selection[2])
        _check_selection(selection, sealed, config.top_k)
    assert anchors_differ, "both anchors always selected the same pages"


def _check_selection(selection, sealed, k):
    """Valid ids first, ascending, distinct, < sealed; -1 padding only when sealed < k."""
    for row, n in zip(np.moveaxis(selection, 1, 0), sealed):
        for ids in row:
            valid = ids[ids >= 0]
            assert len(valid) == min(k, n)
            np.testing.assert_array_equal(ids[: len(valid)], valid)
            assert (np.diff(valid) > 0).all() and (valid < n).all()


# --------------------------------------------------------------------------- pieces


def test_prefill_ignores_tokens_past_each_length(make_config, weights, prompts):
    config = make_config()
    tokens, lengths = prompts
    other = jnp.where(jnp.arange(tokens.shape[1]) < lengths[:, None], tokens, (tokens + 7) % 256)
    outs = []
    for p in (tokens, other):
        state = dsa.init_state(config, 3, "device")
        outs.append(decode.prefill("dsa", config, weights(config), state, p, lengths))
    (s1, l1), (s2, l2) = outs
    for a, b in zip(jax.tree.leaves((s1, l1)), jax.tree.leaves((s2, l2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(s1.store.sealed), np.asarray(lengths))


def _topk_oracle(scores, sealed, k):
    order = sorted(range(sealed), key=lambda i: (-scores[i], i))[:k]
    return sorted(order) + [-1] * (k - len(order))


def test_select_topk_matches_oracle():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, (4, 32)).astype(np.float32)  # many ties: lower id wins
    sealed = np.array([0, 3, 17, 32], np.int32)
    got = np.asarray(common.select_topk(jnp.asarray(scores), jnp.asarray(sealed), 8))
    want = [_topk_oracle(s, n, 8) for s, n in zip(scores, sealed)]
    np.testing.assert_array_equal(got, want)


def test_dense_selection_is_every_sealed_id_in_order():
    got = np.asarray(common.dense_selection(jnp.array([0, 2, 5], jnp.int32), 5))
    np.testing.assert_array_equal(got, [[-1] * 5, [0, 1, -1, -1, -1], [0, 1, 2, 3, 4]])


def test_tail_and_page_bookkeeping():
    kv = jnp.arange(1 * 2 * 8 * 1, dtype=jnp.float32).reshape(1, 2, 8, 1) + 1
    pages, count, tail = common.prefill_pages(kv, jnp.array([5, 8], jnp.int32), 4)
    np.testing.assert_array_equal(np.asarray(count), [1, 2])
    np.testing.assert_array_equal(np.asarray(tail)[0, :, :, 0], [[5, 0, 0, 0], [0, 0, 0, 0]])
    assert pages.shape == (1, 2, 2, 4, 1)
    valid = np.asarray(common.tail_valid(jnp.array([5, 8], jnp.int32), 4))
    np.testing.assert_array_equal(valid, [[True, True, False, False], [True, False, False, False]])
    written = common.tail_write(tail[0], jnp.array([[9.0], [7.0]]), jnp.array([5, 8], jnp.int32))
    np.testing.assert_array_equal(np.asarray(written)[:, :, 0], [[5, 9, 0, 0], [7, 0, 0, 0]])


def test_sampling():
    logits = jnp.array([[0.0, 2.0, 2.0], [5.0, 1.0, 0.0]], jnp.float32)
    np.testing.assert_array_equal(np.asarray(common.next_tokens(logits, "greedy", None)), [1, 0])
    key = jax.random.key(3)
    a = common.next_tokens(jnp.zeros((4, 100)), "sample", key)
    b = common.next_tokens(jnp.zeros((4, 100)), "sample", key)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="sampling"):
        common.next_tokens(logits, "beam", key)


# --------------------------------------------------------------------------- configs


def test_presets():
    tiny, real = dsa.Config.tiny(), dsa.Config.realistic()
    assert (tiny.d_model, tiny.vocab, tiny.max_context) == (64, 256, 256)
    assert real.record_width == 576 and real.dtype == np.dtype(jnp.bfloat16)
    cache = real.cache_config(8)
    assert cache.record_bytes == 1152 and cache.stream_shape == (8,)
    assert cache.pool_records == real.max_context and cache.top_k <= cache.hot_slots
    assert dsa.Config.preset("tiny", top_k=4) == dsa.Config.tiny(top_k=4)
    hash(real)  # a static jit argument


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=40, hot_slots=32), "Config.top_k"),  # k > B
        (dict(top_k=300, hot_slots=300), "Config.top_k"),  # k > records of the context
        (dict(pool_records=128), "Config.max_context"),  # context beyond the pool
        (dict(page_size=3), "Config.page_size"),  # page size not dividing the context
        (dict(index_share=3), "Config.index_share"),
        (dict(n_heads=0), "Config.n_heads"),
        (dict(dtype="int32"), "Config.dtype"),
        (dict(kv_lora_rank=33, qk_rope_dim=8, dtype="bfloat16"), "Config.kv_lora_rank"),
        (dict(page_size=8, prefill_chunk=12), "Config.prefill_chunk"),
    ],
)
def test_bad_configs_fail_at_construction(overrides, field):
    with pytest.raises(ValueError, match=field):
        dsa.Config.tiny(**overrides)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny, realistic"):
        dsa.Config.preset("huge")
    with pytest.raises(ValueError, match="unknown field.*d_modle"):
        dsa.Config.tiny(d_modle=32)


def test_family_registry():
    assert get_family("dsa") is dsa and get_family(dsa) is dsa
    assert "dsa" in known_families()
    with pytest.raises(ValueError, match="unknown model family 'llama'.*dsa"):
        get_family("llama")


def test_generate_rejects_context_beyond_max_context(make_config, weights, prompts):
    config = make_config()
    state = dsa.init_state(config, 3, "hisparse")
    state, logits = decode.prefill("dsa", config, weights(config), state, *prompts)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    with pytest.raises(ValueError, match="max_context=256"):
        decode.generate("dsa", config, weights(config), state, first, 256 - 37 + 1)
    with pytest.raises(ValueError, match="fresh state"):
        decode.prefill("dsa", config, weights(config), state, *prompts)
    with pytest.raises(TypeError, match="Config"):
        decode.generate("dsa", object(), weights(config), state, first, 1)

"""The shared pieces models are built from: paged bookkeeping and sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.models import paging


def test_tail_and_page_bookkeeping():
    kv = jnp.arange(1 * 2 * 8 * 1, dtype=jnp.float32).reshape(1, 2, 8, 1) + 1
    pages, count, tail = paging.prefill_pages(kv, jnp.array([5, 8], jnp.int32), 4)
    np.testing.assert_array_equal(np.asarray(count), [1, 2])
    np.testing.assert_array_equal(np.asarray(tail)[0, :, :, 0], [[5, 0, 0, 0], [0, 0, 0, 0]])
    assert pages.shape == (1, 2, 2, 4, 1)
    valid = np.asarray(paging.tail_valid(jnp.array([5, 8], jnp.int32), 4))
    np.testing.assert_array_equal(valid, [[True, True, False, False], [True, False, False, False]])
    written = paging.tail_write(tail[0], jnp.array([[9.0], [7.0]]), jnp.array([5, 8], jnp.int32))
    np.testing.assert_array_equal(np.asarray(written)[:, :, 0], [[5, 9, 0, 0], [7, 0, 0, 0]])


def test_sampling():
    logits = jnp.array([[0.0, 2.0, 2.0], [5.0, 1.0, 0.0]], jnp.float32)
    np.testing.assert_array_equal(np.asarray(decode.next_tokens(logits, "greedy", None)), [1, 0])
    key = jax.random.key(3)
    a = decode.next_tokens(jnp.zeros((4, 100)), "sample", key)
    b = decode.next_tokens(jnp.zeros((4, 100)), "sample", key)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="sampling"):
        decode.next_tokens(logits, "beam", key)


def test_skip_indexer_selects_the_forced_ids_without_scoring():
    import types

    store = types.SimpleNamespace(mode="device", sealed=jnp.array([6, 6], jnp.int32))
    config = types.SimpleNamespace(top_k=2, implementation="reference")
    ids = jnp.array([[[0, 3], [1, -1]]], jnp.int32)  # [selectors, streams, k]

    def scores():
        raise AssertionError("skip_indexer computed the indexer's scores")

    forced = paging.ForcedSelection(ids, jnp.asarray(True), skip_indexer=True)
    np.testing.assert_array_equal(np.asarray(paging.select(config, store, scores, forced, 0)), ids[0])
    # Without skip_indexer the scores are computed (and the forced ids still win at run time).
    ranked = jnp.tile(jnp.arange(6, dtype=jnp.float32), (2, 1))
    forced = paging.ForcedSelection(ids, jnp.asarray(True))
    np.testing.assert_array_equal(np.asarray(paging.select(config, store, lambda: ranked, forced, 0)), ids[0])

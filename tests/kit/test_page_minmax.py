"""PageMinMax against NumPy: its running page bounds, Quest's bound as page scores, the byte
account its declared metadata gives, and training logits that see what decode sees."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import kit
from hisparse_jax.bench.decode.capacity import account
from hisparse_jax.kit import checks
from hisparse_jax.kit.page_minmax import PageMinMax

INDEXER = PageMinMax(page=4, dim=8, heads=3)
FAMILY = kit.family(INDEXER)
CONFIG = FAMILY.Config.tiny(num_layers=2, top_k=4, hot_slots=6, max_context=32, page_size=2)
PARAMS = INDEXER.init_params(CONFIG, 7)
B, T, D = 2, 32, CONFIG.d_model
# Pages of 4 tile max_context = 32; pages of 5 leave a partial last page (tokens 30, 31). The
# parameters do not depend on the page.
PAGES = pytest.mark.parametrize("ix", [INDEXER, PageMinMax(page=5, dim=8, heads=3)], ids=["page-4", "page-5"])


def _h(seed=0, tokens=T):
    return jax.random.normal(jax.random.key(seed), (B, tokens, D), jnp.float32)


def _write_prompt(ix, lengths):
    """ix's prefill write of every token below `lengths` [b] of one [B, T] prompt."""
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    written = positions < jnp.asarray(lengths)[:, None]
    return ix.write(CONFIG, PARAMS, ix.init_metadata(CONFIG, B), _h(), positions, written)


@PAGES
def test_page_bounds_are_the_max_and_min_of_the_written_keys(ix):
    lengths = np.array([T, 13])  # stream 1 ends inside a page (running bounds)
    meta = _write_prompt(ix, lengths)
    keys = np.asarray(_h() @ PARAMS["w_k"], np.float32)
    for b, n in enumerate(lengths):
        for p in range(-(-n // ix.page)):
            held = keys[b, p * ix.page: min((p + 1) * ix.page, n)]
            np.testing.assert_array_equal(np.asarray(meta.page_max[b, p]), held.max(axis=0))
            np.testing.assert_array_equal(np.asarray(meta.page_min[b, p]), held.min(axis=0))
        np.testing.assert_array_equal(np.asarray(meta.page_max[b, -(-n // ix.page):]), 0)  # untouched


@PAGES
def test_decode_writes_one_token_at_a_time_to_the_same_bounds_as_prefill(ix):
    """Max and min are exact: token by token (reset at each page's first token) gives the bits
    of the whole prompt at once."""
    meta = ix.init_metadata(CONFIG, B)
    h = _h()
    write = jax.jit(lambda m, x, p: ix.write(CONFIG, PARAMS, m, x, p, jnp.ones((B, 1), bool)))
    for t in range(T):
        meta = write(meta, h[:, t:t + 1], jnp.full((B, 1), t, jnp.int32))
    whole = _write_prompt(ix, np.array([T, T]))
    np.testing.assert_array_equal(np.asarray(meta.page_max), np.asarray(whole.page_max))
    np.testing.assert_array_equal(np.asarray(meta.page_min), np.asarray(whole.page_min))


def _oracle_scores(ix, h, meta):
    """Quest's bound from its definition, in float64: S_p = sum_j w_j sum_i max(q_ji M_pi, q_ji m_pi)
    / sqrt(heads dim); a token takes its page's score, a record its tokens' best."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    q = np.einsum("bd,dje->bje", f64(h), f64(PARAMS["w_q"]))
    w = np.einsum("bd,dj->bj", f64(h), f64(PARAMS["w_head"])) / math.sqrt(ix.heads * ix.dim)
    M, m = f64(meta.page_max), f64(meta.page_min)
    bound = np.maximum(q[:, :, None, :] * M[:, None], q[:, :, None, :] * m[:, None]).sum(-1)  # [b, j, p]
    pages = np.einsum("bjp,bj->bp", bound, w)
    tokens = np.repeat(pages, ix.page, axis=1)[:, :T]
    return tokens.reshape(B, CONFIG.num_records, CONFIG.page_size).max(-1)


@PAGES
def test_scores_are_quests_bound_numpy_oracle(ix):
    meta = _write_prompt(ix, np.array([T, 13]))
    h = _h(1, 1)[:, 0]
    sealed = jnp.asarray([T // CONFIG.page_size, 6], jnp.int32)
    got = np.asarray(ix.score(CONFIG, PARAMS, meta, h, jnp.asarray([T - 1, 12]), sealed))
    want = _oracle_scores(ix, h, meta)
    for b, s in enumerate(np.asarray(sealed)):  # records >= sealed are the kit's to ignore
        np.testing.assert_allclose(got[b, :s], want[b, :s], rtol=1e-5, atol=1e-5)


@PAGES
def test_train_scores_are_what_decode_scores(ix):
    """Training's logit of query t for a past token s is the score decode gives s's record at
    step t: closed pages by their bounds, the query's own page by its bounds so far."""
    config = FAMILY.Config.tiny(num_layers=2, top_k=4, hot_slots=6, max_context=32)  # page_size 1
    h = _h(2)
    positions = jnp.arange(T, dtype=jnp.int32)
    features = checks.train_features(ix, config, PARAMS, h, positions)  # once per sequence
    train = np.asarray(checks.train_scores(ix, config, PARAMS, features, positions, 8, 16))  # queries 8..23
    for t in (8, 13, 19, 23):
        written = jnp.broadcast_to(positions <= t, (B, T))
        meta = ix.write(config, PARAMS, ix.init_metadata(config, B), h,
                             jnp.broadcast_to(positions, (B, T)), written)
        decode = np.asarray(ix.score(config, PARAMS, meta, h[:, t], jnp.full((B,), t), jnp.full((B,), t)))
        np.testing.assert_allclose(train[:, t - 8, :t], decode[:, :t], rtol=1e-5, atol=1e-5)


def test_metadata_bytes_come_from_the_declared_layout():
    """2 x dim x itemsize bytes per page of tokens per group, in the family's roofline and in the
    benchmarks' byte account (which reads the State's declared layout)."""
    per_token = 2 * INDEXER.dim * 4 / INDEXER.page
    assert FAMILY.metadata_bytes_read(CONFIG, 16) == CONFIG.groups * per_token * 16
    per_request = account(FAMILY, CONFIG, 1, "device").by_category("device", per_request=True)
    assert per_request["indexer metadata"] == CONFIG.groups * per_token * CONFIG.max_context


def test_its_parameters_count_as_indexer_weights():
    """The family names Weights.indexers as its selection weights: weight_bytes counts W_k, W_q
    and the head weights of every group as the "indexer" component."""
    from hisparse_jax.models.weights import weight_bytes

    D, d, H = CONFIG.d_model, INDEXER.dim, INDEXER.heads
    assert weight_bytes(FAMILY, CONFIG)["indexer"] == CONFIG.groups * (D * d + D * H * d + D * H) * 4

"""PageMinMax against NumPy: its running page bounds, Quest's bound as page scores, the byte
account its declared metadata gives, and training logits that see what decode sees."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from hisparse_jax import kit
from hisparse_jax.bench.decode.capacity import account
from hisparse_jax.kit import checks
from hisparse_jax.kit.page_minmax import PageMinMax

INDEXER = PageMinMax(page=4, dim=8, heads=3)
FAMILY = kit.family(INDEXER)
CONFIG = FAMILY.Config.tiny(num_layers=2, top_k=4, hot_slots=6, max_context=32, page_size=2)
PARAMS = INDEXER.init_params(CONFIG, 7)
B, T, D = 2, 32, CONFIG.d_model


def _h(seed=0, tokens=T):
    return jax.random.normal(jax.random.key(seed), (B, tokens, D), jnp.float32)


def _write_prompt(lengths):
    """The prefill write of every token below `lengths` [b] of one [B, T] prompt."""
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    written = positions < jnp.asarray(lengths)[:, None]
    return INDEXER.write(CONFIG, PARAMS, INDEXER.init_metadata(CONFIG, B), _h(), positions, written)


def test_page_bounds_are_the_max_and_min_of_the_written_keys():
    lengths = np.array([T, 13])  # stream 1 ends inside its page 3 (running bounds)
    meta = _write_prompt(lengths)
    keys = np.asarray(_h() @ PARAMS["w_k"], np.float32)
    for b, n in enumerate(lengths):
        for p in range(-(-n // INDEXER.page)):
            held = keys[b, p * INDEXER.page: min((p + 1) * INDEXER.page, n)]
            np.testing.assert_array_equal(np.asarray(meta.page_max[b, p]), held.max(axis=0))
            np.testing.assert_array_equal(np.asarray(meta.page_min[b, p]), held.min(axis=0))
        np.testing.assert_array_equal(np.asarray(meta.page_max[b, -(-n // INDEXER.page):]), 0)  # untouched


def test_decode_writes_one_token_at_a_time_to_the_same_bounds_as_prefill():
    """Max and min are exact: token by token (reset at each page's first token) gives the bits
    of the whole prompt at once."""
    meta = INDEXER.init_metadata(CONFIG, B)
    h = _h()
    write = jax.jit(lambda m, x, p: INDEXER.write(CONFIG, PARAMS, m, x, p, jnp.ones((B, 1), bool)))
    for t in range(T):
        meta = write(meta, h[:, t:t + 1], jnp.full((B, 1), t, jnp.int32))
    whole = _write_prompt(np.array([T, T]))
    np.testing.assert_array_equal(np.asarray(meta.page_max), np.asarray(whole.page_max))
    np.testing.assert_array_equal(np.asarray(meta.page_min), np.asarray(whole.page_min))


def _oracle_scores(h, meta, sealed_tokens):
    """Quest's bound from its definition, in float64: S_p = sum_j w_j sum_i max(q_ji M_pi, q_ji m_pi)
    / sqrt(heads dim); a token takes its page's score, a record its tokens' best."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    q = np.einsum("bd,dje->bje", f64(h), f64(PARAMS["w_q"]))
    w = np.einsum("bd,dj->bj", f64(h), f64(PARAMS["w_head"])) / math.sqrt(INDEXER.heads * INDEXER.dim)
    M, m = f64(meta.page_max), f64(meta.page_min)
    bound = np.maximum(q[:, :, None, :] * M[:, None], q[:, :, None, :] * m[:, None]).sum(-1)  # [b, j, p]
    pages = np.einsum("bjp,bj->bp", bound, w)
    tokens = np.repeat(pages, INDEXER.page, axis=1)
    return tokens.reshape(B, CONFIG.num_records, CONFIG.page_size).max(-1)


def test_scores_are_quests_bound_numpy_oracle():
    meta = _write_prompt(np.array([T, 13]))
    h = _h(1, 1)[:, 0]
    sealed = jnp.asarray([T // CONFIG.page_size, 6], jnp.int32)
    got = np.asarray(INDEXER.score(CONFIG, PARAMS, meta, h, jnp.asarray([T - 1, 12]), sealed))
    want = _oracle_scores(h, meta, sealed)
    for b, s in enumerate(np.asarray(sealed)):  # records >= sealed are the kit's to ignore
        np.testing.assert_allclose(got[b, :s], want[b, :s], rtol=1e-5, atol=1e-5)


def test_train_scores_are_what_decode_scores():
    """Training's logit of query t for a past token s is the score decode gives s's record at
    step t: closed pages by their bounds, the query's own page by its bounds so far."""
    config = FAMILY.Config.tiny(num_layers=2, top_k=4, hot_slots=6, max_context=32)  # page_size 1
    h = _h(2)
    positions = jnp.arange(T, dtype=jnp.int32)
    features = checks.train_features(INDEXER, config, PARAMS, h, positions)  # once per sequence
    train = np.asarray(checks.train_scores(INDEXER, config, PARAMS, features, positions, 8, 16))  # queries 8..23
    for t in (8, 13, 19, 23):
        written = jnp.broadcast_to(positions <= t, (B, T))
        meta = INDEXER.write(config, PARAMS, INDEXER.init_metadata(config, B), h,
                             jnp.broadcast_to(positions, (B, T)), written)
        decode = np.asarray(INDEXER.score(config, PARAMS, meta, h[:, t], jnp.full((B,), t), jnp.full((B,), t)))
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

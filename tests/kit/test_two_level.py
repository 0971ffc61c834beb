"""The two-level indexer (hisparse_jax.kit.two_level): its selection against a NumPy oracle, its
training logits and selection against decode's, its second record kind exact in every mode
(hisparse == device, both hot buffers and LRU states sound; dense == every record), the
compiled program (one RESOLVE per record kind per selecting group), its knobs' errors and its
byte account."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hisparse_jax
from hisparse_jax import kit, testing
from hisparse_jax.bench.decode.capacity import INDEXER_RECORDS, account
from hisparse_jax.kit import checks
from hisparse_jax.kit.protocol import Fetched
from hisparse_jax.kit.two_level import TwoLevel
from hisparse_jax.train import forward
from hisparse_jax.topk import select_topk

# Pages of 8 tokens over records of page_size 2; 3 candidates of 8 pages; 5 hot pages: the
# fine keys' LRU evicts. Widths 12 and 4 keep the coarse sums [b, 8, 12] apart in type from the
# fine open page [b, 8, 4] (the copy check of the program goes by type).
INDEXER = TwoLevel(page=8, candidates=3, coarse_dim=12, fine_dim=4, heads=2, hot_pages=5)
FAMILY = kit.family(INDEXER)
SHAPES = dict(num_layers=2, page_size=2, top_k=6, hot_slots=8, max_context=64)
CONFIG = FAMILY.Config.tiny(**SHAPES)
WEIGHTS = FAMILY.init_weights(CONFIG, 0)
PARAMS = WEIGHTS.indexers[0]
PROMPTS = np.random.default_rng(0).integers(0, 256, (2, 40)).astype(np.int32)
LENGTHS = np.asarray([37, 20], np.int32)
STEPS = 6
B, T, D = 2, 64, CONFIG.d_model


def _h(seed=0, tokens=T):
    return jax.random.normal(jax.random.key(seed), (B, tokens, D), jnp.float32)


def _prompt_metadata(ix, config, h, upto):
    """ix's metadata and fine keys [b, T, fine_dim] after tokens 0..upto[b] of h are written."""
    positions = jnp.broadcast_to(jnp.arange(h.shape[1], dtype=jnp.int32), h.shape[:2])
    written = positions <= jnp.asarray(upto)[:, None]
    meta = ix.write(config, PARAMS, ix.init_metadata(config, B), h, positions, written)
    return meta, ix.record_values(config, PARAMS, h, positions)


def _fetched(ix, fine, ids, pos):
    """Fetched of ids [b, c] (-1 padding) from the fine keys [b, T, fd] (as the kit gathers them)."""
    pages = np.asarray(fine).reshape(B, -1, ix.page, ix.fine_dim)
    ids = np.asarray(ids)
    valid = ids >= 0
    records = np.where(valid[..., None, None], pages[np.arange(B)[:, None], np.maximum(ids, 0)], 0)
    own = pages[np.arange(B), np.asarray(pos) // ix.page]
    return Fetched(jnp.asarray(ids), jnp.asarray(records), jnp.asarray(valid), jnp.asarray(own))


def _relu_scores(q, w, keys):
    """sum_j w_j relu(q_j . k) in float64: q [heads, dim], w [heads], keys [n, dim] -> [n]."""
    return (np.maximum(keys @ q.T, 0.0) * w).sum(-1)


def _oracle(ix, config, h_all, fine, pos, query):
    """The two-level rule from its definition (float64), for one stream: (candidate pages, ids)."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    P, page = config.page_size, ix.page
    closed, sealed = pos // page, pos // P
    ck = np.asarray(jnp.asarray(h_all @ PARAMS["c_k"]).astype(config.dtype), np.float64)  # [T, cd]
    page_keys = np.stack([ck[p * page:(p + 1) * page].sum(0) / page for p in range(closed)]) if closed else np.zeros((0, 1))
    cq = np.einsum("d,dje->je", f64(query), f64(PARAMS["c_q"]))
    cw = np.einsum("d,dj->j", f64(query), f64(PARAMS["c_w"])) / np.sqrt(ix.heads * ix.coarse_dim)
    pscore = _relu_scores(cq, cw, page_keys) if closed else np.zeros(0)
    cand = sorted(sorted(range(closed), key=lambda p: (-pscore[p], p))[:ix.candidates])
    fq = np.einsum("d,dje->je", f64(query), f64(PARAMS["f_q"]))
    fw = np.einsum("d,dj->j", f64(query), f64(PARAMS["f_w"])) / np.sqrt(ix.heads * ix.fine_dim)
    tscore = _relu_scores(fq, fw, f64(fine))
    recs = {r: tscore[r * P:(r + 1) * P].max() for p in cand + [closed]
            for r in range(p * page // P, (p + 1) * page // P) if r < sealed}
    ids = sorted(sorted(recs, key=lambda r: (-recs[r], r))[:config.top_k])
    return cand, ids + [-1] * (config.top_k - len(ids))


@pytest.mark.parametrize("pos", [[5, 13], [37, 63], [40, 19]], ids=["no-closed-page", "open-page", "page-start"])
def test_selection_is_the_two_level_rule_numpy_oracle(pos):
    """Candidate pages by coarse score (ties to the lower page, -1 padding when fewer pages are
    closed than candidates), then the top-k records of those pages and the open one."""
    h = _h(1)
    meta, fine = _prompt_metadata(INDEXER, CONFIG, h, pos)
    query = _h(2, 1)[:, 0]
    positions = jnp.asarray(pos, jnp.int32)
    closed = positions // INDEXER.page
    cand = checks.fetch(INDEXER, CONFIG, PARAMS, meta, query, positions, closed)
    fetched = _fetched(INDEXER, fine, cand, pos)
    ids = np.asarray(checks.select(INDEXER, CONFIG, PARAMS, meta, query, positions, positions // CONFIG.page_size,
                                   fetched=fetched))
    for b in range(B):
        want_cand, want_ids = _oracle(INDEXER, CONFIG, h[b], fine[b], pos[b], query[b])
        assert np.asarray(cand[b]).tolist() == want_cand + [-1] * (INDEXER.candidates - len(want_cand))
        assert ids[b].tolist() == want_ids


def test_ties_go_to_the_lower_page_and_record():
    """Zero query weights score every page and token 0: the first pages, then the lowest records."""
    params = jax.tree.map(jnp.zeros_like, PARAMS)
    h, pos = _h(3), jnp.asarray([45, 63], jnp.int32)
    meta, fine = _prompt_metadata(INDEXER, CONFIG, h, np.asarray(pos))
    cand = np.asarray(INDEXER.fetch(CONFIG, params, meta, h[:, 0], pos, pos // INDEXER.page))
    assert cand.tolist() == [[0, 1, 2]] * B
    ids = np.asarray(INDEXER.select(CONFIG, params, meta, h[:, 0], pos, pos // CONFIG.page_size,
                                    fetched=_fetched(INDEXER, fine, cand, pos)))
    assert ids.tolist() == [list(range(CONFIG.top_k))] * B


def test_training_selects_what_decode_selects_and_scores_what_it_scores():
    """TrainLevels at page_size 1: the fine logits are decode's token scores, the coarse logits its
    page scores, and training's two-level selection picks decode's ids."""
    config = FAMILY.Config.tiny(num_layers=2, top_k=6, hot_slots=8, max_context=64)  # page_size 1
    h = _h(4)
    positions = jnp.arange(T, dtype=jnp.int32)
    features = checks.train_features(INDEXER, config, PARAMS, h, positions)
    levels = checks.train_scores(INDEXER, config, PARAMS, features, positions, 16, 32)  # queries 16..47
    allowed = forward.candidate_tokens(config, levels, 16 + jnp.arange(32), T)
    ranked = jnp.where(allowed, levels.fine, -jnp.inf).reshape(B * 32, T)
    train_ids = np.asarray(select_topk(ranked, jnp.tile(16 + jnp.arange(32, dtype=jnp.int32), B), config.top_k))
    train_ids = train_ids.reshape(B, 32, -1)
    for t in (17, 24, 33, 47):
        pos = jnp.full((B,), t, jnp.int32)
        meta, fine = _prompt_metadata(INDEXER, config, h, np.full(B, t))
        np.testing.assert_allclose(np.asarray(levels.coarse[:, t - 16, :t // 8]),
                                   np.asarray(INDEXER.page_scores(PARAMS, h[:, t], meta.coarse_sum))[:, :t // 8],
                                   rtol=1e-5, atol=1e-6)
        cand = INDEXER.fetch(config, PARAMS, meta, h[:, t], pos, pos // INDEXER.page)
        ids = np.asarray(INDEXER.select(config, PARAMS, meta, h[:, t], pos, pos,
                                        fetched=_fetched(INDEXER, fine, cand, np.asarray(pos))))
        kept = np.where(np.take_along_axis(np.asarray(allowed[:, t - 16]), np.maximum(train_ids[:, t - 16], 0), 1),
                        train_ids[:, t - 16], -1)
        assert [sorted(x for x in row if x >= 0) for row in kept] == [[x for x in row if x >= 0] for row in ids]


def _hot_records_are_the_pool_records(store, device_store):
    """Every filled slot of a hisparse store's hot buffer holds its record's bits as the device
    store has them, and each LRU order is a permutation of the slots."""
    slots, hot, lru = (np.asarray(x) for x in (store.cache.slot_record, store.cache.hot, store.cache.lru))
    kv = np.stack([np.asarray(x) for x in device_store.device_kv])  # [L, b, R, P, W]
    for layer, stream, slot in zip(*np.nonzero(slots >= 0)):
        np.testing.assert_array_equal(hot[layer, stream, slot].view(np.uint32),
                                      kv[layer, stream, slots[layer, stream, slot]].view(np.uint32))
    assert (np.sort(lru, axis=-1) == np.arange(lru.shape[-1])).all()


def test_hisparse_matches_device_bit_for_bit_with_both_record_kinds():
    hisparse, device = testing.assert_hisparse_matches_device(FAMILY, CONFIG, WEIGHTS, PROMPTS, LENGTHS, STEPS)
    assert hisparse.misses.sum() > 0
    h, d = hisparse.state, device.state
    assert np.asarray(h.index_store.cache.slot_record).max() >= 0, "the fine keys' hot buffer was never filled"
    for hs, ds in ((h.store, d.store), (h.index_store, d.index_store)):
        _hot_records_are_the_pool_records(hs, ds)
        np.testing.assert_array_equal(np.asarray(hs.sealed), np.asarray(ds.sealed))
    np.testing.assert_array_equal(np.asarray(h.index_store.sealed), (LENGTHS + STEPS) // INDEXER.page)
    for x, y in zip(h.index_tail + h.coarse_sum, d.index_tail + d.coarse_sum):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint32), np.asarray(y).view(np.uint32))


def test_index_record_misses_come_out_of_generate():
    state = FAMILY.init_state(CONFIG, 2, "hisparse")
    state, logits = hisparse_jax.decode.prefill(FAMILY, CONFIG, WEIGHTS, state, jnp.asarray(PROMPTS),
                                                jnp.asarray(LENGTHS))
    out = hisparse_jax.decode.generate(FAMILY, CONFIG, WEIGHTS, state, jnp.argmax(logits, -1).astype(jnp.int32), 3)
    misses = np.asarray(out.index_misses)
    assert misses.shape == (3, CONFIG.groups, 2) and misses[0].sum() > 0  # the first step fetches


def test_dense_matches_selecting_every_record():
    """Every page a candidate (candidates = pages) and top_k = every record: the two-level
    selection is every sealed record, so "hisparse" equals "dense" bit for bit."""
    every = dataclasses.replace(INDEXER, candidates=8, hot_pages=8)
    family = kit.family(every)
    config = family.Config.tiny(**SHAPES)
    testing.assert_dense_matches_selecting_every_record(family, config, WEIGHTS, PROMPTS, LENGTHS, 3)


def test_decode_program_is_clean():
    """One RESOLVE per sparse layer and one per selecting group (its fine keys), a pool write per
    pool per step, both pools pinned and never copied."""
    if not hisparse_jax.has_ffi():
        pytest.skip("the compiled-program checks need RESOLVE's handler (hisparse_jax.has_ffi())")
    testing.assert_clean_decode_program(FAMILY, CONFIG, WEIGHTS, batch=2, steps=2)


def test_decode_program_is_clean_with_prefetch():
    """With the KV's copies prefetched (a resolve_prefetch and a join per sparse layer), the fine
    keys' RESOLVE stays one plain call per selecting group: its records are read at once."""
    if not hisparse_jax.has_ffi():
        pytest.skip("the compiled-program checks need RESOLVE's handler (hisparse_jax.has_ffi())")
    config = dataclasses.replace(CONFIG, prefetch=True)
    testing.assert_clean_decode_program(FAMILY, config, WEIGHTS, batch=2, steps=2)


@pytest.mark.parametrize("knobs, error", [
    (dict(page=0), "TwoLevel.page: must be a positive int, got 0"),
    (dict(page=5), "TwoLevel.page: page=5 must be a multiple of the model's page_size=2"),
    (dict(candidates=-1), "TwoLevel.candidates: must be a positive int"),
    (dict(fine_dim=2.5), "TwoLevel.fine_dim: must be a positive int"),
    (dict(candidates=6, hot_pages=4), "TwoLevel.hot_pages: hot_pages=4 < candidates=6"),
])
def test_bad_knobs_are_one_line_errors_naming_the_knob(knobs, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")) as caught:
        dataclasses.replace(CONFIG, indexer=dataclasses.replace(INDEXER, **knobs))
    assert "\n" not in str(caught.value)


def test_byte_account_counts_both_record_kinds():
    """Device: the coarse sums (float32 per page) as indexer metadata; the fine keys' hot buffer,
    slot map, LRU and open page as "indexer records", apart from the KV's; host: both pools."""
    cap = account(FAMILY, CONFIG, 1, "hisparse")
    device = cap.by_category("device", per_request=True)
    pages = -(-CONFIG.max_context // INDEXER.page)
    assert device["indexer metadata"] == CONFIG.groups * pages * INDEXER.coarse_dim * 4
    fine_record = INDEXER.page * INDEXER.fine_dim * 4
    kv_record = CONFIG.page_size * CONFIG.record_width * 4
    assert device["kv records"] == CONFIG.num_layers * CONFIG.hot_slots * kv_record
    slots = INDEXER.hot_pages * (fine_record + 2 * 4)  # a record and its slot_record and lru entries
    assert device[INDEXER_RECORDS] == CONFIG.groups * (slots + fine_record) + 4  # + open pages, its sealed count
    assert cap.total("host", "kv records") == CONFIG.num_layers * CONFIG.num_records * kv_record
    assert cap.total("host", INDEXER_RECORDS) == CONFIG.groups * pages * fine_record


def test_training_distills_both_levels():
    """The forward's KL reaches the coarse parameters (page KL) and the fine ones (token KL) in
    sparse training, which attends to the two-level selection (the dense warm-up takes the same
    KLs over every sealed key)."""
    config = FAMILY.Config.tiny(num_layers=1, top_k=6, hot_slots=8, max_context=64)  # page_size 1
    weights = FAMILY.init_weights(config, 1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, 33)), jnp.int32)  # 4 pages of 8

    def kl(indexers):
        _, parts = forward.forward_loss(config, dataclasses.replace(weights, indexers=indexers), tokens,
                                        sparse=True, chunk=16)
        return jnp.sum(parts["kl"])

    # Jitted, as fit runs the training step: eagerly, the forward and its gradient dispatch (and
    # compile) op by op, ~4x the time of one program.
    value, grads = jax.jit(jax.value_and_grad(kl))(weights.indexers)
    assert np.isfinite(float(value)) and float(value) > 0
    for name, g in grads[0].items():
        assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).max() > 0, name


def test_a_record_kind_that_makes_no_store_is_a_one_line_error():
    """Records of page x width x itemsize bytes must be whole 8-byte words (RESOLVE copies words)."""
    with pytest.raises(ValueError, match=r"^TwoLevel.record_kind: CacheConfig: a record is 36 bytes") as caught:
        FAMILY.Config.tiny(num_layers=2, top_k=6, hot_slots=8, max_context=64,  # page_size 1
                           indexer=dataclasses.replace(INDEXER, page=3, fine_dim=3))
    assert "\n" not in str(caught.value)


@dataclasses.dataclass(frozen=True)
class _NoFetch(kit.Indexer):
    """Declares a record kind but not the fetch that names its records."""

    def record_kind(self, config):
        return kit.RecordKind(page=4, width=2, fetch=2, hot_slots=2)

    def record_values(self, config, params, h, positions):
        return h[..., :2]

    def select(self, config, params, metadata, h, positions, sealed, fetched=None):
        return jnp.full((h.shape[0], config.top_k), -1, jnp.int32)


@dataclasses.dataclass(frozen=True)
class _FewSlots(_NoFetch):
    """A record kind with fewer hot slots than the records it fetches."""

    def record_kind(self, config):
        return kit.RecordKind(page=4, width=2, fetch=3, hot_slots=2)

    def fetch(self, config, params, metadata, h, positions, sealed):
        return jnp.full((h.shape[0], 3), -1, jnp.int32)


@pytest.mark.parametrize("indexer, error", [
    (_NoFetch(), "_NoFetch.fetch: not defined, but record_kind is"),
    (_FewSlots(), "_FewSlots.record_kind: RecordKind.hot_slots=2 < fetch=3"),
])
def test_record_kind_protocol_errors_name_the_method(indexer, error):
    with pytest.raises(ValueError, match=error) as caught:
        kit.family(indexer).Config.tiny(**SHAPES)
    assert "\n" not in str(caught.value)

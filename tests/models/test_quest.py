"""Quest model: every decode mode gives the same bits, decode agrees with prefill, page bounds,
the indexer formula, config errors.

End-to-end runs (prefill of 3 ragged prompts, 64 greedy steps) are cached per (config, mode):
compiling is what costs time on CPU, so each program is built once and shared by the tests.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import Run, assert_bitwise_equal, decode_run, make_prompts, weights_for

from hisparse_jax import decode
from hisparse_jax.models import get_family, quest

STEPS = 64
LENGTHS = (170, 101, 37)  # ragged: 10, 6 and 2 sealed pages of 16 plus an open page each
T = 240  # prompt buffer: room for a prompt plus every generated token (decode-vs-prefill test)
K = 4


def config(**overrides) -> quest.Config:
    """Tiny Quest (2 dense + 2 sparse layers, 16 pages of 16), k = 4, B = 6: LRU evicts every step."""
    return quest.Config.tiny(**{"top_k": K, "hot_slots": K + 2, **overrides})


def prompts():
    return make_prompts(0, LENGTHS, T)


def weights():
    # Weight shapes do not depend on top_k / hot_slots: one set serves every config here.
    return weights_for("quest", config())


def run(cfg: quest.Config, mode: str):
    """Prefill the shared prompts and decode STEPS greedy tokens (cached per config and mode)."""
    return decode_run("quest", cfg, mode, STEPS, LENGTHS, T)


def device_baseline() -> Run:
    # "device" mode has no hot buffer and never reads hot_slots, so this run is the baseline of
    # every hot_slots value (one compile instead of one per B).
    return run(config(), "device")


# --------------------------------------------------------------------------- modes agree bit for bit


@pytest.mark.parametrize("hot_slots", [K + 2, K], ids=["B=k+2", "B=k"])
def test_hisparse_matches_device_while_evicting(hot_slots):
    cfg = config(hot_slots=hot_slots)
    hisparse, device = run(cfg, "hisparse"), device_baseline()
    assert_bitwise_equal(hisparse, device)
    assert hisparse.misses.shape == (STEPS, cfg.sparse_layers, len(LENGTHS), cfg.n_kv_heads)
    per_step = hisparse.misses.sum(axis=(1, 2, 3))
    assert (per_step > 0).mean() >= 0.9, f"misses per step: {per_step}"
    assert (hisparse.misses <= K).all()
    assert not device.misses.any()
    assert hisparse.state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(hisparse.state.lengths, np.asarray(LENGTHS) + STEPS)


def test_dense_equals_sparse_when_top_k_covers_every_page():
    every_page = config(top_k=16, hot_slots=16)  # max_context 256 = 16 pages
    assert_bitwise_equal(run(every_page, "device"), run(config(), "dense"))
    # ... and the sparse selection at k = 4 does change the output.
    assert not np.array_equal(run(config(), "device").logits, run(config(), "dense").logits)


# --------------------------------------------------------------------------- decode follows prefill


def test_decode_matches_prefill_of_the_same_tokens():
    """Dense-mode decode at position p == dense prefill of the first p + 1 tokens (float tolerance).

    Checks the paging (tail, sealing, page order, both stores) against plain causal attention.
    """
    cfg, dense = config(), run(config(), "dense")
    tokens, lengths = prompts()
    sequence = tokens.copy()
    fed = np.concatenate([dense.prefill_logits.argmax(-1)[None], dense.tokens[:-1]])  # [STEPS, b]
    for i, n in enumerate(lengths):
        sequence[i, n : n + STEPS] = fed[:, i]
    for step in (0, 1, 14, 15, 16, 40, STEPS - 1):  # around page boundaries of the ragged rows
        state = quest.init_state(cfg, len(LENGTHS), "dense")
        _, logits = decode.prefill("quest", cfg, weights(), state, sequence, lengths + step + 1)
        np.testing.assert_allclose(np.asarray(logits), dense.logits[step], rtol=2e-4, atol=2e-4)


# --------------------------------------------------------------------------- state


def test_page_bounds_are_the_key_max_and_min_of_each_sealed_page():
    cfg, device = config(), device_baseline()
    state = device.state
    pages = np.asarray(state.store.device_kv)[..., : cfg.head_dim]  # [Ls, b, kvh, R, P, hd]
    sealed = np.asarray(state.store.sealed)  # [b, kvh]
    want_sealed = (np.asarray(LENGTHS) + STEPS) // cfg.page_size
    np.testing.assert_array_equal(sealed, np.broadcast_to(want_sealed[:, None], sealed.shape))
    held = np.arange(pages.shape[3]) < sealed[..., None]  # [b, kvh, R]
    for got, want in ((state.page_max, pages.max(-2)), (state.page_min, pages.min(-2))):
        np.testing.assert_array_equal(np.asarray(got)[:, held], want[:, held])
    # Dense layers keep every page on device in every mode, sealed in step with the sparse ones.
    np.testing.assert_array_equal(np.asarray(state.dense_store.sealed), sealed)
    hisparse = run(config(), "hisparse").state
    assert hisparse.dense_store.mode == "device" and hisparse.dense_store.host_pool is None
    np.testing.assert_array_equal(np.asarray(hisparse.dense_store.device_kv), np.asarray(state.dense_store.device_kv))


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


def test_family_is_registered():
    assert get_family("quest") is quest


def test_device_bytes_account_for_what_stays_on_device():
    cfg = quest.Config.realistic()
    hisparse, device = cfg.device_bytes(8, "hisparse"), cfg.device_bytes(8, "device")
    assert hisparse["dense_kv"] == device["dense_kv"] > 0  # dense layers stay in HBM in every mode
    assert hisparse["page_minmax"] == device["page_minmax"] > 0
    assert hisparse["sparse_kv"] < device["sparse_kv"]
    assert hisparse["total"] == sum(v for k, v in hisparse.items() if k != "total")


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=9, hot_slots=8), "top_k"),  # k > B
        (dict(top_k=17, hot_slots=17), "top_k"),  # more pages than the context holds
        (dict(pool_records=8), "max_context"),  # context beyond the pool
        (dict(max_context=250), "page_size"),  # page size not dividing the context
        (dict(n_kv_heads=3), "n_kv_heads"),
        (dict(dense_layers=4), "dense_layers"),
        (dict(head_dim=15), "head_dim"),
        (dict(prefill_chunk=24), "prefill_chunk"),
        (dict(dtype="float16"), "dtype"),
        (dict(hot_slots=0), "hot_slots"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"Config\.{field}\b"):
        quest.Config.tiny(**overrides)

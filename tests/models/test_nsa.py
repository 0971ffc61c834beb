"""NSA model: every decode mode gives the same bits, decode agrees with prefill, the compressed
and window buffers, the block scores and forced blocks, config errors.

End-to-end runs (prefill of 3 ragged prompts, 64 greedy steps) are cached per (config, mode):
compiling is what costs time on CPU, so each program is built once and shared by the tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import Run, assert_bitwise_equal, decode_run, make_prompts, weights_for

from hisparse_jax import decode
from hisparse_jax.models import common, get_family, nsa

STEPS = 64
LENGTHS = (170, 101, 37)  # ragged: 10, 6 and 2 sealed blocks of 16 plus an open block each
T = 240  # prompt buffer: room for a prompt plus every generated token (decode-vs-prefill test)
K = 3  # top-n = 4: the initial block, the latest sealed block, one scored block, the open block


def config(**overrides) -> nsa.Config:
    """Tiny NSA (2 layers; l=8, d=4, l'=16, w=32; 16 blocks), k = 3, B = 5: LRU evicts."""
    return nsa.Config.tiny(**{"top_k": K, "hot_slots": K + 2, **overrides})


def prompts():
    return make_prompts(0, LENGTHS, T)


def weights():
    # Weight shapes do not depend on top_k / hot_slots: one set serves every config here.
    return weights_for("nsa", config())


def run(cfg: nsa.Config, mode: str):
    """Prefill the shared prompts and decode STEPS greedy tokens (cached per config and mode)."""
    return decode_run("nsa", cfg, mode, STEPS, LENGTHS, T)


def device_baseline() -> Run:
    # "device" mode has no hot buffer and never reads hot_slots, so this run is the baseline of
    # every hot_slots value (one compile instead of one per B).
    return run(config(), "device")


def all_tokens(cfg: nsa.Config, state: nsa.State) -> np.ndarray:
    """Every token's record [L, b, kvh, max_context, 2hd]: sealed blocks from the device store, then the tail."""
    kv = np.asarray(state.store.device_kv)  # [L, b, kvh, R, l', 2hd]
    L, b, h, R, P, W = kv.shape
    tokens = kv.reshape(L, b, h, R * P, W).copy()
    for i, n in enumerate(np.asarray(state.lengths)):
        start = n // P * P
        tokens[:, i, :, start : start + P] = np.asarray(state.tail)[:, i]
    return tokens


# --------------------------------------------------------------------------- modes agree bit for bit


@pytest.mark.parametrize("hot_slots", [K + 2, K], ids=["B=k+2", "B=k"])
def test_hisparse_matches_device_while_evicting(hot_slots):
    cfg = config(hot_slots=hot_slots)
    hisparse, device = run(cfg, "hisparse"), device_baseline()
    assert_bitwise_equal(hisparse, device)
    assert hisparse.misses.shape == (STEPS, cfg.n_layers, len(LENGTHS), cfg.n_kv_heads)
    per_step = hisparse.misses.sum(axis=(1, 2, 3))
    assert (per_step > 0).mean() >= 0.9, f"misses per step: {per_step}"
    assert (hisparse.misses <= K).all()
    assert not device.misses.any()
    assert hisparse.state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(hisparse.state.lengths, np.asarray(LENGTHS) + STEPS)


def test_dense_equals_sparse_when_top_k_covers_every_block():
    every_block = config(top_k=16, hot_slots=16)  # max_context 256 = 16 blocks of 16
    assert_bitwise_equal(run(every_block, "device"), run(config(), "dense"))
    # ... and the sparse selection at k = 3 does change the output.
    assert not np.array_equal(run(config(), "device").logits, run(config(), "dense").logits)


# --------------------------------------------------------------------------- decode follows prefill


def test_decode_matches_prefill_of_the_same_tokens():
    """Sparse decode at position p == NSA prefill of the first p + 1 tokens (float tolerance).

    Prefill selects per query from scratch, decode from the paged state (tail, sealing, ring,
    compressed blocks built incrementally, hot buffer), so agreement checks the incremental
    bookkeeping against the definition.
    """
    cfg, device = config(), device_baseline()
    tokens, lengths = prompts()
    sequence = tokens.copy()
    fed = np.concatenate([device.prefill_logits.argmax(-1)[None], device.tokens[:-1]])  # [STEPS, b]
    for i, n in enumerate(lengths):
        sequence[i, n : n + STEPS] = fed[:, i]
    for step in (0, 1, 14, 15, 16, 40, STEPS - 1):  # around block boundaries of the ragged rows
        state = nsa.init_state(cfg, len(LENGTHS), "device")
        _, logits = decode.prefill("nsa", cfg, weights(), state, sequence, lengths + step + 1)
        np.testing.assert_allclose(np.asarray(logits), device.logits[step], rtol=2e-4, atol=2e-4)


# --------------------------------------------------------------------------- state


def test_compressed_blocks_and_window_hold_the_right_tokens():
    cfg, state = config(), device_baseline().state
    l, d, w = cfg.cmp_block, cfg.cmp_stride, cfg.window
    tokens = all_tokens(cfg, state)  # [L, b, kvh, T, 2hd]
    lengths = np.asarray(state.lengths)
    compressed, window = np.asarray(state.compressed), np.asarray(state.window)
    layer = lambda i: jax.tree.map(lambda a: a[i], weights().layers)
    for b, n in enumerate(lengths):
        done = (n - l) // d + 1
        blocks = np.stack([tokens[:, b, :, i * d : i * d + l] for i in range(done)], axis=2)  # [L, kvh, n, l, W]
        want = np.stack([np.asarray(nsa.compress(cfg, layer(i), blocks[i])) for i in range(cfg.n_layers)])
        np.testing.assert_allclose(compressed[:, b, :, :done], want, rtol=1e-5, atol=1e-5)
        assert not compressed[:, b, :, done:].any()
        recent = np.arange(n - w, n)
        np.testing.assert_array_equal(window[:, b][:, :, recent % w], tokens[:, b][:, :, recent])


def test_block_scores_spread_each_compressed_block_over_its_chunks():
    cfg = config()  # l = 8, d = 4: a compressed block covers 2 chunks; l' = 16: a block is 4 chunks
    n = (64 - cfg.cmp_block) // cfg.cmp_stride + 1  # 15 compressed blocks over 64 tokens
    probs = np.zeros((n,), np.float32)
    probs[3] = 1.0  # tokens 12..19: chunks 3 and 4, i.e. selection blocks 0 and 1
    np.testing.assert_array_equal(np.asarray(nsa.block_scores(cfg, jnp.asarray(probs))), [0.5, 0.5, 0, 0])
    rng = np.random.default_rng(2)
    probs = rng.random((2, n)).astype(np.float32)
    scores = np.asarray(nsa.block_scores(cfg, jnp.asarray(probs)))
    np.testing.assert_allclose(scores.sum(-1), probs.sum(-1), rtol=1e-6)  # mass is conserved


def test_initial_and_latest_sealed_blocks_are_always_selected():
    scores = jnp.asarray([[9.0, 0.0, 8.0, 7.0, 6.0, 5.0], [0.0, 9.0, 8.0, 7.0, 6.0, 5.0]])
    sealed = jnp.asarray([5, 3], jnp.int32)
    got = common.select_topk(nsa.forced_scores(scores, sealed), sealed, 3)
    np.testing.assert_array_equal(np.asarray(got), [[0, 2, 4], [0, 1, 2]])
    one = common.select_topk(nsa.forced_scores(scores[:1], jnp.asarray([1])), jnp.asarray([1]), 3)
    np.testing.assert_array_equal(np.asarray(one), [[0, -1, -1]])


def test_family_is_registered():
    assert get_family("nsa") is nsa


def test_device_bytes_account_for_what_stays_on_device():
    cfg = nsa.Config.realistic()
    assert cfg.top_n == 16 and cfg.num_records == 512 and cfg.num_compressed == 2047
    hisparse, device = cfg.device_bytes(8, "hisparse"), cfg.device_bytes(8, "device")
    assert hisparse["compressed_kv"] == device["compressed_kv"] > 0  # grows with context in every mode
    assert hisparse["selected_kv"] < device["selected_kv"]
    assert hisparse["total"] == sum(v for k, v in hisparse.items() if k != "total")


# --------------------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=6, hot_slots=5), "top_k"),  # k > B
        (dict(top_k=17, hot_slots=17), "top_k"),  # more blocks than the context holds
        (dict(top_k=1, hot_slots=1), "top_k"),  # no room for the forced blocks
        (dict(pool_records=8), "max_context"),  # context beyond the pool
        (dict(max_context=250), "page_size"),  # selection block not dividing the context
        (dict(cmp_stride=3), "cmp_stride"),  # d must divide l and l'
        (dict(cmp_block=32, window=32), "cmp_block"),  # l > l'
        (dict(window=4), "window"),  # ring shorter than a compressed block
        (dict(n_kv_heads=3), "n_kv_heads"),
        (dict(prefill_chunk=24), "prefill_chunk"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"Config\.{field}\b"):
        nsa.Config.tiny(**overrides)

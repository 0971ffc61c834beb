"""NSA only: its sparse decode against its own prefill, the compressed and window buffers, the
block scores and forced blocks, NSA's own config rules. What every family does is in
test_families.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import CASES, STEPS

from hisparse_jax import decode
from hisparse_jax.bench.decode.capacity import account
from hisparse_jax.models import nsa
from hisparse_jax.topk import select_topk

CASE = CASES["nsa"]


def all_tokens(state: nsa.State) -> np.ndarray:
    """Every token's record [L, b, kvh, max_context, 2hd]: sealed blocks from the device store, then the tail."""
    kv = np.stack([np.asarray(a) for a in state.store.device_kv])  # [L, b, kvh, R, l', 2hd]
    L, b, h, R, P, W = kv.shape
    tokens = kv.reshape(L, b, h, R * P, W).copy()
    tails = np.stack([np.asarray(a) for a in state.tail])
    for i, n in enumerate(np.asarray(state.lengths)):
        start = n // P * P
        tokens[:, i, :, start : start + P] = tails[:, i]
    return tokens


def test_sparse_decode_matches_prefill_of_the_same_tokens():
    """Sparse decode at position p == NSA prefill of the first p + 1 tokens (float tolerance).

    Prefill selects per query from scratch, decode from the paged state (tail, sealing, ring,
    compressed blocks built incrementally, hot buffer), so agreement checks the incremental
    bookkeeping against the definition.
    """
    config, device = CASE.config(), CASE.device_baseline()
    tokens, lengths = CASE.prompts()
    sequence = tokens.copy()
    fed = np.concatenate([device.prefill_logits.argmax(-1)[None], device.tokens[:-1]])  # [STEPS, b]
    for i, n in enumerate(lengths):
        sequence[i, n : n + STEPS] = fed[:, i]
    for step in (0, 1, 14, 15, 16, 40, STEPS - 1):  # around block boundaries of the ragged rows
        state = nsa.init_state(config, len(lengths), "device")
        _, logits = decode.prefill("nsa", config, CASE.weights(), state, sequence, lengths + step + 1)
        np.testing.assert_allclose(np.asarray(logits), device.logits[step], rtol=2e-4, atol=2e-4)


def test_compressed_blocks_and_window_hold_the_right_tokens():
    config, state = CASE.config(), CASE.device_baseline().state
    l, d, w = config.cmp_block, config.cmp_stride, config.window
    tokens = all_tokens(state)  # [L, b, kvh, T, 2hd]
    lengths = np.asarray(state.lengths)
    compressed = np.stack([np.asarray(a) for a in state.compressed])
    window = np.stack([np.asarray(a) for a in state.window])
    layers = CASE.weights().layers
    for b, n in enumerate(lengths):
        done = (n - l) // d + 1
        blocks = np.stack([tokens[:, b, :, i * d : i * d + l] for i in range(done)], axis=2)  # [L, kvh, n, l, W]
        want = np.stack([np.asarray(nsa.compress(config, layers[i], blocks[i])) for i in range(config.num_layers)])
        np.testing.assert_allclose(compressed[:, b, :, :done], want, rtol=1e-5, atol=1e-5)
        assert not compressed[:, b, :, done:].any()
        recent = np.arange(n - w, n)
        np.testing.assert_array_equal(window[:, b][:, :, recent % w], tokens[:, b][:, :, recent])


def test_block_scores_spread_each_compressed_block_over_its_chunks():
    cfg = CASE.config()  # l = 8, d = 4: a compressed block covers 2 chunks; l' = 16: a block is 4 chunks
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
    got = select_topk(nsa.forced_scores(scores, sealed), sealed, 3)
    np.testing.assert_array_equal(np.asarray(got), [[0, 2, 4], [0, 1, 2]])
    one = select_topk(nsa.forced_scores(scores[:1], jnp.asarray([1])), jnp.asarray([1]), 3)
    np.testing.assert_array_equal(np.asarray(one), [[0, -1, -1]])


def test_window_and_compressed_kv_count_as_kv_in_the_byte_account():
    per_request = account(nsa, nsa.Config.realistic(), 1, "hisparse").arrays
    categories = {path.split("[")[0]: cat for path, (_, cat, _, _) in per_request.items()}
    assert categories["window"] == categories["compressed"] == "kv records"
    assert categories["tail"] == "open page"
    assert categories["store.cache.slot_record"] == "slot metadata"


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=17, hot_slots=17), "top_k"),  # more blocks than the context holds
        (dict(top_k=1, hot_slots=1), "top_k"),  # no room for the forced blocks
        (dict(cmp_stride=3), "cmp_stride"),  # d must divide l and l'
        (dict(cmp_block=32, window=32), "cmp_block"),  # l > l'
        (dict(window=4), "window"),  # ring shorter than a compressed block
        (dict(n_kv_heads=3), "n_kv_heads"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"Config\.{field}\b"):
        nsa.Config.tiny(**overrides)


def test_realistic_shapes():
    config = nsa.Config.realistic()
    assert config.top_n == 16 and config.num_records == 512 and config.num_compressed == 2047

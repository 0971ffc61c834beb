"""The two-level indexer with fp8 fine keys (TwoLevel.fine_dtype="float8_e4m3fn"): its records are
the package's one fp8 quantizer's codes and scales as bytes, fine_dim + 4 a token; hisparse ==
device bit for bit and dense == selecting every record (zero tolerance, as for every family);
training scores the keys decode reads back; the byte account and the named preset."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hisparse_jax
from hisparse_jax import fp8, kit, testing
from hisparse_jax.bench.decode.capacity import INDEXER_RECORDS, account
from hisparse_jax.kit import checks, two_level
from hisparse_jax.kit.two_level import TwoLevel
from hisparse_jax.train import forward

# As tests/kit/test_two_level.py: pages of 8 tokens over records of page_size 2, 3 candidates,
# 5 hot pages; fine keys of 16 dims in fp8 (a record: 8 x (16 + 4) = 160 bytes).
INDEXER = TwoLevel(page=8, candidates=3, coarse_dim=12, fine_dim=16, heads=2, hot_pages=5, fine_dtype="float8_e4m3fn")
FAMILY = kit.family(INDEXER)
SHAPES = dict(num_layers=2, page_size=2, top_k=6, hot_slots=8, max_context=64)
CONFIG = FAMILY.Config.tiny(**SHAPES)
WEIGHTS = FAMILY.init_weights(CONFIG, 0)
PARAMS = WEIGHTS.indexers[0]
PROMPTS = np.random.default_rng(0).integers(0, 256, (2, 40)).astype(np.int32)
LENGTHS = np.asarray([37, 20], np.int32)
STEPS = 6


def _h(seed=0, tokens=64):
    return jax.random.normal(jax.random.key(seed), (2, tokens, CONFIG.d_model), jnp.float32)


def test_records_are_the_one_quantizers_codes_and_scales_as_bytes():
    h = _h()
    positions = jnp.broadcast_to(jnp.arange(64, dtype=jnp.int32), (2, 64))
    values = checks.record_values(INDEXER, CONFIG, PARAMS, h, positions)
    assert values.dtype == jnp.uint8 and values.shape == (2, 64, 16 + 4)
    key = jnp.einsum("btd,de->bte", h, PARAMS["f_k"]).astype(CONFIG.dtype)  # the stored key, before quantizing
    codes, scale = fp8.quantize_rows(key.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(fp8.pack_rows(codes, scale)))
    np.testing.assert_array_equal(np.asarray(INDEXER.fine_values(values)).view(np.uint32),
                                  np.asarray(fp8.dequantize_rows(codes, scale)).view(np.uint32))


def test_training_scores_the_keys_decode_reads_back():
    """train_features' fine keys are, bit for bit, the records' keys as select reads them."""
    config = FAMILY.Config.tiny(num_layers=2, top_k=6, hot_slots=8, max_context=64)  # page_size 1
    h = _h(4)
    positions = jnp.arange(64, dtype=jnp.int32)
    features = checks.train_features(INDEXER, config, PARAMS, h, positions)
    stored = INDEXER.record_values(config, PARAMS, h, jnp.broadcast_to(positions, (2, 64)))
    np.testing.assert_array_equal(np.asarray(features["fine_keys"]).view(np.uint32),
                                  np.asarray(INDEXER.fine_values(stored)).view(np.uint32))
    bf16 = dataclasses.replace(INDEXER, fine_dtype=None)
    plain = checks.train_features(bf16, config, PARAMS, h, positions)["fine_keys"]
    assert not np.array_equal(np.asarray(plain), np.asarray(features["fine_keys"]))  # fp8 rounded them


def test_training_distills_the_fine_keys_through_the_rounding():
    config = FAMILY.Config.tiny(num_layers=1, top_k=6, hot_slots=8, max_context=64)
    weights = FAMILY.init_weights(config, 1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, 33)), jnp.int32)

    def kl(indexers):
        _, parts = forward.forward_loss(config, dataclasses.replace(weights, indexers=indexers), tokens,
                                        sparse=True, chunk=16)
        return jnp.sum(parts["kl"])

    value, grads = jax.value_and_grad(kl)(weights.indexers)
    assert np.isfinite(float(value)) and float(value) > 0
    for name, g in grads[0].items():
        assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).max() > 0, name


def test_hisparse_matches_device_bit_for_bit():
    hisparse, device = testing.assert_hisparse_matches_device(FAMILY, CONFIG, WEIGHTS, PROMPTS, LENGTHS, STEPS)
    assert hisparse.misses.sum() > 0
    h, d = hisparse.state, device.state
    assert h.index_tail[0].dtype == jnp.uint8
    assert np.asarray(h.index_store.cache.slot_record).max() >= 0, "the fine keys' hot buffer was never filled"
    np.testing.assert_array_equal(np.asarray(h.index_store.sealed), (LENGTHS + STEPS) // INDEXER.page)
    for x, y in zip(h.index_tail, d.index_tail):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_dense_matches_selecting_every_record():
    every = dataclasses.replace(INDEXER, candidates=8, hot_pages=8)
    family = kit.family(every)
    testing.assert_dense_matches_selecting_every_record(family, family.Config.tiny(**SHAPES), WEIGHTS, PROMPTS,
                                                        LENGTHS, 3)


def test_decode_program_is_clean():
    if not hisparse_jax.has_ffi():
        pytest.skip("the compiled-program checks need RESOLVE's handler (hisparse_jax.has_ffi())")
    testing.assert_clean_decode_program(FAMILY, CONFIG, WEIGHTS, batch=2, steps=2)


def test_byte_account_counts_fp8_fine_keys():
    """A fine record is page x (fine_dim + 4) bytes: host pool, hot buffer and open page."""
    cap = account(FAMILY, CONFIG, 1, "hisparse")
    fine_record = INDEXER.page * (INDEXER.fine_dim + 4)
    pages = -(-CONFIG.max_context // INDEXER.page)
    assert cap.total("host", INDEXER_RECORDS) == CONFIG.groups * pages * fine_record
    slots = INDEXER.hot_pages * (fine_record + 2 * 4)
    assert cap.by_category("device", per_request=True)[INDEXER_RECORDS] == CONFIG.groups * (slots + fine_record) + 4
    family = kit.family(dataclasses.replace(INDEXER, fine_dtype="bfloat16"))
    wide = account(family, family.Config.tiny(**SHAPES), 1, "hisparse")
    assert wide.total("host", INDEXER_RECORDS) == CONFIG.groups * pages * INDEXER.page * INDEXER.fine_dim * 2


def test_the_preset_halves_the_fine_key_page():
    preset = two_level.PAGE64_C64_FP8
    assert preset == dataclasses.replace(two_level.PAGE64_C64, fine_dtype="float8_e4m3fn")
    assert preset.name == "two-level-64x64-fp8"
    kind = preset.record_kind(None)
    assert (kind.page * kind.width, kind.dtype) == (64 * 68, "uint8")  # 4.25 KiB, bfloat16's is 8 KiB


def test_a_bad_fine_dtype_is_one_line_naming_the_knob():
    with pytest.raises(ValueError, match=r"^TwoLevel.fine_dtype: must be one of None, 'bfloat16', 'float8_e4m3fn', "
                                         r"got 'fp8'$"):
        dataclasses.replace(CONFIG, indexer=dataclasses.replace(INDEXER, fine_dtype="fp8"))


def test_the_decode_bench_counts_fp8_fine_key_io():
    """The decode bench's index IO per step: fine-key pages fetched x the fp8 page's bytes."""
    from types import SimpleNamespace

    from hisparse_jax.bench.decode import report

    timing = SimpleNamespace(index_misses_per_step=3.0)
    assert report.index_io_bytes(timing, CONFIG) == 3.0 * INDEXER.page * (INDEXER.fine_dim + 4)

"""DSA only: the shared indexer (IndexShare), the lightning indexer against a NumPy oracle, fp8
index keys, DSA's own config rules. What every family does is in test_families.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import CASES, assert_bitwise_equal

import hisparse_jax
from hisparse_jax.bench.decode.capacity import account
from hisparse_jax.models import dsa

CASE = CASES["dsa"]
SHARED = dict(num_layers=4, index_share=2, page_size=2, top_k=8, hot_slots=8)


def test_shared_indexer_with_pages_matches_device():
    config = CASE.config(**SHARED)
    hisparse = CASE.run(config, "hisparse")
    assert_bitwise_equal(hisparse, CASE.run(config, "device"))
    assert (hisparse.misses.sum(axis=(1, 2)) > 0).mean() >= 0.9


def test_layers_of_a_group_resolve_one_selection():
    """Layers of a group resolve the same ids from the same empty start, so they miss alike at
    every step; the two anchors select differently."""
    misses = CASE.run(CASE.config(**SHARED), "hisparse").misses  # [steps, L, b]
    np.testing.assert_array_equal(misses[:, 0], misses[:, 1])
    np.testing.assert_array_equal(misses[:, 2], misses[:, 3])
    assert not np.array_equal(misses[:, 0], misses[:, 2]), "both anchors always selected alike"


def test_fp8_index_keys_decode_alike_in_every_mode():
    config = CASE.config(index_dtype="fp8")
    hisparse = CASE.run(config, "hisparse")
    assert_bitwise_equal(hisparse, CASE.run(config, "device"))
    assert hisparse.state.index_keys[0].dtype == jnp.float8_e4m3fn
    assert hisparse.state.index_scale[0].dtype == jnp.float32
    # The selection follows the keys: fp8 keys rank differently from float32 ones somewhere.
    assert not np.array_equal(hisparse.misses, CASE.run(CASE.config(), "hisparse").misses)


def test_fp8_index_keys_are_132_bytes_per_token_in_the_account():
    config = dsa.Config.realistic(index_dtype="fp8")
    per_request = account(dsa, config, 1, "device").by_category("device", per_request=True)
    bf16 = account(dsa, dsa.Config.realistic(), 1, "device").by_category("device", per_request=True)
    tokens = config.groups * config.max_context
    assert per_request["indexer metadata"] == tokens * (128 + 4)
    assert bf16["indexer metadata"] == tokens * 128 * 2


def _oracle_record_scores(config, iw, h, keys, scale, sealed):
    """The indexer in float64 NumPy, straight from its definition (I = sum_j w_j relu(q_j . k))."""
    f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    h, w_q, w_head = f64(h), f64(iw.w_q), f64(iw.w_head)
    k = f64(keys) * (f64(scale)[..., None] if scale is not None else 1.0)
    q = np.einsum("bd,dje->bje", h, w_q)
    head = np.einsum("bd,dj->bj", h, w_head) / math.sqrt(config.index_heads * config.index_dim)
    tokens = np.einsum("bj,bjs->bs", head, np.maximum(np.einsum("bje,bse->bjs", q, k), 0.0))
    b, P = tokens.shape[0], config.page_size
    records = tokens.reshape(b, -1, P).max(-1)
    return np.where(np.arange(records.shape[1]) < np.asarray(sealed)[:, None], records, -np.inf)


@pytest.mark.parametrize("overrides", [dict(), dict(page_size=4), dict(index_dtype="fp8")],
                         ids=["tokens", "pages", "fp8"])
def test_indexer_scores_match_a_numpy_oracle(overrides):
    config = dsa.Config.tiny(**overrides)
    iw = dsa.init_weights(config, 0).indexers[0]  # the layout apart (the decode layout merges w_q, w_k, w_head)
    rng = np.random.default_rng(0)
    b = 3
    h = jnp.asarray(rng.standard_normal((b, config.d_model)), config.dtype)
    keys, scale = dsa.index_key(config, iw, jnp.asarray(rng.standard_normal((b, config.max_context, config.d_model)),
                                                        config.dtype))
    sealed = jnp.asarray([0, 5, config.num_records], jnp.int32)
    got = np.asarray(dsa.record_scores(config, iw, h, keys, scale, sealed))
    want = _oracle_record_scores(config, iw, h, keys, scale, sealed)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)  # -inf past the sealed records
    bound = np.abs(want[finite]).max()
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5 * bound)


def test_fp8_keys_are_the_quantized_layer_norm():
    config = dsa.Config.tiny(index_dtype="fp8")
    iw = dsa.init_weights(config, 0).indexers[0]  # the layout apart (the decode layout merges w_q, w_k, w_head)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 5, config.d_model)), jnp.float32)
    keys, scale = dsa.index_key(config, iw, x)
    exact, none = dsa.index_key(dsa.Config.tiny(), iw, x)
    assert none is None and keys.shape == exact.shape and scale.shape == exact.shape[:-1]
    restored = np.asarray(keys.astype(jnp.float32)) * np.asarray(scale)[..., None]
    # e4m3 keeps 3 mantissa bits: within 2^-4 of each value's magnitude, relative to the row's max.
    err = np.abs(restored - np.asarray(exact)) / np.abs(np.asarray(exact)).max(-1, keepdims=True)
    assert err.max() <= 2.0**-4


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=300, hot_slots=300), "top_k"),  # k > records of the context
        (dict(index_share=3), "index_share"),
        (dict(n_heads=0), "n_heads"),
        (dict(qk_rope_dim=7), "qk_rope_dim"),
        (dict(kv_lora_rank=33, qk_rope_dim=8, dtype="bfloat16"), "kv_lora_rank"),  # 82-byte records
        (dict(index_dtype="int8"), "index_dtype"),
    ],
)
def test_bad_configs_fail_at_construction(overrides, field):
    with pytest.raises(ValueError, match=rf"Config\.{field}\b"):
        dsa.Config.tiny(**overrides)


def test_realistic_shapes():
    real = dsa.Config.realistic()
    assert real.record_width == 576 and real.record_bytes == 1152
    cache = real.cache_config(8)
    assert cache.stream_shape == (8,) and cache.pool_records == real.max_context


def test_indexer_rope_decodes_alike_in_every_mode_and_changes_the_selection():
    config = CASE.config(index_rope_dim=8)
    hisparse = CASE.run(config, "hisparse")
    assert_bitwise_equal(hisparse, CASE.run(config, "device"))
    assert not np.array_equal(hisparse.misses, CASE.run(CASE.config(), "hisparse").misses)


@pytest.mark.parametrize("value", [3, -2, 18, True])
def test_indexer_rope_dim_is_checked(value):
    with pytest.raises(ValueError, match="Config.index_rope_dim: must be an even int in"):
        dsa.Config.tiny(index_rope_dim=value)


def test_indexer_rope_needs_positions():
    config = dsa.Config.tiny(index_rope_dim=8)
    iw = dsa.init_weights(config, 0).indexers[0]
    with pytest.raises(ValueError, match="pass positions"):
        dsa.index_key(config, iw, jnp.zeros((2, config.d_model), config.dtype))


# --------------------------------------------------------------------------- the attention kernel

# The smallest DSA model in the sparse attention kernel's domain: bf16 records of 512 latent + 64
# rope, 64 heads, k * page_size = 512.
KERNEL_SHAPED = dict(n_heads=64, qk_nope_dim=16, qk_rope_dim=64, v_head_dim=16, kv_lora_rank=512, dtype="bfloat16",
                     num_layers=2, max_context=1024, top_k=512, hot_slots=520, prefill_chunk=64)


def test_attention_implementation_is_checked():
    with pytest.raises(ValueError, match="attention_implementation"):
        dsa.Config.tiny(attention_implementation="cuda")


def test_attention_kernel_domain_names_what_is_outside_it():
    assert dsa.attention_kernel_domain(dsa.Config.tiny(**KERNEL_SHAPED), "hisparse") == ""
    assert dsa.attention_kernel_domain(dsa.Config.tiny(**KERNEL_SHAPED), "device") == ""
    assert dsa.attention_kernel_domain(dsa.Config.tiny(**KERNEL_SHAPED), "dense") == ""  # k = 1024 records
    assert "latent" in dsa.attention_kernel_domain(dsa.Config.tiny(), "hisparse")
    assert "bfloat16" in dsa.attention_kernel_domain(dsa.Config.tiny(**dict(KERNEL_SHAPED, dtype="float32")), "device")
    assert "n_heads=16" in dsa.attention_kernel_domain(dsa.Config.realistic(), "hisparse")
    assert "multiple of 512" in dsa.attention_kernel_domain(
        dsa.Config.tiny(**dict(KERNEL_SHAPED, top_k=256, hot_slots=256)), "hisparse")
    assert "one batch axis" in dsa.attention_kernel_domain(dsa.Config.tiny(**KERNEL_SHAPED), "hisparse", 2)


def test_attention_kernel_runs_where_asked_and_able():
    config = lambda impl, **o: dsa.Config.tiny(**dict(KERNEL_SHAPED, **o), attention_implementation=impl)
    assert not dsa.uses_attention_kernel(config("reference"), "hisparse")
    assert not dsa.uses_attention_kernel(config("auto", n_heads=32), "hisparse")  # outside its domain
    cuda = jax.default_backend() == "gpu" and hisparse_jax.built_with_cuda()
    assert dsa.uses_attention_kernel(config("auto"), "device") == cuda  # on CPU: XLA
    if cuda:
        assert dsa.uses_attention_kernel(config("ffi"), "dense")
        with pytest.raises(ValueError, match="n_heads=32"):
            dsa.uses_attention_kernel(config("ffi", n_heads=32), "hisparse")
    else:
        with pytest.raises(RuntimeError, match="sparse_attention"):
            dsa.uses_attention_kernel(config("ffi"), "device")


@pytest.mark.gpu
def test_the_attention_kernel_decodes_alike_in_every_mode():
    """With the kernel ("ffi") HiSparse (hot buffer by slot) == device KV (by record id) and
    "dense" == a selection of every record, bit for bit; its outputs are XLA's to bf16 rounding."""
    ffi = CASE.config(**KERNEL_SHAPED, attention_implementation="ffi")
    hisparse = CASE.run(ffi, "hisparse")
    assert_bitwise_equal(hisparse, CASE.run(ffi, "device"))
    every = CASE.config(**dict(KERNEL_SHAPED, top_k=1024, hot_slots=1024), attention_implementation="ffi")
    assert_bitwise_equal(CASE.run(every, "hisparse"), CASE.run(every, "dense"))
    xla = CASE.run(CASE.config(**KERNEL_SHAPED, attention_implementation="reference"), "hisparse")
    np.testing.assert_array_equal(hisparse.prefill_logits, xla.prefill_logits)  # prefill reads no record
    first, want = np.asarray(hisparse.logits[0], np.float32), np.asarray(xla.logits[0], np.float32)
    assert np.abs(first - want).max() <= 0.05 * np.abs(want).max(), "the kernel's first step is not XLA's"

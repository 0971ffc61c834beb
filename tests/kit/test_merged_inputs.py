"""The decode layout of the kit's weights (hisparse_jax.kit.inputs): each layer's projections of
its normed input (w_q_a / w_q, w_kv, at an anchor layer the indexer's input_weights) in one
matrix, made once at load. What could go wrong: a piece in the wrong columns or of the wrong
shape or dtype, an indexer's weights merged at a layer that is not its group's anchor, a
checkpoint written in the merged layout, an old checkpoint that no longer loads. Decoding with
merged weights (HiSparse == full-KV bit for bit, no per-step copy) is checked by the model tests,
which run DSA in this layout (tests/models/model_helpers.weights_for)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from my_indexers import Recent

from hisparse_jax import decode, kit
from hisparse_jax.kit import inputs
from hisparse_jax.models import dsa, layers, products
from hisparse_jax.models.family import decode_weights, in_decode_layout
from hisparse_jax.train.checkpoint import load_model, save_model

SHIPPED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-02-h200" / "trace-model" / "model.npz"


def _config(**overrides):
    """Two layers sharing one selection: an anchor (its indexer merged too) and a layer that is not."""
    return dsa.Config.tiny(**{**dict(num_layers=2, index_share=2, q_lora_rank=16), **overrides})


def _assert_same_tree(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_merge_puts_each_piece_in_its_layer_and_split_gives_the_weights_back():
    # the low-rank query here; the model tests decode the tiny preset's w_q merged
    config = _config()
    q_lora_rank = config.q_lora_rank
    w = dsa.init_weights(config, 0)
    merged = decode_weights(dsa.FAMILY, config, w)
    query = "w_q_a" if q_lora_rank else "w_q"
    for i, layer in enumerate(merged.layers):
        names = [name for _, name, _ in layer.inputs.pieces]
        anchor = i % config.index_share == 0
        assert names == [query, "w_kv", *(("w_q", "w_k", "w_head") if anchor else ())], (i, names)
        assert getattr(layer, query) is None and layer.w_kv is None
        # the columns hold the pieces in order: the layer's, then its group's indexer's
        source = w.layers[i]
        apart = [getattr(source, query), source.w_kv]
        if anchor:
            iw = w.indexers[i // config.index_share]
            apart += [iw.w_q, iw.w_k, iw.w_head]
        want = np.concatenate([np.asarray(a).reshape(config.d_model, -1) for a in apart], axis=1)
        np.testing.assert_array_equal(np.asarray(layer.inputs.w), want)
    for iw in merged.indexers:
        assert iw.w_q is None and iw.w_k is None and iw.w_head is None and iw.k_scale is not None
    assert decode_weights(dsa.FAMILY, config, merged) is merged  # merging twice changes nothing
    _assert_same_tree(inputs.split(config, merged), w)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_products_have_the_separate_projections_shapes_dtypes_and_values(dtype):
    """One matmul, then slices: each product has the shape and dtype of the einsum it replaces,
    equals the merged matmul's columns bit for bit, and the separate einsum within rounding (the
    wider matmul may sum in another order; both decode modes read the same merged weights)."""
    config = _config(dtype=dtype)
    w = dsa.init_weights(config, 0)
    merged = decode_weights(dsa.FAMILY, config, w)
    h = jax.random.normal(jax.random.PRNGKey(3), (3, config.d_model), jnp.float32).astype(dtype)
    layer, params = inputs.apply(merged.layers[0], merged.indexers[0], h)
    assert layer.inputs is None
    y = np.asarray(jnp.einsum("md,dn->mn", h, merged.layers[0].inputs.w, preferred_element_type=jnp.float32))
    iw = w.indexers[0]
    cases = [("...d,dr->...r", layer.w_q_a, w.layers[0].w_q_a, {}), ("...d,dw->...w", layer.w_kv, w.layers[0].w_kv, {}),
             ("...d,dje->...je", params.w_q, iw.w_q, {}), ("...d,de->...e", params.w_k, iw.w_k, {}),
             ("...d,dj->...j", params.w_head, iw.w_head, dict(preferred_element_type=jnp.float32))]
    start = 0
    for spec, product, weight, kwargs in cases:
        assert isinstance(product, products.Product)
        got = products.project(spec, h, product, **kwargs)
        want = layers.weight_einsum(spec, h, weight, **kwargs)
        assert got.shape == want.shape and got.dtype == want.dtype, (spec, got.shape, got.dtype, want.dtype)
        width = int(np.prod(weight.shape[1:]))
        columns = y[:, start:start + width].reshape(got.shape).astype(got.dtype)
        np.testing.assert_array_equal(np.asarray(got), columns)
        tol = 1e-5 if dtype == "float32" else 1e-2
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
        start += width
    assert start == y.shape[1]
    # a token written at prefill shape [b, 1, D] reads the same rows
    key = products.project("...d,de->...e", h[:, None], params.w_k)
    assert key.shape == (3, 1, config.indexer.dim)
    with pytest.raises(ValueError, match="computed from another h"):
        products.project("...d,de->...e", h[:2], params.w_k)


def test_each_kit_indexer_merges_what_it_lists():
    """PageMinMax lists its three projections; an indexer that lists none (tests/kit/my_indexers.py's
    Recent, which selects by position alone) leaves the layers' pieces alone."""
    pieces = lambda w: [[name for _, name, _ in layer.inputs.pieces] for layer in w.layers]
    family = kit.family(kit.PageMinMax())
    config = family.Config.tiny(num_layers=2)
    merged = decode_weights(family, config, family.init_weights(config, 0))
    assert pieces(merged) == [["w_q", "w_kv", "w_k", "w_q", "w_head"]] * 2
    assert all(group == {"w_k": None, "w_q": None, "w_head": None} for group in merged.indexers)
    family = kit.family(Recent())
    config = family.Config.tiny(num_layers=2)
    assert pieces(decode_weights(family, config, family.init_weights(config, 0))) == [["w_q", "w_kv"]] * 2


def test_a_merged_save_writes_the_checkpoint_layout(tmp_path):
    config = _config(dtype="float32")
    w = dsa.init_weights(config, 1)
    save_model(tmp_path / "apart.npz", config, w)
    save_model(tmp_path / "merged.npz", config, decode_weights(dsa.FAMILY, config, w))
    header = lambda p: json.loads(np.load(p)["header"].tobytes())
    assert header(tmp_path / "merged.npz") == header(tmp_path / "apart.npz")  # leaves and content hash
    _, loaded, _ = load_model(tmp_path / "merged.npz")
    _assert_same_tree(loaded, w)


@pytest.mark.skipif(not SHIPPED.is_file(), reason="the shipped trace model is not in this tree")
def test_a_checkpoint_written_before_the_merged_layout_loads_and_merges():
    config, w, _ = load_model(SHIPPED, dtype="float32")
    merged = decode_weights(dsa.FAMILY, config, w)
    assert all(layer.inputs is not None for layer in merged.layers)
    _assert_same_tree(inputs.split(config, merged), w)


def test_generate_warns_on_a_gpu_when_the_weights_are_not_in_the_decode_layout(monkeypatch):
    """On a GPU XLA's dot merger concatenates separate input projections every step (a weight copy
    the decode layout avoids): generate says so once per call site; CPUs and merged weights are quiet."""
    config = _config(dtype="float32")
    w = dsa.init_weights(config, 0)
    merged = decode_weights(dsa.FAMILY, config, w)
    assert not in_decode_layout(dsa.FAMILY, config, w) and in_decode_layout(dsa.FAMILY, config, merged)
    assert in_decode_layout("nsa", None, object())  # a family without a decode layout takes any weights
    with pytest.warns(UserWarning, match=r"^generate: the dsa weights are not in the family's decode layout"):
        decode.warn_unless_decode_layout(dsa.FAMILY, config, w, "gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decode.warn_unless_decode_layout(dsa.FAMILY, config, merged, "gpu")
        decode.warn_unless_decode_layout(dsa.FAMILY, config, w, "cpu")
    # The same weights again (a timed decode loop): remembered, not flattened and traced again.
    monkeypatch.setattr(decode, "in_decode_layout", lambda *_: pytest.fail("checked the same weights again"))
    decode.warn_unless_decode_layout(dsa.FAMILY, config, merged, "gpu")

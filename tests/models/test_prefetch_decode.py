"""Decode with prefetch (Config.prefetch: each layer's misses copied off the compute stream and
joined before the layer reads them) gives the same bits as without, and as the device mode.

DSA with a shared indexer (index_share 2 and 4: a group resolves all its layers at the anchor,
so the copies of its later layers overlap the earlier layers), and Quest (per-head streams, a
dense layer). The compiled program runs one resolve_prefetch and one join per sparse layer per
step, no plain RESOLVE, and copies no weight-, key-, KV- or hot-buffer-sized array.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from model_helpers import CASES, STEPS, assert_bitwise_equal
from program_helpers import IN_PLACE, assert_no_big_copies, traced

from hisparse_jax import hlo, testing

SHARED = [2, 4]


def _dsa(index_share: int, **overrides):
    return CASES["dsa"].config(num_layers=4, index_share=index_share, **overrides)


def _assert_same_state(a, b):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        x, y = np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y))
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"state{jax.tree_util.keystr(path)} differs"


@pytest.mark.parametrize("index_share", SHARED)
def test_dsa_prefetch_gives_the_same_bits(index_share):
    case = CASES["dsa"]
    with_prefetch = case.run(_dsa(index_share, prefetch=True), "hisparse")
    without = case.run(_dsa(index_share), "hisparse")
    assert_bitwise_equal(with_prefetch, without)
    np.testing.assert_array_equal(with_prefetch.misses, without.misses)
    assert with_prefetch.misses.sum() > 0, "nothing was fetched: the test would prove nothing"
    _assert_same_state(with_prefetch.state, without.state)
    assert_bitwise_equal(with_prefetch, case.run(_dsa(index_share), "device"))


def test_quest_prefetch_gives_the_same_bits():
    case = CASES["quest"]
    with_prefetch = case.run(case.config(prefetch=True), "hisparse")
    without = case.run(case.config(), "hisparse")
    assert_bitwise_equal(with_prefetch, without)
    np.testing.assert_array_equal(with_prefetch.misses, without.misses)
    _assert_same_state(with_prefetch.state, without.state)


def test_prefetch_program(ffi_backend):
    if not ffi_backend:
        pytest.skip(f"no RESOLVE FFI handler on {jax.default_backend()}: resolve runs the JAX reference")
    case = CASES["dsa"]
    config = _dsa(2, prefetch=True)
    testing.assert_one_resolve_per_sparse_layer_per_step(traced(case, config), config, STEPS)

    program = assert_no_big_copies(case, config, "hisparse")
    cache = config.cache_config(len(case.lengths))
    hot = hlo.shape_text(cache.hot_shape, cache.dtype)
    bad = [f"{name} = {shape} {opcode}" for name, shape, opcode, root in program.materialized()
           if hlo.array_type(shape) == hot and opcode not in IN_PLACE]
    assert not bad, "the hot buffer is copied (a copy between a resolve and its join would read it early):\n" + \
        "\n".join(bad)

"""Indexers on the kit decode exactly in every mode and compile to a clean step, through the
checks a researcher runs (hisparse_jax.testing): the Quest-style PageMinMax shipped with the kit,
and two indexers written outside the package (tests/kit/my_indexers.py: one selecting its own
ids, one scoring, one without parameters or metadata)."""

from __future__ import annotations

import numpy as np
import pytest
from my_indexers import KeyNorm, Recent

import hisparse_jax
from hisparse_jax import kit, testing
from hisparse_jax.kit.page_minmax import PageMinMax

# (indexer, Config.tiny overrides): k < B < records, so LRU evicts every step; between them
# page_size 1, 2 and 4 and index_share 1 and 2.
CASES = {
    "page-minmax": (PageMinMax(page=12, dim=16, heads=2),  # 64 tokens: a partial last page
                    dict(num_layers=2, index_share=2, page_size=2, top_k=6, hot_slots=8, max_context=64)),
    "recent": (Recent(sink=2), dict(num_layers=2, top_k=8, hot_slots=10, max_context=64)),
    # max_context 80: KeyNorm's [b, max_context] norms then differ in type from every activation
    # (the copy check of assert_clean_decode_program goes by array type).
    "key-norm": (KeyNorm(dim=8), dict(num_layers=2, page_size=4, top_k=4, hot_slots=6, max_context=80)),
}
PROMPTS = np.random.default_rng(0).integers(0, 256, (2, 40)).astype(np.int32)
LENGTHS = np.asarray([37, 20], np.int32)
STEPS = 4


def _model(name):
    indexer, overrides = CASES[name]
    family = kit.family(indexer)
    config = family.Config.tiny(**overrides)
    return family, config, family.init_weights(config, 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hisparse_matches_device_and_dense_matches_every_record(name):
    family, config, weights = _model(name)
    hisparse, _ = testing.assert_hisparse_matches_device(family, config, weights, PROMPTS, LENGTHS, STEPS)
    assert hisparse.misses.sum() > 0, "no record was fetched: the comparison never saw the cache work"
    testing.assert_dense_matches_selecting_every_record(family, config, weights, PROMPTS, LENGTHS, STEPS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decode_program_is_clean(name):
    if not hisparse_jax.has_ffi():
        pytest.skip("the compiled-program checks need RESOLVE's handler (hisparse_jax.has_ffi())")
    family, config, weights = _model(name)
    testing.assert_clean_decode_program(family, config, weights, batch=2, steps=2)


def test_a_family_is_one_value_per_indexer():
    """jit keys on the Family and Config: the same indexer must give the same values."""
    assert kit.family(PageMinMax(page=8)) is kit.family(PageMinMax(page=8))
    assert kit.family(PageMinMax(page=8)) != kit.family(PageMinMax(page=16))
    config = kit.family(PageMinMax(page=8)).Config.tiny()
    assert config.indexer == PageMinMax(page=8) and kit.family(Recent()).name == "Recent"

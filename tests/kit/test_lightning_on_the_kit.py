"""DSA is the kit's model with the lightning indexer, not a model of its own: the same indexer
through `kit.family`, given DSA's weights, decodes DSA's tokens and logits bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np

from hisparse_jax import kit, testing
from hisparse_jax.models import dsa

DSA = dsa.Config.tiny(num_layers=2, index_share=2, page_size=2, top_k=6, hot_slots=8, max_context=64,
                      index_rope_dim=8, index_dtype="fp8")
LIGHTNING = [f.name for f in dataclasses.fields(dsa.Config) if f.name.startswith("index")
             and f.name != "index_share"] + ["indexer_implementation"]
PROMPTS = np.random.default_rng(1).integers(0, 256, (2, 40)).astype(np.int32)
LENGTHS = np.asarray([37, 20], np.int32)


def test_kit_family_of_the_lightning_indexer_is_dsa():
    family = kit.family(DSA.indexer)
    fields = {f.name: getattr(DSA, f.name) for f in dataclasses.fields(dsa.Config) if f.name not in LIGHTNING}
    config = family.Config(**fields)
    assert config.indexer == dsa.LightningIndexer(heads=4, dim=16, dtype="fp8", rope_dim=8)
    weights = dsa.init_weights(DSA, 0)  # the same pytree type: kit.weights.Weights
    ours = testing.run_decode(family, config, weights, "hisparse", PROMPTS, LENGTHS, steps=4)
    theirs = testing.run_decode(dsa.FAMILY, DSA, weights, "hisparse", PROMPTS, LENGTHS, steps=4)
    testing.assert_runs_equal(ours, theirs, ("kit.family(LightningIndexer)", "dsa.FAMILY"))
    assert ours.misses.sum() > 0
    # The kit draws the indexer apart from the model (per group), DSA in its one draw.
    drawn = family.init_weights(config, 0)
    np.testing.assert_array_equal(np.asarray(drawn.embed), np.asarray(weights.embed))
    assert not np.array_equal(np.asarray(drawn.indexers[0].w_k), np.asarray(weights.indexers[0].w_k))


def test_lightning_train_scores_are_what_decode_scores():
    """Training's I[t, s] for past tokens s is the score decode gives record s at step t
    (page_size 1, keys in the model dtype: the shapes training runs)."""
    import jax
    import jax.numpy as jnp

    from hisparse_jax.kit import checks

    config = dsa.Config.tiny(num_layers=1, top_k=4, hot_slots=6, max_context=32, index_rope_dim=8)
    indexer, params = config.indexer, dsa.init_weights(config, 3).indexers[0]
    T = config.max_context
    h = jax.random.normal(jax.random.key(0), (2, T, config.d_model), jnp.float32)
    positions = jnp.arange(T, dtype=jnp.int32)
    features = checks.train_features(indexer, config, params, h, positions)
    train = np.asarray(checks.train_scores(indexer, config, params, features, positions, 8, 16))  # queries 8..23
    meta = indexer.write(config, params, indexer.init_metadata(config, 2), h, jnp.broadcast_to(positions, (2, T)),
                         jnp.ones((2, T), bool))
    for t in (8, 15, 23):
        decode = np.asarray(indexer.score(config, params, meta, h[:, t], jnp.full((2,), t), jnp.full((2,), t)))
        np.testing.assert_allclose(train[:, t - 8, :t], decode[:, :t], rtol=1e-5, atol=1e-6)

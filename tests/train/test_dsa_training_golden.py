"""DSA trains as it did before the training forward took any protocol indexer: the same bits.

The figures below were recorded from main's hisparse_jax.train (commit 186b06d, where the
forward computed the lightning indexer's keys itself) on XLA:CPU, by the same code as the tests
below, with XLA's optimizations on and off (the suite runs with them off when tests/models or
tests/kit are collected in the same process). The forward now reaches the indexer through
`LightningIndexer.train_features` (its keys, queries and head weights, once per layer, outside
the blocks) and `train_scores` (the block's two einsums): the losses, the KLs and the whole
history of a short tiny plan are the same float32 values, compared exactly. XLA:CPU compiles
for the host, so another kind of CPU may round differently; a GPU does (the test is skipped
there).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax.models import dsa
from hisparse_jax.train import fit as fit_lib
from hisparse_jax.train.corpus import Corpus
from hisparse_jax.train.forward import forward_loss

# Main's figures under each XLA setting the suite runs with (tests/models/conftest.py and
# tests/kit/conftest.py turn most optimizations off for the whole process; a file run alone keeps
# them): forward = forward_loss(tiny, dsa.init_weights(config, 3), random tokens [2, 65] of seed
# 0, chunk 32) as (loss, lm, [KL per layer]) with dense and sparse attention; history = fit on
# the tiny plan, 4 steps a phase, on the synthetic corpus below: (lm, mean KL) per step;
# held_out = (dense lm, sparse lm) after each phase.
GOLDEN = {
    False: dict(
        forward={"dense": (6.381957530975342, 6.065878868103027, [0.3705980181694031, 0.26155969500541687]),
                 "sparse": (6.2743611335754395, 6.039999485015869, [0.2856499254703522, 0.1830730140209198])},
        history=[
            (6.317201137542725, 0.21632501482963562),
            (5.890330791473389, 0.23808395862579346),
            (5.2103190422058105, 0.21465936303138733),
            (4.562573432922363, 0.16968759894371033),
            (4.049176216125488, 0.17550337314605713),
            (3.791736125946045, 0.1704423427581787),
            (3.5804800987243652, 0.1595916897058487),
            (3.3302502632141113, 0.15384651720523834),
            (3.416597366333008, 0.13133086264133453),
            (3.338656425476074, 0.11461503803730011),
            (3.043632745742798, 0.12136326730251312),
            (2.824280023574829, 0.11892060935497284),
        ],
        held_out=[(4.002669811248779, 4.119524955749512), (3.1842501163482666, 3.3596816062927246),
                  (2.7321338653564453, 2.8433852195739746)],
    ),
    True: dict(
        forward={"dense": (6.381957530975342, 6.065878868103027, [0.3705980181694031, 0.26155972480773926]),
                 "sparse": (6.2743611335754395, 6.039999485015869, [0.285649836063385, 0.1830730140209198])},
        history=[
            (6.317201137542725, 0.21632498502731323),
            (5.890329837799072, 0.23808398842811584),
            (5.2103190422058105, 0.21465939283370972),
            (4.562572479248047, 0.16968762874603271),
            (4.049176216125488, 0.17550332844257355),
            (3.7917356491088867, 0.1704423576593399),
            (3.580479621887207, 0.1595917046070099),
            (3.3302502632141113, 0.15384654700756073),
            (3.4165968894958496, 0.13133087754249573),
            (3.3386566638946533, 0.11461500823497772),
            (3.0436325073242188, 0.12136329710483551),
            (2.82427978515625, 0.11892060935497284),
        ],
        held_out=[(4.002669334411621, 4.119524955749512), (3.1842501163482666, 3.3596813678741455),
                  (2.7321338653564453, 2.8433852195739746)],
    ),
}
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="recorded on XLA:CPU")


def _golden() -> dict:
    return GOLDEN[bool(jax.config.read("jax_disable_most_optimizations"))]


def synthetic_corpus(folder) -> Corpus:
    """12 documents of seeded words (the same bytes on every machine, unlike the standard library)."""
    rng = np.random.default_rng(7)
    words = [w.encode() for w in ("the of and to in is that for it as with was on be by at this are from or an "
                                  "which have not").split()]
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_bytes(b" ".join(words[j] for j in rng.integers(0, len(words), 700)))
    return Corpus.from_roots([folder], held_out_fraction=0.25)


@pytest.mark.parametrize("attention", ["dense", "sparse"])
def test_the_forward_gives_mains_losses(attention):
    config = fit_lib.model_config("tiny")
    weights = dsa.init_weights(config, 3)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 65)), jnp.int32)
    loss, parts = forward_loss(config, weights, tokens, sparse=attention == "sparse", chunk=32)
    want_loss, want_lm, want_kl = _golden()["forward"][attention]
    assert [float(loss), float(parts["lm"])] == [want_loss, want_lm]
    assert np.asarray(parts["kl"]).tolist() == want_kl


def test_fit_gives_mains_training_history(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    plan = fit_lib.PLANS["tiny"]
    plan = dataclasses.replace(plan, log_every=1, phases=tuple(dataclasses.replace(p, steps=4) for p in plan.phases))
    _, history, summary = fit_lib.fit(fit_lib.model_config("tiny"), plan, synthetic_corpus(root), log=lambda m: None)
    assert [(h["lm"], h["kl"]) for h in history] == _golden()["history"]
    assert [(p["evaluation"]["dense"]["lm"], p["evaluation"]["sparse"]["lm"]) for p in summary["phases"]] == \
        _golden()["held_out"]

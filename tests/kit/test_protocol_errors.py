"""Indexer code that breaks the protocol gets one line naming the method or field it breaks and
the fix, when the family is built or the step traced (jax.eval_shape here: nothing compiles)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from my_indexers import KeyNorm, Norms, Recent

from hisparse_jax import kit, layout
from hisparse_jax.kit import IndexerError
from hisparse_jax.kit.page_minmax import PageMinMax

TINY = dict(num_layers=2, top_k=4, hot_slots=6, max_context=32)


def _trace(indexer, mode: str = "device"):
    """Builds the family and traces init_state, prefill and one decode step of it."""
    family = kit.family(indexer)
    config = family.Config.tiny(**TINY)
    weights = jax.eval_shape(lambda: family.init_weights(config, 0))

    def run(weights):
        state = family.init_state(config, 2, mode)
        state, _ = family.prefill(config, weights, state, jnp.zeros((2, 8), jnp.int32), jnp.full((2,), 8, jnp.int32))
        return family.decode_step(config, weights, state, jnp.zeros((2,), jnp.int32)).logits

    return jax.eval_shape(run, weights)


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Undeclared:
    norm: jax.Array  # no layout.field


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WrongCategory:
    norm: jax.Array = layout.field(layout.KV_RECORDS, batch_axis=0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Shadowing:
    lengths: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)


@dataclasses.dataclass(frozen=True)
class Unregistered:
    norm: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)


def _metadata(make):
    """A KeyNorm whose init_metadata returns make(zeros [b, T])."""
    @dataclasses.dataclass(frozen=True)
    class Bad(KeyNorm):
        def init_metadata(self, config, batch):
            return make(jnp.zeros((batch, config.max_context), jnp.float32))
    return Bad()


def _returns(method, value):
    """A KeyNorm (or Recent, for select) whose `method` returns value(good result, args)."""
    base = Recent if method == "select" else KeyNorm
    good = getattr(base, method)
    Bad = dataclasses.dataclass(frozen=True)(type("Bad", (base,), {method: lambda self, *a: value(good(self, *a), a)}))
    return Bad()


CASES = {
    "score shape": (_returns("score", lambda s, a: s[:, :-1]),
                    r"^Bad\.score: returned shape \(2, 31\), expected \[b, R\] = \(2, 32\): one float32 score "
                    r"per record"),
    "score dtype": (_returns("score", lambda s, a: s.astype(jnp.bfloat16)),
                    r"^Bad\.score: returned dtype bfloat16, expected float32 \(cast with \.astype\(jnp\.float32\)\)"),
    "select floats": (_returns("select", lambda s, a: s.astype(jnp.float32)),
                      r"^Bad\.select: returned dtype float32, expected int32 \(record ids must be integers\)"),
    "select shape": (_returns("select", lambda s, a: s[:, :2]),
                     r"^Bad\.select: returned shape \(2, 2\), expected \[b, k\] = \(2, 4\)"),
    "select not an array": (_returns("select", lambda s, a: [1, 2]), r"^Bad\.select: returned a list"),
    "write dtype": (_returns("write", lambda m, a: Norms(m.norm.astype(jnp.bfloat16))),
                    r"^Bad\.write: returned field norm bfloat16 \[2, 32\], expected float32 \[2, 32\]"),
    "write type": (_returns("write", lambda m, a: {"norm": m.norm}),
                   r"^Bad\.write: returned a dict, expected the Norms"),
    "init_params leaf": (_returns("init_params", lambda p, a: {**p, "size": 3}),
                         r"^Bad\.init_params: leaf \['size'\] is a int; parameters are a pytree of arrays"),
    "undeclared field": (_metadata(Undeclared), r"^Bad\.init_metadata: field Undeclared\.norm declares no layout; "
                                                r"declare it with layout\.field\(layout\.INDEXER_METADATA"),
    "wrong category": (_metadata(WrongCategory), r"^Bad\.init_metadata: field WrongCategory\.norm is declared "
                                                 r"'kv records'"),
    "shadowing field": (_metadata(Shadowing), r"^Bad\.init_metadata: field Shadowing\.lengths shadows the model "
                                              r"State's own 'lengths'; rename it"),
    "unregistered metadata": (_metadata(Unregistered), r"^Bad\.init_metadata: Unregistered is not a registered "
                                                       r"pytree; decorate it with @jax\.tree_util\.register_dataclass"),
    "metadata not a dataclass": (_metadata(lambda z: {"norm": z}), r"^Bad\.init_metadata: returned a dict"),
    "metadata batch axis": (_metadata(lambda z: Norms(z.T)),
                            r"^Bad\.init_metadata: field Norms\.norm has shape \(32, 2\), expected axis 0 = batch = 2"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_returns_name_the_method_and_the_fix(case):
    indexer, message = CASES[case]
    with pytest.raises(IndexerError, match=message) as error:
        _trace(indexer)
    _one_line(error)


def test_train_scores_shape_is_checked():
    from hisparse_jax.kit import checks

    indexer = _returns("train_scores", lambda s, a: jnp.zeros((2, 3, 5), jnp.float32))
    config = kit.family(indexer).Config.tiny(**TINY)
    with pytest.raises(IndexerError, match=r"^Bad\.train_scores: returned shape \(2, 3, 5\), expected "
                                           r"\[b, chunk, T\] = \(2, 4, 16\)") as error:
        checks.train_scores(indexer, config, {}, jnp.zeros((2, 16, config.d_model)), jnp.arange(16), 0, 4)
    _one_line(error)
    indexer = _returns("train_features", lambda f, a: (f, 3))
    with pytest.raises(IndexerError, match=r"^Bad\.train_features: leaf \[1\] is a int; return a pytree of arrays "
                                           r"with the batch b = 2 on axis 0") as error:
        checks.train_features(indexer, config, {}, jnp.zeros((2, 16, config.d_model)), jnp.arange(16))
    _one_line(error)


@dataclasses.dataclass(frozen=True)
class Both(KeyNorm):
    def select(self, *args):
        return None


@dataclasses.dataclass(frozen=True)
class Neither(kit.Indexer):
    pass


@dataclasses.dataclass(frozen=True)
class HalfMetadata(Recent):
    def write(self, config, params, metadata, *args):
        return metadata


@dataclasses.dataclass(frozen=True)
class Unhashable(KeyNorm):
    sizes: list = dataclasses.field(default_factory=lambda: [1, 2])


class NotDataclass(KeyNorm):
    window = 4


@pytest.mark.parametrize("indexer,message", [
    (Both(), r"^Both: defines both of score and select; define exactly one"),
    (Neither(), r"^Neither: defines neither of score and select; define exactly one"),
    (HalfMetadata(), r"^HalfMetadata\.init_metadata: not defined, but write is"),
    (Unhashable(), r"^Unhashable\.sizes: holds an unhashable list; .* use a tuple"),
    (NotDataclass(), r"^NotDataclass: not a frozen dataclass of its own; decorate the class with "
                     r"@dataclasses\.dataclass\(frozen=True\)"),
], ids=["both", "neither", "half-metadata", "unhashable", "not-a-dataclass"])
def test_bad_indexer_values_are_refused_by_family(indexer, message):
    with pytest.raises(IndexerError, match=message) as error:
        kit.family(indexer)
    _one_line(error)


def test_not_an_indexer_and_a_knob_the_config_refuses():
    with pytest.raises(TypeError, match=r"^kit: the indexer must be an instance of a hisparse_jax\.kit\.Indexer "
                                        r"subclass, got str"):
        kit.family("dsa")
    with pytest.raises(ValueError, match=r"^PageMinMax\.page: must be a positive int, got 0$"):
        kit.family(PageMinMax(page=0)).Config.tiny(**TINY)
    with pytest.raises(ValueError, match=r"^Config\.indexer: no indexer; pass indexer=MyIndexer"):
        kit.Config.tiny(**TINY)


"""models/shapes.py, the one registry of named model shapes: every name resolves, no name is used
twice, every shape makes a valid Config of its family, and the families, the trainer and the
deployment slices read their shapes from it."""

from __future__ import annotations

import pytest

from hisparse_jax.bench.deployments import DEPLOYMENTS
from hisparse_jax.models import get_family, shapes
from hisparse_jax.train import fit


def test_every_name_resolves_to_its_entry():
    named = shapes.named_shapes()
    for name, (family, fields) in named.items():
        assert shapes.get_shape(name) == (family, fields)
    with pytest.raises(ValueError, match="unknown shape 'dsa/huge'"):
        shapes.get_shape("dsa/huge")


def test_names_are_unique_and_cover_every_group():
    named = shapes.named_shapes()
    want = (sum(len(presets) for presets in shapes.FAMILY_PRESETS.values()) + len(shapes.TRAINED_MODELS)
            + len(shapes.DEPLOYMENT_SLICES))
    assert len(named) == want
    assert {name.split("/")[0] for name in named} == {*shapes.FAMILY_PRESETS, "train", "deployment"}


@pytest.mark.parametrize("name", sorted(shapes.named_shapes()))
def test_every_shape_is_a_valid_config(name):
    family, fields = shapes.get_shape(name)
    if name.startswith("deployment/"):  # a slice overrides the realistic preset; it derives its layers and vocab
        deployment = DEPLOYMENTS[name.split("/", 1)[1]]
        config = get_family(family).Config.realistic(**deployment.derive().overrides)
    else:
        config = get_family(family).Config(**fields)
    assert config.top_k <= config.hot_slots


def test_the_users_of_a_shape_read_it_from_the_registry():
    for family, presets in shapes.FAMILY_PRESETS.items():
        assert get_family(family).Config.PRESETS is presets
    assert fit.MODELS is shapes.TRAINED_MODELS
    for name, deployment in DEPLOYMENTS.items():
        assert deployment.fields is shapes.DEPLOYMENT_SLICES[name]
        assert deployment.family == shapes.DEPLOYMENT_FAMILIES[name]

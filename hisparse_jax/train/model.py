"""The model a training run fits: DSA (its lightning indexer, dsa.Config) or the research kit's
MLA model with any protocol indexer (hisparse_jax.kit), at one of the trained shapes.

Both are the same MLA model around their indexer (kit.MLAConfig; DSA's Config adds the lightning
indexer's index_* fields), so a named shape (models/shapes.py TRAINED_MODELS) gives either: DSA
takes all its fields, a kit model all but the lightning indexer's, and its indexer's own knobs
are the indexer's fields.
"""

from __future__ import annotations

import dataclasses

from .. import kit
from ..kit.config import LIGHTNING_FIELDS
from ..models import dsa, shapes
from ..models.family import Family

MODELS = shapes.TRAINED_MODELS  # named shapes live in hisparse_jax/models/shapes.py


def model_config(name: str, indexer: kit.Indexer | None = None, **overrides):
    """The Config of the trained shape `name`: dsa.Config without an indexer, else the kit Config
    of `indexer` (a LightningIndexer given explicitly too: its knobs are then its fields)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    if indexer is None:
        return dsa.Config(**{**MODELS[name], **overrides})
    fields = {k: v for k, v in MODELS[name].items() if k not in LIGHTNING_FIELDS}
    return kit.family(indexer).Config(**{**fields, **overrides})


def family_of(config) -> Family:
    """The family whose Config `config` is: DSA's, or the kit family of its indexer."""
    if isinstance(config, dsa.Config):
        return dsa.FAMILY
    return kit.family(config.indexer)


def config_fields(config) -> dict:
    """The Config's fields as JSON values, the indexer left out (a checkpoint records it apart)."""
    out = {}
    for f in dataclasses.fields(config):
        if f.name == "indexer":
            continue
        value = getattr(config, f.name)
        out[f.name] = str(value) if f.name == "dtype" else value
    return out


def kit_indexer(config) -> kit.Indexer | None:
    """The protocol indexer a checkpoint must record for `config` (None for DSA, whose indexer
    is its fields)."""
    return None if isinstance(config, dsa.Config) else config.indexer


def make_config(fields: dict, indexer: kit.Indexer | None):
    """The Config of a checkpoint's fields (and recorded indexer)."""
    if indexer is None:
        return dsa.Config(**fields)
    return kit.family(indexer).Config(**fields)

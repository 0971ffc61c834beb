"""`kit.family(indexer)`: a model family (hisparse_jax.models.Family) from an indexer.

The family is the kit's MLA model (kit.model) with the indexer in its Config: decode,
sharding, the benchmarks, the selection lab and hisparse_jax.testing drive it like DSA, NSA and
Quest. DSA itself is `make_family("dsa", dsa.Config, dsa.init_weights)`.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from ..models.family import Family
from . import checks, inputs, model, state, weights
from .config import config_class


def selecting_layout(config, batch: int) -> tuple[int, tuple[int, ...], int]:
    """(selecting layers, stream shape, record ids) of a selection trace for this model: one
    selecting layer per indexer group."""
    return config.groups, (batch,), config.num_records


def metadata_bytes(config) -> int:
    """Device bytes of one request's indexer metadata in one group, sized for max_context: read
    from the shapes init_metadata declares (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: checks.check_metadata(config.indexer, config, 1,
                                                          config.indexer.init_metadata(config, 1)))
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes))


def metadata_bytes_read(config, context: int) -> int:
    """Device bytes one decode step reads per request besides weights and attended records: every
    group's indexer metadata for `context` tokens. The kit takes the metadata to grow with the
    tokens held (init_metadata sizes it for max_context, a step reads the part held), so this is
    groups x metadata_bytes x context / max_context (DSA: its index keys and fp8 scales)."""
    return config.groups * metadata_bytes(config) * int(context) // config.max_context


def make_family(name: str, Config: type, init_weights=weights.init_weights) -> Family:
    """The kit's model as a Family of `Config` (an MLAConfig whose `indexer` selects)."""
    return Family(name=name, Config=Config, init_weights=init_weights, init_state=state.init_state,
                  prefill=model.prefill, decode_step=model.decode_step, selecting_layout=selecting_layout,
                  metadata_bytes_read=metadata_bytes_read, selection_weights=weights.SELECTION_WEIGHTS,
                  decode_weights=inputs.merge)


def family(indexer, name: str | None = None) -> Family:
    """The model family of `indexer` (a hisparse_jax.kit.Indexer): its Config defaults
    `indexer` to it (Config.tiny(), Config.realistic(), Config.preset() work as for DSA), its
    weights draw the indexer's parameters per group. `name` (default: indexer.name) labels it.
    The same (indexer, name) gives the same Family value, so jit compiles it once."""
    checks.check_indexer(indexer)
    return _family(indexer, name or indexer.name)


@functools.cache
def _family(indexer, name: str) -> Family:
    return make_family(name, config_class(indexer))

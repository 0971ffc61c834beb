"""The research kit: bring your own sparse indexer (docs/kit.md).

A researcher writes an `Indexer` (hisparse_jax.kit.protocol: its parameters, what it keeps per
token or page, how it scores or selects records); `family(indexer)` makes it a model family
(MLA attention over the selected records plus the open page, in every decode mode) that
decode, the benchmarks, the selection lab and hisparse_jax.testing drive like DSA, NSA and Quest.
"""

from .checks import IndexerError
from .config import Config, MLAConfig
from .family import family, make_family
from .page_minmax import PageMinMax
from .protocol import Fetched, Indexer, NoMetadata, RecordKind, TrainLevels
from .two_level import TwoLevel

__all__ = ["Config", "Fetched", "Indexer", "IndexerError", "MLAConfig", "NoMetadata", "PageMinMax", "RecordKind",
           "TrainLevels", "TwoLevel", "family", "make_family"]

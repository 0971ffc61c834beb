"""The indexer protocol: what a researcher writes to try a new sparse indexer (docs/kit.md).

An indexer decides, at every decode step of every selecting layer, which sealed records (MLA
records of `page_size` tokens) a query attends to. `kit.family(MyIndexer(...))` turns it into a
whole model family (hisparse_jax.models.Family): MLA attention over the selected records plus
the open page, the three decode modes, prefill, the state, the byte account, forced selections
and recording all come from the kit. The researcher subclasses `Indexer` and writes:

- its knobs: the dataclass's own fields (`page: int = 64`). The indexer is a frozen, hashable
  dataclass because it rides in the model Config, a static jit argument;
- `init_params`: one selecting group's parameters (a pytree of arrays, `{}` for none);
- `init_metadata` (unless it keeps nothing): what it keeps on the device per request, a
  `jax.tree_util.register_dataclass` dataclass whose every array field is declared with
  `layout.field(layout.INDEXER_METADATA, batch_axis=0)`: the byte account, the synthetic fill
  and the sharding specs read the declaration, so the kit counts, fills and shards it unasked;
- `write` (likewise): store what it keeps for new tokens (the prompt at prefill, one token per step);
- exactly one of `score` (a float per record; the kit runs the library's top-k, ties to the
  lower id, so hisparse, device and every kernel choose the same ids) or `select` (the ids
  themselves, for page-level or non-top-k rules);
- optionally a record kind of its own (`record_kind`, `record_values`, `fetch`): per-token
  values the kit keeps off the device like the KV ("hisparse": host pool, hot buffer, RESOLVE)
  and brings to the device for the candidates the indexer names, before `select`;
- optionally `train_scores` (token-level logits, so the kit's training can distill it from the
  attention) with `train_features` (what they read, computed once per sequence), and `check`
  (its rules against a model Config).

Shapes: b = streams, T = tokens, D = d_model, R = config.num_records, k = config.top_k. `config`
is the kit model's Config (MLA shapes: d_model, n_heads, num_records, top_k, page_size,
max_context, dtype, ...); `h` is the selecting layer's input after its attention RMSNorm (the
anchor layer's, when index_share > 1 makes layers share a selection).

The kit checks every return value against this contract when it traces (shapes and dtypes, so
nothing is left in the compiled step) and raises one line naming the method and the fix
(hisparse_jax.kit.checks).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax


@dataclasses.dataclass(frozen=True)
class Indexer:
    """Base of every indexer; subclass it as a frozen dataclass:

        @dataclasses.dataclass(frozen=True)
        class PageMinMax(kit.Indexer):
            page: int = 64
            def init_metadata(self, config, batch): ...
            def write(self, config, params, metadata, h, positions, written): ...
            def score(self, config, params, metadata, h, positions, sealed): ...

    The methods below document the protocol; one of `score` / `select` is required, the others
    have defaults (an indexer that keeps nothing per token needs neither init_metadata nor write).

    `input_weights` (optional): names of parameters (dataclass fields or dict keys, [D, ...]
    matrices in the model's dtype) that write and score multiply h by through
    `hisparse_jax.models.products.project(spec, h, params.NAME)` in place of an einsum. For
    decoding the kit stores them in the anchor layer's one input matrix (kit.inputs: one matmul
    for the layer's and the indexer's projections of h) and passes their products instead.
    """

    input_weights: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        """A short label for tables and the family's name (default: the class name)."""
        return type(self).__name__

    def check(self, config) -> None:
        """Raises ValueError (one line naming your knob) when this indexer cannot serve `config`,
        e.g. a page that does not divide config.max_context. Called when the Config is built."""

    def init_params(self, config, seed: int):
        """One selecting group's parameters: a pytree of arrays (default `{}`: none). Called once
        per group with its own seed; the kit keeps them in Weights.indexers[group]."""
        return {}

    def init_metadata(self, config, batch: int):
        """Zeros of what this indexer keeps per request, sized for config.max_context tokens: an
        instance of a `jax.tree_util.register_dataclass` dataclass whose every array field is
        declared `layout.field(layout.INDEXER_METADATA, batch_axis=0)` (axis 0 is the request;
        a field may be None when a knob turns it off). The kit keeps one per selecting group: each
        field becomes a field of the model's State holding a tuple of the groups' arrays.
        Default: `NoMetadata()`, for an indexer that keeps nothing (then `write` need not exist)."""
        return NoMetadata()

    def write(self, config, params, metadata, h: jax.Array, positions: jax.Array, written: jax.Array):
        """The metadata with tokens stored: h [b, T, D] at positions [b, T] int32; only where
        written [b, T] bool is True (prefill: the prompt's valid tokens; decode: T = 1, all True);
        elsewhere the metadata stays as it was. Returns the same type, shapes and dtypes.
        Default: the metadata unchanged."""
        return metadata

    def score(self, config, params, metadata, h: jax.Array, positions: jax.Array, sealed: jax.Array) -> jax.Array:
        """[b, R] float32 scores of every record for the query h [b, D] at positions [b] int32;
        records >= sealed [b] int32 are ignored by the kit's top-k (any value there), which picks
        config.top_k ids, ties to the lower id. This step's token is already written."""
        raise NotImplementedError

    def select(self, config, params, metadata, h: jax.Array, positions: jax.Array, sealed: jax.Array) -> jax.Array:
        """[b, k] int32 record ids (k = config.top_k) for the query, in place of `score`:
        ascending (attention reads records in selection order; ascending is position order, the
        order of dense attention, so selecting every record equals it bit for bit), -1 padding
        at the end, every id < sealed (the open page is always attended from the tail; an id
        outside [0, sealed) counts as padding everywhere, RESOLVE's rule 0: a wasted slot)."""
        raise NotImplementedError

    def record_kind(self, config) -> "RecordKind | None":
        """A record kind of the indexer's own (RecordKind), or None (the default): per-token
        values kept off the device ("hisparse": a host pool + hot buffer, fetched by RESOLVE). An
        indexer with one defines `record_values` and `fetch`, and `select` receives the
        fetched records as the keyword argument `fetched` (a Fetched)."""
        return None

    def record_values(self, config, params, h: jax.Array, positions: jax.Array) -> jax.Array:
        """[b, T, width] the record kind's values of tokens h [b, T, D] at positions [b, T], in
        the kind's dtype; the kit pages them (written at prefill and every step, before selecting)."""
        raise NotImplementedError

    def fetch(self, config, params, metadata, h: jax.Array, positions: jax.Array, sealed: jax.Array) -> jax.Array:
        """[b, fetch] int32 ids of the indexer's own records to fetch for the query (ascending,
        -1 padding, every id < sealed, here the record kind's sealed count [b]); the kit brings
        them to the device (RESOLVE in "hisparse") and calls select(..., fetched=Fetched)."""
        raise NotImplementedError

    def train_features(self, config, params, h: jax.Array, positions: jax.Array):
        """What train_scores reads of a whole sequence, computed once per layer: training calls
        it outside its loop over blocks of queries (and outside their rematerialization), so
        per-token work (keys, page bounds) is done, and differentiated, once. h [b, T, D] at
        positions [T] int32 -> any pytree whose arrays have the batch on axis 0. Default: h."""
        return h

    def train_scores(self, config, params, features, positions: jax.Array, start, chunk: int):
        """[b, chunk, T] float32 token-level logits of the queries start .. start + chunk - 1
        against every token, from `features` (train_features' value; by default h [b, T, D]) at
        positions [T] int32 (`start` may be traced). The kit applies the causal mask (values at
        keys >= the query may be anything, -inf included). Training fits them to the
        head-summed attention by KL and, in its sparse phase, attends to their top-k. None
        (the default): nothing to train. A two-level indexer returns a TrainLevels instead
        (token and page logits, both distilled; training selects as decode does)."""
        return None


@dataclasses.dataclass(frozen=True)
class RecordKind:
    """An indexer's own records (`Indexer.record_kind`): per-token values the kit pages like the
    KV, `page` tokens to a record, in a store of their own: the pinned host pool with a hot
    buffer and LRU per stream and group in "hisparse" mode (fetched by RESOLVE, the same call
    as the KV's), a device buffer read in place in "device" mode. The open record (the newest
    tokens, page not yet full) stays on the device.

    Attributes:
      page: tokens per record.
      width: values per token (`record_values`' last axis).
      fetch: records the indexer asks for per step (`Indexer.fetch`'s width; RESOLVE's k).
      hot_slots: hot buffer slots per stream and group ("hisparse"), >= fetch.
      dtype: the values' dtype (None: the model's).
    """

    page: int
    width: int
    fetch: int
    hot_slots: int
    dtype: str | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fetched:
    """What `select` of an indexer with a record kind receives: the records it asked for, fetched.

    Attributes:
      ids: [b, c] int32 the ids as `Indexer.fetch` returned them (-1 padding).
      records: [b, c, page, width] their values (zeros where not valid).
      valid: [b, c] bool: ids in [0, sealed) of the record kind.
      open_page: [b, page, width] the open record: tokens sealed_kind * page .. the query's
        position (this step's token written); rows past the position hold stale values.
    """

    ids: jax.Array
    records: jax.Array
    valid: jax.Array
    open_page: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainLevels:
    """`train_scores` of a two-level indexer (in place of one [b, chunk, T] array): token logits
    and page logits, each distilled from the attention, and the selection rule training then
    applies (the decode rule): per query, the `candidates` best closed pages by `coarse`
    (ties to the lower page) plus the query's own page, then the top-k tokens of those by `fine`.

    Attributes:
      fine: [b, chunk, T] float32 token logits (KL against the head-summed token attention).
      coarse: [b, chunk, ceil(T / page)] float32 page logits (KL against the attention summed
        over each closed page: pages wholly before the query's own).
      page, candidates: static ints.
    """

    fine: jax.Array
    coarse: jax.Array
    page: int = dataclasses.field(metadata=dict(static=True))
    candidates: int = dataclasses.field(metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NoMetadata:
    """The metadata of an indexer that keeps nothing (e.g. one selecting by position alone)."""


SCORE, SELECT = "score", "select"


def overrides(indexer: Indexer, method: str) -> bool:
    """Whether `indexer`'s class defines `method` itself (rather than inheriting the protocol's)."""
    return getattr(type(indexer), method) is not getattr(Indexer, method)


def selection_rule(indexer: Indexer) -> str:
    """"score" or "select": which of the two the indexer defines (checks.check_indexer made sure
    it is exactly one)."""
    return SCORE if overrides(indexer, SCORE) else SELECT

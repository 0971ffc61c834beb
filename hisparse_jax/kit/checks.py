"""The kit's checks of user indexer code: every protocol method is called through here, and what
it returns is checked against the protocol (hisparse_jax.kit.protocol) when the step is traced.

Only shapes, dtypes and types are checked, all known at trace time, so the compiled step holds
nothing of it. A failure is one line naming the class, the protocol method (or the metadata
field) and the fix, e.g.
  PageMinMax.score: returned shape (2, 7), expected [b, R] = (2, 8): one float32 score per record
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .. import layout
from .protocol import SCORE, SELECT, Indexer, RecordKind, TrainLevels, overrides

# The kit's own fields of a model State; a metadata field of the same name would shadow them.
STATE_FIELDS = ("store", "tail", "lengths", "index_store", "index_tail")


class IndexerError(ValueError):
    """Indexer code broke the protocol; the message names the method or field and the fix."""


def _label(indexer, method: str) -> str:
    return f"{type(indexer).__name__}.{method}"


def _shape(x) -> tuple:
    return tuple(int(d) for d in x.shape)


def check_indexer(indexer) -> Indexer:
    """The indexer value itself: an Indexer subclass instance, a frozen dataclass of its own,
    hashable (it rides in a static jit argument), with exactly one of score / select."""
    if not isinstance(indexer, Indexer):
        raise TypeError(f"kit: the indexer must be an instance of a hisparse_jax.kit.Indexer subclass, got "
                        f"{type(indexer).__name__}: subclass kit.Indexer and pass an instance")
    cls = type(indexer)
    if "__dataclass_params__" not in vars(cls) or not cls.__dataclass_params__.frozen:
        raise IndexerError(f"{cls.__name__}: not a frozen dataclass of its own; decorate the class with "
                           "@dataclasses.dataclass(frozen=True) (its knobs must be fields: the indexer is "
                           "part of the Config, a static jit argument, hashed by its fields)")
    try:
        hash(indexer)
    except TypeError:
        bad = next((f.name for f in dataclasses.fields(indexer) if not _hashable(getattr(indexer, f.name))), "?")
        raise IndexerError(f"{cls.__name__}.{bad}: holds an unhashable "
                           f"{type(getattr(indexer, bad, None)).__name__}; the indexer is part of a static jit "
                           "argument: use a tuple, a number or a string") from None
    score, select = overrides(indexer, SCORE), overrides(indexer, SELECT)
    if score == select:
        which = "both" if score else "neither"
        raise IndexerError(f"{cls.__name__}: defines {which} of score and select; define exactly one: score "
                           "([b, R] float32 per record; the kit's top-k picks) or select ([b, k] int32 ids)")
    if overrides(indexer, "init_metadata") != overrides(indexer, "write"):
        have, lack = ("init_metadata", "write") if overrides(indexer, "init_metadata") else ("write", "init_metadata")
        raise IndexerError(f"{_label(indexer, lack)}: not defined, but {have} is; an indexer that keeps metadata "
                           "defines both (one that keeps nothing, neither)")
    if overrides(indexer, "record_kind"):
        for method in ("record_values", "fetch", SELECT):
            if not overrides(indexer, method):
                raise IndexerError(f"{_label(indexer, method)}: not defined, but record_kind is; an indexer with a "
                                   "record kind defines record_values, fetch and select (which receives the "
                                   "fetched records as fetched=)")
    if not isinstance(indexer.name, str) or not indexer.name:
        raise IndexerError(f"{_label(indexer, 'name')}: must be a non-empty str, got {indexer.name!r}")
    return indexer


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------- metadata


def metadata_fields(indexer, metadata) -> tuple[dataclasses.Field, ...]:
    """The declared fields of a metadata value (init_metadata's), each an indexer-metadata array
    of the request axis 0; raises naming the first broken field."""
    where = _label(indexer, "init_metadata")
    cls = type(metadata)
    if not dataclasses.is_dataclass(metadata) or isinstance(metadata, type):
        raise IndexerError(f"{where}: returned a {cls.__name__}; return an instance of a "
                           "jax.tree_util.register_dataclass dataclass with fields declared by "
                           "layout.field(layout.INDEXER_METADATA, batch_axis=0)")
    if any(leaf is metadata for leaf in jax.tree_util.tree_leaves(metadata)):  # not a pytree node: a leaf
        raise IndexerError(f"{where}: {cls.__name__} is not a registered pytree; decorate it with "
                           "@jax.tree_util.register_dataclass")
    fields = dataclasses.fields(metadata)
    for f in fields:
        name = f"{cls.__name__}.{f.name}"
        lay = f.metadata.get("layout")
        if f.metadata.get("static"):
            raise IndexerError(f"{where}: field {name} is static; metadata holds arrays only: put knobs on "
                               "the indexer's own fields")
        if lay is None:
            raise IndexerError(f"{where}: field {name} declares no layout; declare it with "
                               "layout.field(layout.INDEXER_METADATA, batch_axis=0)")
        if (lay.category, lay.batch_axis, lay.memory) != (layout.INDEXER_METADATA, 0, layout.DEVICE):
            raise IndexerError(f"{where}: field {name} is declared {lay.category!r}, batch_axis={lay.batch_axis}, "
                               f"memory={lay.memory!r}; indexer metadata is layout.field(layout.INDEXER_METADATA, "
                               "batch_axis=0) in device memory")
        if f.name in STATE_FIELDS:
            raise IndexerError(f"{where}: field {name} shadows the model State's own {f.name!r}; rename it")
        value = getattr(metadata, f.name)
        if value is not None and not _is_array(value):
            raise IndexerError(f"{where}: field {name} holds a {type(value).__name__}; a metadata field holds "
                               "one array (or None when a knob turns it off)")
    return fields


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) or hasattr(x, "aval")


def check_metadata(indexer, config, batch: int, metadata):
    """init_metadata's value: declared fields, arrays whose axis 0 is the batch."""
    for f in metadata_fields(indexer, metadata):
        value = getattr(metadata, f.name)
        if value is not None and (value.ndim < 1 or value.shape[0] != batch):
            raise IndexerError(f"{_label(indexer, 'init_metadata')}: field {type(metadata).__name__}.{f.name} has "
                               f"shape {_shape(value)}, expected axis 0 = batch = {batch} (the request axis)")
    return metadata


def _same_metadata(indexer, method: str, got, want):
    """got (a method's returned metadata) has want's type, fields, shapes and dtypes."""
    where = _label(indexer, method)
    if type(got) is not type(want):
        raise IndexerError(f"{where}: returned a {type(got).__name__}, expected the {type(want).__name__} it "
                           "was given, updated")
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if (a is None) != (b is None):
            raise IndexerError(f"{where}: field {f.name} is {'None' if a is None else 'an array'} but was "
                               f"{'None' if b is None else 'an array'}; keep every field as init_metadata made it")
        if a is not None and (_shape(a) != _shape(b) or a.dtype != b.dtype):
            raise IndexerError(f"{where}: returned field {f.name} {a.dtype} {list(_shape(a))}, expected "
                               f"{b.dtype} {list(_shape(b))} (the metadata's own shape and dtype)")
    return got


# --------------------------------------------------------------------------- checked calls


def write(indexer, config, params, metadata, h, positions, written):
    return _same_metadata(indexer, "write", indexer.write(config, params, metadata, h, positions, written), metadata)


def score(indexer, config, params, metadata, h, positions, sealed) -> jax.Array:
    out = indexer.score(config, params, metadata, h, positions, sealed)
    want = (h.shape[0], config.num_records)
    _array(indexer, "score", out, want, "[b, R]", jnp.float32,
           "one float32 score per record (R = config.num_records)")
    return out


def record_kind(indexer, config) -> RecordKind | None:
    """indexer.record_kind(config), checked: None or a RecordKind of positive ints, hot_slots >= fetch."""
    kind = indexer.record_kind(config)
    if kind is None:
        return None
    where = _label(indexer, "record_kind")
    if not isinstance(kind, RecordKind):
        raise IndexerError(f"{where}: returned a {type(kind).__name__}; return a kit.RecordKind(page, width, fetch, "
                           "hot_slots) or None")
    for name in ("page", "width", "fetch", "hot_slots"):
        value = getattr(kind, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise IndexerError(f"{where}: RecordKind.{name} must be a positive int, got {value!r}")
    if kind.hot_slots < kind.fetch:
        raise IndexerError(f"{where}: RecordKind.hot_slots={kind.hot_slots} < fetch={kind.fetch}; every fetched "
                           "record needs a hot slot: raise hot_slots")
    return kind


def record_values(indexer, config, params, h, positions) -> jax.Array:
    kind = record_kind(indexer, config)
    out = indexer.record_values(config, params, h, positions)
    _array(indexer, "record_values", out, (*h.shape[:2], kind.width), "[b, T, width]",
           jnp.dtype(kind.dtype or config.dtype), "the record kind's values per token")
    return out


def fetch(indexer, config, params, metadata, h, positions, sealed) -> jax.Array:
    kind = record_kind(indexer, config)
    out = indexer.fetch(config, params, metadata, h, positions, sealed)
    _array(indexer, "fetch", out, (h.shape[0], kind.fetch), "[b, fetch]", jnp.int32,
           "RecordKind.fetch ids of the indexer's own records, ascending, -1 padding")
    return out


def select(indexer, config, params, metadata, h, positions, sealed, fetched=None) -> jax.Array:
    if fetched is None:
        out = indexer.select(config, params, metadata, h, positions, sealed)
    else:
        out = indexer.select(config, params, metadata, h, positions, sealed, fetched=fetched)
    want = (h.shape[0], config.top_k)
    _array(indexer, "select", out, want, "[b, k]", jnp.int32,
           "k = config.top_k record ids per stream, ascending, -1 padding")
    return out


def train_features(indexer, config, params, h, positions):
    out = indexer.train_features(config, params, h, positions)
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        if not _is_array(leaf) or leaf.ndim < 1 or leaf.shape[0] != h.shape[0]:
            raise IndexerError(f"{_label(indexer, 'train_features')}: leaf {jax.tree_util.keystr(path) or '(root)'} "
                               f"is {_describe(leaf)}; return a pytree of arrays with the batch b = {h.shape[0]} on "
                               "axis 0")
    return out


def train_scores(indexer, config, params, features, positions, start, chunk: int):
    """indexer.train_scores, checked: [b, chunk, T] float32 (b from the features' axis 0, T from
    positions), or None."""
    out = indexer.train_scores(config, params, features, positions, start, chunk)
    want = (jax.tree.leaves(features)[0].shape[0], chunk, positions.shape[0])
    if isinstance(out, TrainLevels):
        _array(indexer, "train_scores", out.fine, want, "TrainLevels.fine [b, chunk, T]", jnp.float32,
               "a logit per query of the chunk and per token")
        pages = -(-positions.shape[0] // out.page)
        _array(indexer, "train_scores", out.coarse, (*want[:2], pages), "TrainLevels.coarse [b, chunk, ceil(T / page)]",
               jnp.float32, "a logit per query of the chunk and per page")
    elif out is not None:
        _array(indexer, "train_scores", out, want, "[b, chunk, T]", jnp.float32,
               "a logit per query of the chunk and per token")
    return out


def _describe(x) -> str:
    return f"{x.dtype} {list(_shape(x))}" if _is_array(x) else f"a {type(x).__name__}"


def params(indexer, config, seed: int):
    out = indexer.init_params(config, seed)
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        if not _is_array(leaf):
            raise IndexerError(f"{_label(indexer, 'init_params')}: leaf {jax.tree_util.keystr(path) or '(root)'} is a "
                               f"{type(leaf).__name__}; parameters are a pytree of arrays (knobs go on the indexer)")
    return out


def _array(indexer, method: str, out, want: tuple, named: str, dtype, meaning: str) -> None:
    where = _label(indexer, method)
    if not _is_array(out):
        raise IndexerError(f"{where}: returned a {type(out).__name__}, expected an array {named} = {want}: {meaning}")
    if _shape(out) != tuple(want):
        raise IndexerError(f"{where}: returned shape {_shape(out)}, expected {named} = {tuple(want)}: {meaning}")
    if out.dtype != dtype:
        kind = "record ids must be integers" if dtype == jnp.int32 and not jnp.issubdtype(out.dtype, jnp.integer) \
            else f"cast with .astype(jnp.{jnp.dtype(dtype).name})"
        raise IndexerError(f"{where}: returned dtype {out.dtype}, expected {jnp.dtype(dtype).name} ({kind})")

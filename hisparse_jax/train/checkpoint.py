"""A trained model on disk: its Config fields and weights in one .npz (weights in Config.dtype).

A model with a protocol indexer (train/model.py: the kit's MLA model) also records its indexer:
the MODULE:NAME that finds its class, the class name and its fields (train/indexer_spec.py). A
checkpoint is untrusted bytes and does not choose code to run: `load_model` imports the recorded
module only when it is inside hisparse_jax; for a researcher's own module the caller names it
(`indexer="my_lab/indexers.py:MyIndexer"`, `record --indexer`), and the class and fields
come from the checkpoint, checked against it."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import math
import sys
import zipfile
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpy.lib import format as npy_format

from ..kit import inputs as kit_inputs
from ..npz_files import NpzFile
from . import indexer_spec
from .model import MODELS, config_fields, family_of, kit_indexer, make_config, model_config

FORMAT = "hisparse-dsa-checkpoint"
# Fields a loader may change: they size the decode (cache, context, kernels), not the weights;
# and dtype, to which the weights are cast (float32 runs a bf16 model on XLA:CPU, which has no
# bf16 dot: the same weights, computed in float32).
DECODE_FIELDS = ("top_k", "hot_slots", "max_context", "pool_records", "prefill_chunk", "implementation",
                 "indexer_implementation", "prefetch", "overlap_groups", "dtype")


# What a stored weight array may be, by the config's dtype: bfloat16 is stored as its raw uint16 bits.
_STORED = {"bfloat16": np.dtype(np.uint16), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


# Content hashes (_digest) of checkpoints saved before save_model wrote one into the header: the
# trace model in benchmarks/results/2026-12-02-h200/trace-model/model.npz. Kept here instead of
# re-saving the file with a hash, because its trace records the sha256 of the file's bytes
# (source.model_sha256), which a re-save would change; its content is verified all the same.
KNOWN_UNHASHED = {
    "adeb3cd2610f24bc6c7f5718cf451a38fc90a5dfc0a330252a5fec8924b3324f": "the 2026-12-02 trace model",
}
# The most weight bytes a checkpoint may declare before load_model reads it (load_model(max_bytes=)
# for more): the trace model holds 11 MB, and the declared size is what the reader allocates.
MAX_CHECKPOINT_BYTES = 16 << 30
# What a checkpoint's content hash covers when its header says so (save_model writes it): meta too.
# A header without it was hashed over the config, indexer and weights only (its meta is checked
# all the same, field by field: check_meta).
HASH_COVERS = "config, indexer, meta, weights"
# Bounds on the plan a checkpoint's meta records: hisparse-bench indexers evaluates the held-out
# windows it names (eval_batches windows of eval_seq_len tokens, in attention chunks of chunk),
# and fit draws its weights from seed (an int32: the PRNG seed of a jitted draw).
MAX_EVAL_SEQ_LEN = 1 << 20
MAX_EVAL_BATCHES = 1024
MAX_EVAL_TOKENS = 1 << 24
MAX_SEED = 2**31 - 1
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_READ_PIECE_BYTES = 16 << 20
_CHANGED = "its content hash does not match what it holds (the file was changed after it was saved)"


def _digest(config_fields: dict, arrays: list[np.ndarray]) -> str:
    """sha256 of the config and every stored array (dtype, shape, bytes), in order."""
    h = hashlib.sha256(json.dumps(config_fields, sort_keys=True).encode())
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _hashed_fields(fields: dict, indexer: dict | None, meta: dict | None = None) -> dict:
    """What the content hash covers besides the weights: the config, and the indexer's record
    (a DSA checkpoint has none, and hashes as it always did), and meta when the header's
    sha256_covers says so (HASH_COVERS)."""
    out = fields if indexer is None else {**fields, "indexer": indexer}
    return out if meta is None else {**out, "meta": meta}


def _streamed_digest(path: Path, hashed: dict, specs: list, stored: np.dtype) -> str | None:
    """The content hash (_digest) of the file's weights, read in pieces and not kept: a file whose
    hash does not match is refused before its weights are allocated. None when a weight is not
    as the config declares (missing, another dtype or shape, Fortran order, damaged): the full
    read (NpzFile) then names what is wrong."""
    h = hashlib.sha256(json.dumps(hashed, sort_keys=True).encode())
    try:
        with zipfile.ZipFile(path) as z:
            for i, spec in enumerate(specs):
                shape = tuple(int(d) for d in spec.shape)
                nbytes = math.prod(shape) * stored.itemsize
                info = z.getinfo(f"w{i:04d}.npy")
                if info.file_size > nbytes + (1 << 16):
                    return None
                with z.open(info) as f:
                    read_header = {(1, 0): npy_format.read_array_header_1_0,
                                   (2, 0): npy_format.read_array_header_2_0}.get(npy_format.read_magic(f))
                    if read_header is None:
                        return None
                    found, fortran, dtype = read_header(f)
                    if dtype != stored or tuple(found) != shape or (fortran and len(shape) > 1):
                        return None
                    if info.file_size - f.tell() != nbytes:
                        return None
                    h.update(f"{dtype.str}{shape}".encode())
                    left = nbytes
                    while left:
                        piece = f.read(min(left, _READ_PIECE_BYTES))
                        if not piece:
                            return None
                        h.update(piece)
                        left -= len(piece)
    except (KeyError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, ValueError, RuntimeError,
            NotImplementedError, MemoryError):
        return None
    return h.hexdigest()


def _non_finite(a: np.ndarray) -> int:
    """How many of a stored weight's values are NaN or infinite (bfloat16 as its uint16 bits: an
    all-ones exponent), counted in pieces (no temporary the size of the weight)."""
    bits, mask = {2: (np.uint16, 0x7F80 if a.dtype == np.uint16 else 0x7C00), 4: (np.uint32, 0x7F800000)}[
        a.dtype.itemsize]
    flat = np.ascontiguousarray(a).reshape(-1).view(bits)
    step = 1 << 20
    return sum(int(np.count_nonzero((flat[i : i + step] & mask) == mask)) for i in range(0, flat.size, step))


def _shown(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bound(n: int) -> str:
    if n >= 1 << 16 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    if n >= (1 << 16) - 1 and (n + 1) & n == 0:
        return f"2^{n.bit_length()} - 1"
    return str(n)


class _Meta:
    """check_meta's field readers: each refuses a value of the wrong type or range in one line."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, name: str, value, expected: str):
        raise ValueError(f"{self.where}: meta.{name} is {_shown(value)}, expected {expected}")

    def obj(self, parent: dict, key: str, prefix: str = "", required: bool = False) -> dict | None:
        if key not in parent:
            if required:
                raise ValueError(f"{self.where}: meta.{prefix}{key} is missing (fit writes it)")
            return None
        if not isinstance(parent[key], dict):
            self.fail(prefix + key, parent[key], "an object")
        return parent[key]

    def integer(self, parent: dict, key: str, lo: int, hi: int, prefix: str = "", required: bool = False):
        if key not in parent:
            if required:
                raise ValueError(f"{self.where}: meta.{prefix}{key} is missing (fit writes it)")
            return None
        value = parent[key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(prefix + key, value, f"an int in [{_bound(lo)}, {_bound(hi)}]")
        return value

    def number(self, parent: dict, key: str, prefix: str = "", none: bool = False):
        value = parent.get(key)
        if key not in parent or (none and value is None):
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            self.fail(prefix + key, value, "a finite number >= 0" + (" or null" if none else ""))

    def string(self, parent: dict, key: str, prefix: str = "", choices: tuple = ()):
        if key not in parent:
            return
        value = parent[key]
        if not isinstance(value, str) or len(value) > 4096 or (choices and value not in choices):
            self.fail(prefix + key, value, f"one of {', '.join(map(repr, choices))}" if choices
                      else "a string of at most 4096 characters")


def check_meta(meta, where: str) -> dict:
    """`meta` as fit writes it (checkpoint headers, load_model and save_model), or one-line
    ValueErrors naming the field: an object; its plan (when present) an object whose chunk,
    eval_seq_len, eval_batches and seed are ints in range (hisparse-bench indexers evaluates the
    windows they name), with a list of phases of ints; its summary an object of non-negative
    numbers; its strings strings. Fields it does not know are kept as they are."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: its meta is {_shown(meta)}, expected an object")
    m = _Meta(where)
    for key in ("model", "data", "device", "jax", "date"):
        m.string(meta, key)
    for key in ("train_documents", "held_out_documents"):
        m.integer(meta, key, 0, _INT64)
    m.obj(meta, "indexer")
    plan = m.obj(meta, "plan")
    if plan is not None:
        chunk = m.integer(plan, "chunk", 1, MAX_EVAL_SEQ_LEN, "plan.", required=True)
        length = m.integer(plan, "eval_seq_len", 1, MAX_EVAL_SEQ_LEN, "plan.", required=True)
        batches = m.integer(plan, "eval_batches", 1, MAX_EVAL_BATCHES, "plan.", required=True)
        m.integer(plan, "seed", 0, MAX_SEED, "plan.", required=True)
        m.integer(plan, "log_every", 1, _INT32, "plan.")
        if length % chunk:
            raise ValueError(f"{where}: meta.plan.chunk is {chunk}, which does not divide meta.plan.eval_seq_len "
                             f"{length}; expected a divisor (fit's TrainPlan)")
        if length * batches > MAX_EVAL_TOKENS:
            raise ValueError(f"{where}: meta.plan.eval_batches {batches} x eval_seq_len {length} is "
                             f"{length * batches} held-out tokens to evaluate, expected at most "
                             f"{_bound(MAX_EVAL_TOKENS)}")
        phases = plan.get("phases", [])
        if not isinstance(phases, list) or len(phases) > 64:
            m.fail("plan.phases", phases, "a list of at most 64 phases")
        for i, phase in enumerate(phases):
            prefix = f"plan.phases[{i}]."
            if not isinstance(phase, dict):
                m.fail(prefix[:-1], phase, "an object")
            m.string(phase, "name", prefix)
            m.string(phase, "attention", prefix, choices=("dense", "sparse"))
            for key in ("steps", "seq_len", "batch"):
                m.integer(phase, key, 1, _INT32, prefix)
            m.integer(phase, "warmup", 0, _INT32, prefix)
            m.number(phase, "lr", prefix)
            m.number(phase, "seconds", prefix, none=True)
    summary = m.obj(meta, "summary")
    if summary is not None:
        m.number(summary, "train_seconds", "summary.")
        m.integer(summary, "tokens_seen", 0, _INT64, "summary.")
        m.integer(summary, "eval_seq_len", 1, MAX_EVAL_SEQ_LEN, "summary.")
        m.integer(summary, "eval_windows", 1, MAX_EVAL_BATCHES, "summary.")
        if not isinstance(summary.get("phases", []), list):
            m.fail("summary.phases", summary["phases"], "a list")
    return meta


def _check_model_name(meta: dict, fields: dict, indexer, where: str) -> None:
    """meta.model, when it names one of fit's models, must be the model the config is: its weight
    shapes (hisparse-bench indexers records the trace at the named model's shape)."""
    name = meta.get("model")
    if name not in MODELS:
        return
    try:
        expected = config_fields(model_config(name, indexer))
    except (TypeError, ValueError):
        return
    for key, value in expected.items():
        if key not in DECODE_FIELDS and key in fields and fields[key] != value:
            raise ValueError(f"{where}: meta.model is {name!r} but its config's {key} is {_shown(fields[key])}, "
                             f"where {name} has {_shown(value)}; the meta does not describe these weights")


def _decode_overrides(fields: dict, overrides: dict, has_indexer: bool) -> dict:
    """The overrides a config takes: every one for DSA; for a kit model those among its fields."""
    return {k: v for k, v in overrides.items() if k in fields or not has_indexer}


def with_decode_fields(config, **overrides):
    """`config` with DECODE_FIELDS changed, as load_model(**overrides) would make it; the weights
    loaded for `config` serve it (those fields size the decode, not the weights; dtype excepted:
    load again to cast). TypeError or ValueError when the model cannot take them."""
    unknown = sorted(set(overrides) - (set(DECODE_FIELDS) - {"dtype"}))
    if unknown:
        raise ValueError(f"with_decode_fields: {', '.join(unknown)} change the weights; only "
                         f"{', '.join(f for f in DECODE_FIELDS if f != 'dtype')} may be changed here")
    fields, indexer = config_fields(config), kit_indexer(config)
    return make_config({**fields, **_decode_overrides(fields, overrides, indexer is not None)}, indexer)


def save_model(path: str | Path, config, weights, meta: dict | None = None) -> int:
    """Writes the weights (cast to config.dtype) with the config, its protocol indexer (if any),
    `meta` (check_meta: as fit writes it) and the content hash of them all (checked by
    load_model); returns the file's bytes. Weights in the decode layout (kit.inputs.merge) are
    written split: a checkpoint has one layout."""
    meta = check_meta(json.loads(json.dumps(meta or {})), f"save_model {str(path)!r}")  # as load_model reads it
    leaves, _ = jax.tree_util.tree_flatten_with_path(kit_inputs.split(config, weights))
    arrays = {}
    for i, (path_, leaf) in enumerate(leaves):
        a = np.asarray(jax.device_get(jnp.asarray(leaf, config.dtype)))
        arrays[f"w{i:04d}"] = a.view(np.uint16) if a.dtype == jnp.bfloat16 else a
    fields = config_fields(config)
    indexer = kit_indexer(config)
    record = None if indexer is None else indexer_spec.describe(indexer)
    header = dict(format=FORMAT, config=fields, meta=meta, leaves=[jax.tree_util.keystr(p) for p, _ in leaves],
                  sha256_covers=HASH_COVERS, **({} if record is None else dict(indexer=record)))
    header["sha256"] = content_hash(header, list(arrays.values()))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    Path(path).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def content_hash(header: dict, arrays: list[np.ndarray]) -> str:
    """The sha256 a checkpoint's header must carry for these weights (in order): of its config,
    its indexer record (if any), its meta when its sha256_covers says so (HASH_COVERS), and the
    arrays as stored (a tool that rewrites a checkpoint recomputes it with this)."""
    meta = header.get("meta", {}) if header.get("sha256_covers") is not None else None
    return _digest(_hashed_fields(header["config"], header.get("indexer"), meta), arrays)


def _read_header(f: NpzFile, where: str, indexer: str | None) -> tuple[dict, np.dtype, object]:
    """The checked header of an open checkpoint, its weights' stored dtype and its rebuilt
    protocol indexer (None for DSA): the format, config dtype, hash fields and meta (check_meta;
    load_model checks meta.model against the config once the config makes a model)."""
    header = f.json("header", max_bytes=1 << 24)
    if header.get("format") != FORMAT:
        f.fail(f"not a {FORMAT} file")
    fields, names = header.get("config"), header.get("leaves")
    if not isinstance(fields, dict) or not isinstance(names, list):
        f.fail("its header has no config or leaves")
    stored = _STORED.get(fields.get("dtype"))
    if stored is None:
        f.fail(f"its config's dtype is {_shown(fields.get('dtype'))}; checkpoints hold {', '.join(_STORED)}")
    covers = header.get("sha256_covers")
    if covers is not None and covers != HASH_COVERS:
        f.fail(f"its header's sha256_covers is {_shown(covers)}, expected {HASH_COVERS!r} (or none: a file "
               "written before meta was hashed)")
    header.setdefault("meta", {})
    record = header.get("indexer")
    found = None
    try:
        check_meta(header["meta"], where)
        if record is not None:
            found = indexer_spec.from_record(record, where, indexer)
        elif indexer is not None:
            f.fail(f"is a DSA checkpoint (its lightning indexer is in its config); drop --indexer {indexer}")
    except ValueError as err:
        raise ValueError(str(err)) from None
    return header, stored, found


def load_model(path: str | Path, *, max_bytes: int = MAX_CHECKPOINT_BYTES, indexer: str | None = None,
               **decode_overrides):
    """(config, weights, meta) of a saved model; decode_overrides may set DECODE_FIELDS only.

    A checkpoint with a protocol indexer rebuilds it from its record (indexer_spec.from_record):
    `indexer` (MODULE:NAME) says where its module is; without it only a module inside
    hisparse_jax is imported (a checkpoint's bytes do not choose the code that runs).

    The file is read from untrusted bytes (npz_files): its config must declare at most
    `max_bytes` of weights, each weight must be stored in the dtype the config names and have
    the shape the config gives it, the content hash must match (computed from the file in
    pieces before any weight is kept: a changed file is refused in bounded memory), every weight
    must be finite, and meta must be as fit writes it (check_meta). A file written before
    checkpoints carried a hash is verified against KNOWN_UNHASHED, and loads with a warning if
    it is not one of those."""
    unknown = sorted(set(decode_overrides) - set(DECODE_FIELDS))
    if unknown:
        raise ValueError(f"load_model: {', '.join(unknown)} change the weights' shapes; only "
                         f"{', '.join(DECODE_FIELDS)} may be overridden")
    with NpzFile(path, "checkpoint") as f:
        header, stored, found = _read_header(f, f"checkpoint {str(path)!r}", indexer)
        fields = header["config"]
        given = _decode_overrides(fields, decode_overrides, found is not None)
        try:
            config = make_config({**fields, **given}, found)
        except (TypeError, ValueError) as err:
            f.fail(f"its config does not make a model ({err})")
        family = family_of(config)
        template = jax.eval_shape(lambda: family.init_weights(config, 0))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
        if [jax.tree_util.keystr(p) for p, _ in leaves] != header["leaves"]:
            f.fail(f"holds another weight layout than this version's {family.name} weights")
        declared = sum(math.prod(spec.shape) * stored.itemsize for _, spec in leaves)
        if declared > max_bytes:
            f.fail(f"its config declares {declared / 2**30:.1f} GiB of weights, more than max_bytes = "
                   f"{max_bytes / 2**30:.1f} GiB (load_model(path, max_bytes=...) to allow it)")
        try:
            _check_model_name(header["meta"], fields, found, f"checkpoint {str(path)!r}")
        except ValueError as err:
            raise ValueError(str(err)) from None
        if "sha256" in header:
            meta = header["meta"] if header.get("sha256_covers") is not None else None
            hashed = _hashed_fields(fields, header.get("indexer"), meta)
            streamed = _streamed_digest(Path(path), hashed, [spec for _, spec in leaves], stored)
            if streamed is not None and streamed != header["sha256"]:
                f.fail(_CHANGED)
        arrays = []
        for i, (key, spec) in enumerate(leaves):
            name = f"w{i:04d}"
            # 8 bytes an element at most: a weight of the wrong dtype is then named as such, below
            a = f.array(name, max_bytes=math.prod(spec.shape) * 8, kinds="biuf")
            if a.dtype != stored or a.shape != tuple(spec.shape):
                f.fail(f"weight {name} ({jax.tree_util.keystr(key)}) is {a.dtype} {list(a.shape)}; the config's "
                       f"dtype {fields['dtype']} and shapes need {stored} {list(spec.shape)}")
            arrays.append(a)
        if "sha256" not in header:
            if found is not None or _digest(fields, arrays) not in KNOWN_UNHASHED:
                print(f"load_model: {str(path)!r} carries no content hash (written before checkpoints had one); "
                      "its weights' integrity is not checked", file=sys.stderr)
        elif content_hash(header, arrays) != header["sha256"]:
            f.fail(_CHANGED)
        for i, ((key, _), a) in enumerate(zip(leaves, arrays)):
            bad = _non_finite(a)
            if bad:
                f.fail(f"weight w{i:04d} ({jax.tree_util.keystr(key)}) holds {bad} NaN or infinite values of "
                       f"{a.size}; a model that diverged in training does not decode: train it again (a lower "
                       "learning rate), or load another checkpoint")
    values = []
    for (_, spec), a in zip(leaves, arrays):
        a = a.view(jnp.bfloat16) if stored == np.uint16 else a
        values.append(jnp.asarray(a).astype(spec.dtype))
    return config, jax.tree_util.tree_unflatten(treedef, values), header["meta"]

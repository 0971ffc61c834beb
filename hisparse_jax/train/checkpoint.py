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
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..kit import inputs as kit_inputs
from ..npz_files import NpzFile
from . import indexer_spec
from .model import config_fields, family_of, kit_indexer, make_config

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


def _digest(config_fields: dict, arrays: list[np.ndarray]) -> str:
    """sha256 of the config and every stored array (dtype, shape, bytes), in order."""
    h = hashlib.sha256(json.dumps(config_fields, sort_keys=True).encode())
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _hashed_fields(fields: dict, indexer: dict | None) -> dict:
    """What the content hash covers besides the weights: the config, and the indexer's record
    (a DSA checkpoint has none, and hashes as it always did)."""
    return fields if indexer is None else {**fields, "indexer": indexer}


def save_model(path: str | Path, config, weights, meta: dict | None = None) -> int:
    """Writes the weights (cast to config.dtype) with the config, its protocol indexer (if any),
    `meta` and the content hash of them all (checked by load_model); returns the file's bytes.
    Weights in the decode layout (kit.inputs.merge) are written split: a checkpoint has one layout."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(kit_inputs.split(config, weights))
    arrays = {}
    for i, (path_, leaf) in enumerate(leaves):
        a = np.asarray(jax.device_get(jnp.asarray(leaf, config.dtype)))
        arrays[f"w{i:04d}"] = a.view(np.uint16) if a.dtype == jnp.bfloat16 else a
    fields = config_fields(config)
    indexer = kit_indexer(config)
    record = None if indexer is None else indexer_spec.describe(indexer)
    header = dict(format=FORMAT, config=fields, meta=meta or {}, leaves=[jax.tree_util.keystr(p) for p, _ in leaves],
                  sha256=_digest(_hashed_fields(fields, record), list(arrays.values())),
                  **({} if record is None else dict(indexer=record)))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    Path(path).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def load_model(path: str | Path, *, max_bytes: int = MAX_CHECKPOINT_BYTES, indexer: str | None = None,
               **decode_overrides):
    """(config, weights, meta) of a saved model; decode_overrides may set DECODE_FIELDS only.

    A checkpoint with a protocol indexer rebuilds it from its record (indexer_spec.from_record):
    `indexer` (MODULE:NAME) says where its module is; without it only a module inside
    hisparse_jax is imported (a checkpoint's bytes do not choose the code that runs).

    The file is read from untrusted bytes (npz_files): its config must declare at most
    `max_bytes` of weights, each weight must be stored in the dtype the config names and have
    the shape the config gives it, and the content hash must match. A file written before
    checkpoints carried a hash is verified against KNOWN_UNHASHED, and loads with a warning if
    it is not one of those."""
    unknown = sorted(set(decode_overrides) - set(DECODE_FIELDS))
    if unknown:
        raise ValueError(f"load_model: {', '.join(unknown)} change the weights' shapes; only "
                         f"{', '.join(DECODE_FIELDS)} may be overridden")
    with NpzFile(path, "checkpoint") as f:
        header = f.json("header", max_bytes=1 << 24)
        if header.get("format") != FORMAT:
            f.fail(f"not a {FORMAT} file")
        fields, names = header.get("config"), header.get("leaves")
        if not isinstance(fields, dict) or not isinstance(names, list):
            f.fail("its header has no config or leaves")
        stored = _STORED.get(fields.get("dtype"))
        if stored is None:
            f.fail(f"its config's dtype is {fields.get('dtype')!r}; checkpoints hold {', '.join(_STORED)}")
        record = header.get("indexer")
        found = None
        if record is not None:
            try:
                found = indexer_spec.from_record(record, f"checkpoint {str(path)!r}", indexer)
            except ValueError as err:
                raise ValueError(str(err)) from None
        elif indexer is not None:
            f.fail(f"is a DSA checkpoint (its lightning indexer is in its config); drop --indexer {indexer}")
        given = {k: v for k, v in decode_overrides.items() if k in fields or found is None}
        try:
            config = make_config({**fields, **given}, found)
        except (TypeError, ValueError) as err:
            f.fail(f"its config does not make a model ({err})")
        family = family_of(config)
        template = jax.eval_shape(lambda: family.init_weights(config, 0))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
        if [jax.tree_util.keystr(p) for p, _ in leaves] != names:
            f.fail(f"holds another weight layout than this version's {family.name} weights")
        declared = sum(math.prod(spec.shape) * stored.itemsize for _, spec in leaves)
        if declared > max_bytes:
            f.fail(f"its config declares {declared / 2**30:.1f} GiB of weights, more than max_bytes = "
                   f"{max_bytes / 2**30:.1f} GiB (load_model(path, max_bytes=...) to allow it)")
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
            if record is not None or _digest(fields, arrays) not in KNOWN_UNHASHED:
                print(f"load_model: {str(path)!r} carries no content hash (written before checkpoints had one); "
                      "its weights' integrity is not checked", file=sys.stderr)
        elif _digest(_hashed_fields(fields, record), arrays) != header["sha256"]:
            f.fail("its content hash does not match its config and weights (the file was changed after it was saved)")
    values = []
    for (_, spec), a in zip(leaves, arrays):
        a = a.view(jnp.bfloat16) if stored == np.uint16 else a
        values.append(jnp.asarray(a).astype(spec.dtype))
    return config, jax.tree_util.tree_unflatten(treedef, values), header.get("meta", {})

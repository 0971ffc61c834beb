"""A trained model on disk: its Config fields and weights in one .npz (weights in Config.dtype)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..models import dsa

FORMAT = "hisparse-dsa-checkpoint"
# Fields a loader may change: they size the decode (cache, context, kernels), not the weights;
# and dtype, to which the weights are cast (float32 runs a bf16 model on XLA:CPU, which has no
# bf16 dot: the same weights, computed in float32).
DECODE_FIELDS = ("top_k", "hot_slots", "max_context", "pool_records", "prefill_chunk", "implementation",
                 "indexer_implementation", "prefetch", "dtype")


def _config_fields(config: dsa.Config) -> dict:
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = str(value) if f.name == "dtype" else value
    return out


def save_model(path: str | Path, config: dsa.Config, weights: dsa.Weights, meta: dict | None = None) -> int:
    """Writes the weights (cast to config.dtype) with the config and `meta`; returns the file's bytes."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(weights)
    arrays = {}
    for i, (path_, leaf) in enumerate(leaves):
        a = np.asarray(jax.device_get(jnp.asarray(leaf, config.dtype)))
        arrays[f"w{i:04d}"] = a.view(np.uint16) if a.dtype == jnp.bfloat16 else a
    header = dict(format=FORMAT, config=_config_fields(config), meta=meta or {},
                  leaves=[jax.tree_util.keystr(p) for p, _ in leaves])
    buffer = io.BytesIO()
    np.savez_compressed(buffer, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    Path(path).write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def load_model(path: str | Path, **decode_overrides):
    """(config, weights, meta) of a saved model; decode_overrides may set DECODE_FIELDS only."""
    unknown = sorted(set(decode_overrides) - set(DECODE_FIELDS))
    if unknown:
        raise ValueError(f"load_model: {', '.join(unknown)} change the weights' shapes; only "
                         f"{', '.join(DECODE_FIELDS)} may be overridden")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"load_model: {str(path)!r}: no such file")
    with np.load(path, allow_pickle=False) as f:
        header = json.loads(f["header"].tobytes().decode())
        if header.get("format") != FORMAT:
            raise ValueError(f"load_model: {str(path)!r} is not a {FORMAT} file")
        arrays = [f[f"w{i:04d}"] for i in range(len(header["leaves"]))]
    config = dsa.Config(**{**header["config"], **decode_overrides})
    template = jax.eval_shape(lambda: dsa.init_weights(config, 0))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    if [jax.tree_util.keystr(p) for p, _ in leaves] != header["leaves"]:
        raise ValueError(f"load_model: {str(path)!r} holds another weight layout than this version's dsa.Weights")
    stored = np.dtype(header["config"]["dtype"])
    values = []
    for (_, spec), a in zip(leaves, arrays):
        a = a.view(jnp.bfloat16) if stored == jnp.bfloat16 and a.dtype == np.uint16 else a
        if a.shape != spec.shape:
            raise ValueError(f"load_model: a weight of shape {a.shape} where the config needs {spec.shape}")
        values.append(jnp.asarray(a).astype(spec.dtype))
    return config, jax.tree_util.tree_unflatten(treedef, values), header["meta"]

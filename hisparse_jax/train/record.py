"""Recording the trained model's selections while it decodes long held-out documents.

Each stream reads one document: a dense prefill of its first `prefill` tokens, then `steps`
decode steps teacher-forced with the document's next tokens (generate's teacher_tokens), every
step's top-k ids of every layer recorded (record_selection). The trace file
(hisparse_jax.selection.recorded) carries the model, the documents and the decode's own next-token loss.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import decode
from ..selection.recorded import RecordedTrace
from .checkpoint import load_model, with_decode_fields
from .corpus import Corpus
from .indexer_spec import describe
from .model import family_of, kit_indexer

MAX_RECORD_TOKENS = 2**30  # prefill + steps: positions and record ids are int32

def next_token_loss(logits, targets) -> float:
    """Mean cross-entropy in nats of logits [..., V] against integer targets [...], in float64."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    target = np.take_along_axis(logits, np.asarray(targets)[..., None], axis=-1)[..., 0]
    return float(np.mean(log_z - target))


def record_trace(model_path: str | Path, corpus: Corpus, *, documents: int, prefill: int, steps: int,
                 mode: str = "device", top_k: int | None = None, hot_slots: int | None = None,
                 indexer: str | None = None) -> RecordedTrace:
    """The selections of `steps` teacher-forced decode steps after a `prefill`-token prompt, one
    held-out document per stream (the longest that have prefill + steps + 1 tokens). The model is
    DSA or a kit model with any protocol indexer; `indexer` (MODULE:NAME) says where a
    researcher's indexer module is (checkpoint.load_model)."""
    for name, value in (("documents", documents), ("prefill", prefill), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RECORD_TOKENS:
            raise ValueError(f"record: {name} must be an int in [1, 2^30], got {value!r}")
    if prefill + steps > MAX_RECORD_TOKENS:
        raise ValueError(f"record: prefill + steps = {prefill + steps} tokens, more than 2^30 (positions and "
                         "record ids are int32); lower prefill or steps")
    for name, value in (("top_k", top_k), ("hot_slots", hot_slots)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_RECORD_TOKENS):
            raise ValueError(f"record: {name} must be None or an int in [1, 2^30], got {value!r}")
    # Loaded once, at its own fields (a bad checkpoint is named as such); the decode's fields are
    # then set apart, so that a top_k or context the model cannot take is named as the caller's.
    base, weights, meta = load_model(model_path, indexer=indexer)
    k = base.top_k if top_k is None else top_k
    if prefill < k:
        raise ValueError(f"record: prefill={prefill} tokens hold fewer records than top_k={k}; "
                         "the trace would start with short selections: prefill at least top_k tokens")
    context = -(-(prefill + steps) // base.prefill_chunk) * base.prefill_chunk
    asked = dict(max_context=context, hot_slots=hot_slots or max(base.hot_slots, k),
                 **({} if top_k is None else dict(top_k=top_k)))
    try:
        config = with_decode_fields(base, **asked)
    except (TypeError, ValueError) as err:
        raise ValueError(f"record: the model cannot decode with top_k={k}, hot_slots={asked['hot_slots']} at "
                         f"{prefill} + {steps} tokens ({' '.join(str(err).split())[:300]}); change top_k, prefill "
                         "or steps") from None
    docs = corpus.long_documents(prefill + steps + 1)
    if len(docs) < documents:
        raise ValueError(f"record: {len(docs)} held-out documents have {prefill + steps + 1} tokens, {documents} "
                         "asked for; lower --documents, --prefill or --steps")
    docs = docs[:documents]
    text = np.stack([d.tokens[: prefill + steps + 1] for d in docs]).astype(np.int32)
    family = family_of(config)
    state = family.init_state(config, documents, mode)
    state, _ = decode.prefill(family, config, weights, state, jnp.asarray(text[:, :prefill]),
                              jnp.full((documents,), prefill, jnp.int32))
    teacher = jnp.asarray(text[:, prefill + 1 :].T)  # [steps, streams]: fed after each step
    out = decode.generate(family, config, weights, state, jnp.asarray(text[:, prefill]), steps,
                          return_logits=True, record_selection=True, teacher_tokens=teacher)
    logits, ids = out.logits, out.selections
    decode_loss = next_token_loss(jax.device_get(logits), jax.device_get(teacher))
    with open(model_path, "rb") as f:  # in pieces: the file may hold more than the members read
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    protocol = kit_indexer(config)
    shape = ("vocab", "d_model", "num_layers", "n_heads", "kv_lora_rank", "qk_rope_dim", "index_heads", "index_dim",
             "top_k", "dtype", "rope_theta")
    source = dict(
        kind="recorded", model=Path(model_path).name, model_sha256=digest, family=family.name,
        model_config={f: str(getattr(config, f)) if f == "dtype" else getattr(config, f)
                      for f in shape if hasattr(config, f)},
        **({} if protocol is None else dict(indexer=describe(protocol))),
        training=meta, documents=[dict(name=d.name, tokens=int(d.tokens.size)) for d in docs],
        prefill=prefill, steps=steps, mode=mode,
        decode_loss_nats_per_byte=decode_loss,
        teacher_forced="each step is fed the document's next token; the ids are the model's own top-k",
    )
    sealed = prefill + np.arange(steps, dtype=np.int32)[:, None].repeat(documents, 1)
    return RecordedTrace(ids=np.asarray(jax.device_get(ids), np.int32), sealed=sealed, page_size=1, source=source,
                         index=_index_trace(config, out.index_selections, sealed))


def _index_trace(config, fetched, sealed_tokens) -> RecordedTrace | None:
    """The ids of the indexer's own records (kit.RecordKind) each group fetched, as a trace of
    their own (RecordedTrace.index), or None for an indexer without a record kind. At the step
    whose token is at position p the kind holds p // page sealed records (the token is written to
    its open record before the group fetches)."""
    if fetched is None:
        return None
    store = config.index_cache_config(1)
    kind = dict(kind="index-records", page=store.page_size, width=store.record_width, dtype=store.dtype.name,
                fetch=store.top_k, hot_slots=store.hot_slots, record_bytes=store.record_bytes)
    return RecordedTrace(ids=np.asarray(jax.device_get(fetched), np.int32), sealed=sealed_tokens // store.page_size,
                         page_size=store.page_size, source=kind)

"""`hisparse-bench indexers`: protocol indexers compared on one model, from training to capacity.

For each indexer (`--indexer MODULE:NAME`, trained here on the plan of `--model`; `dsa` names
DSA's lightning indexer; without any, DSA's and the kit's PageMinMax) or trained checkpoint (`--checkpoint PATH`, `PATH=MODULE:NAME` for an
indexer outside hisparse_jax) it measures:
- the held-out next-token loss with dense and with sparse attention (the windows fit evaluates),
  the indexer's KL to the head-summed attention, and the share of that attention's mass its
  top-k keeps (queries with more than top_k sealed keys; hisparse_jax.train.forward);
- the misses of every cache policy at B/k = 1..4 on the trace it records while decoding held-out
  documents (python -m hisparse_jax.train record; hisparse_jax.selection.policies), and the KV
  bytes LRU fetches per decoded token;
- for an indexer with a record kind of its own (kit.RecordKind: the two-level indexer's fine
  keys), the ids of those records it fetched, recorded with the trace, replayed through LRU at
  the indexer's hot slots and at each B/k: their miss rate and miss bytes per decoded token;
- the device bytes per request of the trained model's HiSparse state at 32K-256K tokens, from
  the declared layout of its state (indexer metadata, hot buffer, the rest), and full-KV's;
- on a GPU, the capacity batch and the HiSparse / full-KV throughput on a deployment slice with
  the indexer (hisparse-bench decode --deployment; skipped on a CPU with a note).
It prints a table, writes indexers.json and indexers.png into --out (and each candidate's
checkpoint and trace under --out/NAME/).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

from ..selection import policies as cache_policies
from ..selection.recorded import load_trace, save_trace
from ..train.checkpoint import load_model
from ..train.corpus import Corpus, WindowSampler
from ..train.fit import evaluate
from ..train.indexer_spec import load_indexer
from ..train.model import MODELS, family_of, kit_indexer
from ..train.record import record_trace
from . import indexer_slice as slice_run, indexers_report, outputs
from .decode.capacity import INDEXER_RECORDS, account
from .errors import BenchError

DSA = "dsa"  # --indexer dsa: DSA's lightning indexer (fit without --indexer)
# Without --indexer or --checkpoint: the two indexers on the kit, each trained here (tiny: about
# 40 s each on two CPU cores).
DEFAULT_INDEXERS = (DSA, "hisparse_jax.kit.page_minmax:PageMinMax")
CONTEXTS = (32768, 65536, 131072, 262144)
RATIOS = (1.0, 2.0, 3.0, 4.0)
MAX_RECORD_TOKENS = 2**30  # prefill + steps of a recorded trace: positions and record ids are int32
# What `record` decodes per trained shape: the tiny model on held-out documents a CPU decodes in
# seconds (n/k = 32 at its k = 16, as 64K tokens are for k = 2048; 640 tokens, a multiple of
# page sizes up to 128); the trace model as
# docs/training.md records it.
RECORD = {"tiny": dict(documents=2, prefill=512, steps=128), "trace-model": dict(documents=8, prefill=32768, steps=160)}


@dataclasses.dataclass
class Candidate:
    """One indexer to compare: its label, the spec that trains it (None: a given checkpoint),
    the checkpoint, and the MODULE:NAME that finds its code (None: inside hisparse_jax)."""

    label: str
    spec: str | None
    checkpoint: Path | None
    code: str | None
    model: str = "tiny"  # the trained shape (RECORD's defaults of the recorded trace)
    top_k: int | None = None  # the model's k: the recorded prefill must hold that many records


def _candidates(args) -> list[Candidate]:
    """The --indexer and --checkpoint values, each checked (imported, read) before any training."""
    found = []
    if not args.indexer and not args.checkpoint:
        args.indexer = list(DEFAULT_INDEXERS)
    for spec in args.indexer or []:
        try:
            label = "DSA" if spec == DSA else load_indexer(spec).name
        except (TypeError, ValueError) as err:  # kit's checks raise TypeError for a non-Indexer
            raise BenchError(f"argument --indexer: {err}") from None
        found.append(Candidate(label, spec, None, None if spec == DSA else spec, args.model,
                               MODELS[args.model]["top_k"]))
    for given in args.checkpoint or []:
        path, _, code = given.partition("=")
        try:
            config, _, meta = load_model(path, indexer=code or None)
        except ValueError as err:
            raise BenchError(f"argument --checkpoint: {err}") from None
        if jax.default_backend() == "cpu" and str(config.dtype) == "bfloat16":
            raise BenchError(f"argument --checkpoint: {path} is a bfloat16 model, which XLA:CPU cannot decode (its "
                             "trace is recorded by decoding); compare it on a GPU")
        indexer = kit_indexer(config)
        found.append(Candidate("DSA" if indexer is None else indexer.name, None, Path(path), code or None,
                               _record_model(meta), config.top_k))
    seen: dict[str, int] = {}
    for c in found:  # one folder per candidate under --out
        seen[c.label] = seen.get(c.label, 0) + 1
        if seen[c.label] > 1:
            c.label = f"{c.label}-{seen[c.label]}"
    return found


def _record_model(meta) -> str:
    """The trained shape whose RECORD defaults a checkpoint's trace takes (tiny when unknown)."""
    model = meta.get("model") if isinstance(meta, dict) else None
    return model if isinstance(model, str) and model in RECORD else "tiny"


def _check_repeats(args) -> None:
    """A value given twice in a list flag would be measured twice (or silently once): refused, as
    hisparse-bench policies and decode refuse it."""
    for name in ("ratios", "policies", "contexts", "slice_contexts"):
        values = getattr(args, name) or []
        again = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if again is not None:
            shown = f"{again:g}" if isinstance(again, float) else str(again)
            raise BenchError(f"argument --{name.replace('_', '-')}: {shown} given more than once")


def _record_shape(c: Candidate, args) -> dict:
    """documents, prefill and steps of the candidate's recorded trace: the flags, else its model's."""
    return {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in RECORD[c.model].items()}


def _check_record(candidates: list[Candidate], args, corpus: Corpus) -> None:
    """What `record` would refuse after the training and the held-out evaluation, refused before
    them: a prefill shorter than the model's top_k, positions beyond int32, and more documents
    than the held-out corpus has of prefill + steps + 1 tokens."""
    for c in candidates:
        shape = _record_shape(c, args)
        prefill, steps, documents = shape["prefill"], shape["steps"], shape["documents"]
        if prefill + steps > MAX_RECORD_TOKENS:
            raise BenchError(f"argument --steps: --prefill {prefill} + --steps {steps} tokens exceed "
                             f"{MAX_RECORD_TOKENS} (positions and record ids are int32); lower --prefill or --steps")
        if c.top_k is not None and prefill < c.top_k:
            raise BenchError(f"argument --prefill: {prefill} is below {c.label}'s top_k = {c.top_k} (the prefill must "
                             f"hold k records, or the first selections are short); give --prefill {c.top_k} or more")
        found = len(corpus.long_documents(prefill + steps + 1))
        if found < documents:
            raise BenchError(f"argument --documents: {found} held-out documents have {prefill + steps + 1} tokens "
                             f"(--prefill {prefill} + --steps {steps} + 1), {documents} asked for; lower --documents, "
                             "--prefill or --steps")


def _train(c: Candidate, args, out: Path) -> None:
    """Trains the candidate with `python -m hisparse_jax.train fit` into out/LABEL/model.npz."""
    from ..train import __main__ as train_cli  # imported here: it imports hisparse_jax.bench.arguments
    folder = out / c.label
    argv = ["fit", "--model", args.model, "--out", str(folder),
            *([] if c.spec == DSA else ["--indexer", c.spec]),
            *([] if args.max_steps is None else ["--max-steps", str(args.max_steps)]),
            *(["--time-scale", str(args.time_scale)] if args.time_scale != 1.0 else []),
            *([] if args.roots is None else ["--roots", *args.roots])]
    print(f"indexers: training {c.label}: python -m hisparse_jax.train {' '.join(argv)}", flush=True)
    if train_cli.main(argv) != 0:
        raise BenchError(f"training {c.label} failed (the line above says why)", status=1)
    c.checkpoint = folder / "model.npz"


def _held_out(config, weights, meta: dict, corpus: Corpus) -> dict:
    """fit's held-out evaluation of the checkpoint, on the windows fit evaluated, with the top-k mass."""
    plan = meta.get("plan") or {}
    length, count = int(plan.get("eval_seq_len", 64)), int(plan.get("eval_batches", 2))
    chunk, seed = int(plan.get("chunk", 32)), int(plan.get("seed", 0))
    held = WindowSampler(Corpus.packed(corpus.held_out), count, length + 1, seed + 1)
    windows = [w[None] for w in next(held)]
    e = evaluate(config, weights, windows, chunk, measure=True)
    captured = [v for v in e["dense"]["captured"] if v is not None]
    return dict(dense_lm=e["dense"]["lm"], sparse_lm=e["sparse"]["lm"], sparse_minus_dense=e["sparse_minus_dense_lm"],
                kl_dense=float(np.mean(e["dense"]["kl"])), kl_sparse=float(np.mean(e["sparse"]["kl"])),
                kl_per_layer=e["dense"]["kl"], captured=float(np.mean(captured)) if captured else None,
                captured_per_layer=e["dense"]["captured"], windows=count, window_tokens=length)


def _misses(c: Candidate, args, corpus: Corpus, model: str, folder: Path, config) -> dict:
    """The candidate's recorded trace (out/LABEL/trace.npz) replayed through every policy, and
    its indexer's own records (if it has a record kind) through LRU."""
    shape = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in RECORD[model].items()}
    trace = record_trace(c.checkpoint, corpus, mode="device", indexer=c.code, **shape)
    save_trace(folder / "trace.npz", trace)
    trace = load_trace(folder / "trace.npz")  # the file hisparse-bench policies replays
    warm = trace.steps // 4
    start = time.perf_counter()
    result = cache_policies.replay(trace.ids, ratios=args.ratios, policies=args.policies, warm=warm)
    result["replay_s"] = round(time.perf_counter() - start, 3)
    floats = lambda values: [None if math.isnan(v) else round(float(v), 6) for v in values]
    result["step_overlap"] = floats(cache_policies.step_overlap(trace.ids))
    result["layer_overlap"] = floats(cache_policies.layer_overlap(trace.ids))
    result["trace"] = dict(file=str(folder / "trace.npz"), decode_loss=trace.source["decode_loss_nats_per_byte"],
                           num_records=trace.num_records, **shape)
    # KV bytes fetched per decoded token: every layer of a selecting group fetches its misses.
    tokens = (trace.steps - warm) * trace.streams
    kv_bytes = config.cache_config(1).record_bytes * getattr(config, "index_share", 1)
    result["record_bytes"] = config.cache_config(1).record_bytes
    result["miss_bytes_per_token"] = {p: [m * kv_bytes / tokens for m in result["misses"][p]] for p in result["misses"]}
    result["index_records"] = None if trace.index is None else index_misses(trace.index, args.ratios, warm)
    return result


def index_misses(index, ratios, warm: int) -> dict:
    """A trace's index (RecordedTrace.index: the ids of the indexer's own records each group
    fetched) replayed through LRU, RESOLVE's policy, at the kind's hot slots and at B/k = each of
    `ratios`: misses, miss rate and miss bytes per decoded token (a step of every stream is a
    token), from step `warm` on."""
    kind = index.source
    hot, record_bytes = kind.get("hot_slots"), kind.get("record_bytes")
    for name, value in (("hot_slots", hot), ("record_bytes", record_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"the trace's index names {name}={value!r}, expected a positive int; "
                             "record the trace again")
    if hot < index.k:
        raise ValueError(f"the trace's index has hot_slots={hot} below its fetch={index.k}; record the trace again")
    at_hot = hot / index.k
    asked = [float(r) for r in ratios] + ([] if any(round(r * index.k) == hot for r in ratios) else [at_hot])
    replayed = cache_policies.replay(index.ids, ratios=asked, policies=["lru"], warm=warm)
    tokens = (index.steps - warm) * index.streams
    misses = replayed["misses"]["lru"]
    return dict(kind=kind, fetch=index.k, hot_slots=hot, groups=index.layers, ratios=asked,
                capacities=replayed["capacities"], hot_ratio=at_hot, selected=replayed["selected"],
                misses=misses, miss_rate=replayed["miss_rate"]["lru"],
                layer_miss_rate=replayed["layer_miss_rate"]["lru"],
                miss_bytes_per_token=[m * record_bytes / tokens for m in misses])


def _bytes(config, contexts) -> dict:
    """Per request device bytes of the trained model's HiSparse and full-KV states at each
    context (the declared layout: nothing allocated), by category."""
    family = family_of(config)
    out = {}
    for context in contexts:
        sized = dataclasses.replace(config, max_context=context)
        hisparse, full = account(family, sized, 1, "hisparse"), account(family, sized, 1, "device")
        out[str(context)] = dict(hisparse=hisparse.per_request("device"), full_kv=full.per_request("device"),
                                 hisparse_by_category=hisparse.by_category("device", per_request=True),
                                 hisparse_indexer_records=hisparse.by_category("device", per_request=True).get(
                                     INDEXER_RECORDS, 0))
    return out


def _measure(c: Candidate, args, corpus: Corpus, out: Path) -> dict:
    """Every figure of one candidate."""
    start = time.perf_counter()
    on_cpu = jax.default_backend() == "cpu"
    config, weights, meta = load_model(c.checkpoint, indexer=c.code, **(dict(dtype="float32") if on_cpu else {}))
    folder = out / c.label
    folder.mkdir(parents=True, exist_ok=True)
    model = _record_model(meta)
    indexer = kit_indexer(config)
    entry = dict(label=c.label, checkpoint=str(c.checkpoint), model=model,
                 indexer=None if indexer is None else dict(cls=type(indexer).__qualname__,
                                                           fields=dataclasses.asdict(indexer)),
                 top_k=config.top_k, hot_slots=config.hot_slots, layers=config.num_layers,
                 parameters=int(sum(np.size(p) for p in jax.tree.leaves(weights.indexers))),
                 training={k: (meta.get("summary") or {}).get(k) for k in ("train_seconds", "tokens_seen")})
    print(f"indexers: {c.label}: held-out loss and KL", flush=True)
    entry["held_out"] = _held_out(config, weights, meta, corpus)
    print(f"indexers: {c.label}: recording its trace and replaying it", flush=True)
    entry["misses"] = _misses(c, args, corpus, model, folder, config)
    entry["bytes_per_request"] = _bytes(config, args.contexts)
    entry["deployment"] = None
    if args.deployment is not None and not on_cpu:
        print(f"indexers: {c.label}: capacity and throughput on the {args.deployment} slice", flush=True)
        try:
            entry["deployment"] = slice_run.measure(c.label, config, args, out)
        except BenchError as err:  # the slice refuses this indexer: the other figures stand
            entry["deployment"] = dict(slice=args.deployment, error=str(err), rows=[])
    entry["seconds"] = round(time.perf_counter() - start, 1)
    return entry


def run(args) -> int:
    """hisparse-bench indexers: trains what it must, measures, prints the table, writes the report."""
    outputs.check_folder("--out", args.out)
    _check_repeats(args)
    out = Path(args.out)
    if args.model is None:
        args.model = "tiny"
    candidates = _candidates(args)
    if jax.default_backend() == "cpu" and any(c.checkpoint is None for c in candidates) \
            and MODELS[args.model]["dtype"] == "bfloat16":
        raise BenchError(f"--model {args.model} is bfloat16, which XLA:CPU cannot train (it has no bfloat16 dot); "
                         "train it on a GPU, or compare --model tiny here")
    try:
        corpus = Corpus.from_roots([Path(r) for r in args.roots] if args.roots else None)
    except ValueError as err:
        raise BenchError(f"argument --roots: {err}") from None
    _check_record(candidates, args, corpus)
    for c in candidates:
        if c.checkpoint is None:
            _train(c, args, out)
    entries = []
    for c in candidates:
        try:
            entries.append(_measure(c, args, corpus, out))
        except ValueError as err:
            raise BenchError(f"{c.label}: {err}", status=1) from None
    note = None
    if args.deployment is None:
        note = "not asked for (--deployment NAME)"
    elif jax.default_backend() == "cpu":
        note = (f"{args.deployment} skipped: a slice's capacity and throughput are measured on a GPU "
                "(its bfloat16 model does not run on XLA:CPU)")
        print(f"hisparse-bench indexers: note: {note}", file=sys.stderr)
    report = dict(command=" ".join(["hisparse-bench", *getattr(args, "argv", ["indexers"])]),
                  device=str(jax.devices()[0].device_kind), contexts=list(args.contexts), ratios=list(args.ratios),
                  policies=list(args.policies), deployment=args.deployment, deployment_note=note, indexers=entries)
    print(indexers_report.format_report(report))
    written = outputs.write_report(out, "indexers.json", report, None if args.no_plots else indexers_report.write_plot)
    print("wrote " + ", ".join(map(str, written)))
    return 0

"""`python -m hisparse_jax.train fit|record`: train a model (DSA, or any protocol indexer), record its selection traces.

  python -m hisparse_jax.train fit --out results/train   # GPU: the trace model (~10 min); CPU: tiny (seconds)
  python -m hisparse_jax.train fit --model tiny --out /tmp/t   # the tiny model anywhere
  python -m hisparse_jax.train fit --indexer examples/my_indexer.py:INDEXER --out /tmp/mine   # your indexer
  python -m hisparse_jax.train record --checkpoint results/train/model.npz --out trace.npz

Every bad argument is a one-line error and exit status 2 (docs/training.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax

from ..bench import outputs
from ..bench.arguments import mode_choice
from ..bench.errors import BenchError
from ..selection.recorded import save_trace
from . import fit as fit_lib
from .checkpoint import MAX_SEED, load_model, save_model
from .corpus import Corpus
from .indexer_spec import describe, load_indexer
from .record import MAX_RECORD_TOKENS, record_trace

_INT32 = 2**31 - 1
MAX_DOCUMENTS = 1 << 16  # record's streams: one held-out document each


class _Error(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Error(message)


def _bound(n: int) -> str:
    return {_INT32: "2^31 - 1", MAX_RECORD_TOKENS: "2^30", MAX_DOCUMENTS: "2^16"}.get(n, str(n))


def _int_in(low: int, high: int, why: str = ""):
    """An argparse type: an int in [low, high] (range-checked as a Python int, before any cast)."""
    def parse(text: str) -> int:
        shown = text if len(text) <= 40 else text[:37] + "..."
        try:
            value = int(text)
        except ValueError:  # also a string of more digits than int() converts
            raise argparse.ArgumentTypeError(f"expected an int in [{low}, {_bound(high)}], got {shown!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an int in [{low}, {_bound(high)}]{why}, got {shown}")
        return value
    parse.__name__ = "int"
    return parse


MAX_TIME_SCALE = 1e6


def _time_scale(text: str) -> float:
    """An argparse type: a float in (0, MAX_TIME_SCALE] (every phase's seconds stay finite)."""
    shown = text if len(text) <= 40 else text[:37] + "..."
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1e6], got {shown!r}") from None
    if not 0 < value <= MAX_TIME_SCALE:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1e6], got {shown}")
    return value


def _path(what: str):
    """An argparse type: a path that is not empty (Path("") is the current folder, which the user
    did not name)."""
    def parse(text: str) -> str:
        if text == "":
            raise argparse.ArgumentTypeError(f"an empty path; give {what}")
        return text
    parse.__name__ = "path"
    return parse


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m hisparse_jax.train`: fit and record."""
    p = _Parser(prog="python -m hisparse_jax.train", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train the DSA model (or a protocol indexer's): dense warm-up, then sparse training")
    f.add_argument("--indexer", default=None, metavar="MODULE:NAME",
                   help="train the kit's MLA model with this protocol indexer instead of DSA's lightning indexer: "
                        "MODULE a dotted module or a .py file, NAME an Indexer or a function returning one "
                        "(docs/research.md)")
    f.add_argument("--model", default=None, choices=list(fit_lib.MODELS),
                   help="trace-model: the model of the recorded traces (bfloat16, ~8 minutes on an H200; XLA:CPU "
                        "cannot train bfloat16); tiny: float32, trains on a CPU in seconds "
                        "(default: trace-model on a GPU, tiny on a CPU)")
    f.add_argument("--plan", default=None, choices=list(fit_lib.PLANS), help="(default: the model's name)")
    f.add_argument("--max-steps", type=_int_in(1, _INT32), default=None,
                   help="cap on every phase's steps (quick runs)")
    f.add_argument("--time-scale", type=_time_scale, default=1.0, help="factor on every phase's time budget")
    f.add_argument("--seed", type=_int_in(0, MAX_SEED, " (the weights' PRNG seed is an int32)"), default=None,
                   help="the plan's seed for the weights and the batches, in [0, 2^31 - 1]")
    f.add_argument("--roots", nargs="+", type=_path("a folder of text files"), default=None,
                   help="folders of text (default: the Python standard library)")
    f.add_argument("--out", required=True, type=_path("a folder"), help="folder for model.npz and training.json")
    r = sub.add_parser("record", help="record the model's selections while it decodes long held-out documents")
    r.add_argument("--checkpoint", required=True, type=_path("a model.npz written by fit"),
                   help="a model.npz written by fit")
    r.add_argument("--indexer", default=None, metavar="MODULE:NAME",
                   help="where the checkpoint's indexer class is, when it is outside hisparse_jax (a checkpoint "
                        "does not import code by itself); its fields come from the checkpoint")
    r.add_argument("--documents", type=_int_in(1, MAX_DOCUMENTS), default=8, help="streams: one held-out document each")
    r.add_argument("--prefill", type=_int_in(1, MAX_RECORD_TOKENS), default=32768,
                   help="tokens prefilled before decoding")
    r.add_argument("--steps", type=_int_in(1, MAX_RECORD_TOKENS), default=512, help="decode steps recorded")
    r.add_argument("--top-k", type=_int_in(1, MAX_RECORD_TOKENS), default=None,
                   help="k at decode, at most --prefill (default: the model's)")
    r.add_argument("--mode", default="device", type=mode_choice, metavar="{full-kv,hisparse}",
                   help="the decode that records: full-KV (every record in HBM; `device`, the library's name, "
                        "is accepted too) or hisparse; both select the same ids (default: full-kv)")
    r.add_argument("--roots", nargs="+", type=_path("a folder of text files"), default=None,
                   help="the folders fit read (default: the standard library)")
    r.add_argument("--out", required=True, type=_path("a file name"), help="the trace file (.npz)")
    return p


def _fit(args) -> None:
    cpu = jax.default_backend() == "cpu"
    if args.model is None:
        args.model = "tiny" if cpu else "trace-model"
    indexer = None if args.indexer is None else load_indexer(args.indexer)
    config = fit_lib.model_config(args.model, indexer)
    if cpu and config.dtype == "bfloat16":
        raise ValueError(f"--model {args.model} is bfloat16, which XLA:CPU cannot train (it has no bfloat16 dot); "
                         "train it on a GPU, or give --model tiny on a CPU")
    plan = fit_lib.PLANS[args.plan or args.model]
    phases = tuple(dataclasses.replace(
        p, steps=min(p.steps, args.max_steps or p.steps),
        seconds=None if p.seconds is None else p.seconds * args.time_scale) for p in plan.phases)
    plan = dataclasses.replace(plan, phases=phases, **({} if args.seed is None else dict(seed=args.seed)))
    corpus = Corpus.from_roots([Path(r) for r in args.roots] if args.roots else None)
    out = Path(args.out)
    _check_output("--out", out)
    weights, history, summary = fit_lib.fit(config, plan, corpus, log=lambda m: print(m, flush=True))
    meta = dict(model=args.model, **({} if indexer is None else dict(indexer=describe(indexer))),
                plan=dataclasses.asdict(plan), data="byte-level; " + ", ".join(
        sorted({d.name.split("/")[0] for d in corpus.train})), train_documents=len(corpus.train),
        held_out_documents=len(corpus.held_out), summary=summary,
        device=str(jax.devices()[0].device_kind), jax=jax.__version__, date=time.strftime("%Y-%m-%d"))
    out.mkdir(parents=True, exist_ok=True)
    size = save_model(out / "model.npz", config, weights, meta)
    (out / "training.json").write_text(json.dumps(dict(meta, history=history), indent=1))
    print(f"wrote {out / 'model.npz'} ({size / 2**20:.1f} MiB) and {out / 'training.json'}")


def _check_output(flag: str, path: Path, folder: bool = True) -> None:
    """Before any work: `path` is a folder (or a file) that exists or can be created (minutes of
    training or recording must not end in an unwritable path)."""
    try:
        (outputs.check_folder if folder else outputs.check_file)(flag, path)
    except BenchError as err:
        raise ValueError(str(err)) from None


def _record(args, argv=None) -> None:
    if args.prefill + args.steps > MAX_RECORD_TOKENS:
        raise ValueError(f"--prefill {args.prefill} + --steps {args.steps} is more than 2^30 tokens (positions and "
                         "record ids are int32); lower --prefill or --steps")
    if args.top_k is not None and args.top_k > args.prefill:
        raise ValueError(f"--top-k {args.top_k} is more than --prefill {args.prefill}: the prefill must hold top-k "
                         "records before the first recorded step; lower --top-k or raise --prefill")
    _check_output("--out", Path(args.out), folder=False)
    load_model(args.checkpoint, indexer=args.indexer)  # a bad checkpoint is refused before the corpus is read
    corpus = Corpus.from_roots([Path(r) for r in args.roots] if args.roots else None)
    trace = record_trace(args.checkpoint, corpus, documents=args.documents, prefill=args.prefill, steps=args.steps,
                         mode=args.mode, top_k=args.top_k, indexer=args.indexer)
    command = "python -m hisparse_jax.train " + " ".join(sys.argv[1:] if argv is None else argv)
    trace = dataclasses.replace(trace, source=dict(trace.source, command=command))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # _check_output: it can be created
    size = save_trace(args.out, trace)
    print(f"wrote {args.out}: {trace.steps} steps x {trace.layers} layers x {trace.streams} streams, k {trace.k}, "
          f"{size / 2**20:.2f} MiB; decode loss {trace.source['decode_loss_nats_per_byte']:.4f} nats/byte")


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        if args.command == "fit":
            _fit(args)
        else:
            _record(args, argv)
    except (_Error, ValueError) as err:
        print(f"hisparse_jax.train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
from .checkpoint import load_model, save_model
from .corpus import Corpus
from .indexer_spec import describe, load_indexer
from .record import record_trace


class _Error(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Error(message)


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
    f.add_argument("--max-steps", type=int, default=None, help="cap on every phase's steps (quick runs)")
    f.add_argument("--time-scale", type=float, default=1.0, help="factor on every phase's time budget")
    f.add_argument("--seed", type=int, default=None, help="the plan's seed for the weights and the batches")
    f.add_argument("--roots", nargs="+", default=None, help="folders of text (default: the Python standard library)")
    f.add_argument("--out", required=True, help="folder for model.npz and training.json")
    r = sub.add_parser("record", help="record the model's selections while it decodes long held-out documents")
    r.add_argument("--checkpoint", required=True, help="a model.npz written by fit")
    r.add_argument("--indexer", default=None, metavar="MODULE:NAME",
                   help="where the checkpoint's indexer class is, when it is outside hisparse_jax (a checkpoint "
                        "does not import code by itself); its fields come from the checkpoint")
    r.add_argument("--documents", type=int, default=8, help="streams: one held-out document each")
    r.add_argument("--prefill", type=int, default=32768, help="tokens prefilled before decoding")
    r.add_argument("--steps", type=int, default=512, help="decode steps recorded")
    r.add_argument("--top-k", type=int, default=None, help="k at decode (default: the model's)")
    r.add_argument("--mode", default="device", type=mode_choice, metavar="{full-kv,hisparse}",
                   help="the decode that records: full-KV (every record in HBM; `device`, the library's name, "
                        "is accepted too) or hisparse; both select the same ids (default: full-kv)")
    r.add_argument("--roots", nargs="+", default=None, help="the folders fit read (default: the standard library)")
    r.add_argument("--out", required=True, help="the trace file (.npz)")
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
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be a positive int, got {args.max_steps}")
    if not args.time_scale > 0:
        raise ValueError(f"--time-scale must be > 0, got {args.time_scale}")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be an int >= 0, got {args.seed}")
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
    _check_output("--out", Path(args.out), folder=False)
    load_model(args.checkpoint, indexer=args.indexer)  # a bad checkpoint is refused before the corpus is read
    corpus = Corpus.from_roots([Path(r) for r in args.roots] if args.roots else None)
    trace = record_trace(args.checkpoint, corpus, documents=args.documents, prefill=args.prefill, steps=args.steps,
                         mode=args.mode, top_k=args.top_k, indexer=args.indexer)
    command = "python -m hisparse_jax.train " + " ".join(sys.argv[1:] if argv is None else argv)
    trace = dataclasses.replace(trace, source=dict(trace.source, command=command))
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

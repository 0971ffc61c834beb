"""`hisparse-bench indexers` on a GPU: an indexer's capacity batch and HiSparse / full-KV
throughput on a deployment slice (docs/deployments.md), by `hisparse-bench decode --deployment`
with the slice's model family replaced by the indexer's (the kit's MLA model with it; DSA's
own for DSA). The slice keeps its MLA shapes, budgets and trace calibration; the indexer keeps
its trained knobs, so its metadata bytes and compute are what they cost at the slice's size.
"""

from __future__ import annotations

from pathlib import Path

from ..train.model import family_of
from .decode.command import run_decode
from .decode.plan import build_plan


def measure(label: str, config, args, out: Path) -> dict:
    """The slice's capacity batches and throughput ratios of `config`'s family, per context."""
    from . import cli  # the parser of hisparse-bench decode (cli imports this module's command)

    argv = ["decode", "--deployment", args.deployment, "--contexts", *map(str, args.slice_contexts),
            "--trace", "glm-5.1", "--steps", str(args.slice_steps), "--reps", str(args.slice_reps),
            "--no-equal-batch", "--no-plots", "--out", str(out / label / "slice")]
    decode_args = cli.parser().parse_args(argv)
    decode_args.family = family_of(config)  # in place of the deployment's (plan.resolve_defaults)
    plan = build_plan(decode_args)
    report = run_decode(decode_args, plan)
    caps = {c.context: c.caps for c in plan.contexts}
    rows = [dict(context=r["context"], full_kv_batch=caps[r["context"]]["device"].max_batch,
                 hisparse_batch=caps[r["context"]]["hisparse"].max_batch,
                 throughput_ratio=r["throughput_hisparse_over_full_kv"],
                 throughput_ratio_range=r["throughput_hisparse_over_full_kv_range"]) for r in report["ratios"]]
    return dict(slice=args.deployment, family=report["family"], trace="glm-5.1", steps=args.slice_steps,
                reps=args.slice_reps, rows=rows, notes=report["notes"])

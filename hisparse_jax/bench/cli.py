"""`hisparse-bench`: parses the command line and hands it to the subcommand that does the work.

  decode    decode throughput at the capacity wall, HiSparse vs full-KV (hisparse_jax.bench.decode)
  bitwise   HiSparse vs full-KV tokens and logits, bit for bit, at a realistic shape
  policies  eviction policies replayed on a selection trace (hisparse_jax.bench.policies)
  indexers  protocol indexers compared, from training to capacity (hisparse_jax.bench.indexers)

A bad argument, or a run that cannot be measured, ends the command with a one-line error.
"""

from __future__ import annotations

import argparse
import sys

from . import arguments, indexers, policies
from .decode import bitwise, command
from .errors import BenchError

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    """hisparse-bench's argument parser: one subparser per subcommand (hisparse_jax.bench.arguments)."""
    p = arguments.Parser(prog="hisparse-bench", description=(
        "HiSparse benchmarks: decode throughput at the capacity wall against full-KV, the two modes' "
        "tokens and logits compared bit for bit, eviction policies replayed on selection traces, and "
        "protocol indexers compared."))
    sub = p.add_subparsers(dest="command", required=True)
    arguments.decode_arguments(sub)
    arguments.bitwise_arguments(sub)
    arguments.policies_arguments(sub)
    arguments.indexers_arguments(sub)
    return p


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        if args.command == "policies":
            args.argv = list(sys.argv[1:] if argv is None else argv)  # for the report's command line
            return policies.run(args)
        if args.command == "indexers":
            args.argv = list(sys.argv[1:] if argv is None else argv)
            return indexers.run(args)
        if args.command == "bitwise":
            return bitwise.run(args)
        return command.run(args)
    except BenchError as err:
        print(f"hisparse-bench: error: {err}", file=sys.stderr)
        return err.status


if __name__ == "__main__":
    sys.exit(main())

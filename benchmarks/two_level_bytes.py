"""Device bytes per request of a deployment slice's HiSparse state with DSA's lightning indexer
and with two-level indexers (hisparse_jax.kit.two_level), from the declared layout of the real
state (hisparse_jax.bench.decode.capacity.account: jax.eval_shape, nothing allocated; CPU is fine).

    python3 benchmarks/two_level_bytes.py [--deployment glm5-h200] [--contexts 131072 262144]
        [--indexers TwoLevel PAGE64_C64 ...]

Per context: DSA's index keys (its "indexer metadata") and whole device state per request; per
two-level setting its coarse keys (device metadata), its fine keys' hot buffer, slot map, LRU
and open page (the second record kind's device part), their sum as a fraction of DSA's keys,
the whole device state and the host pools per request, and the bytes of one fine-key page (what
a fine-key miss copies over the host link: page x fine_dim x 2 in bfloat16, page x (fine_dim + 4)
with fp8 keys, TwoLevel.fine_dtype). max_context = context + 65 (the decode
bench's room for its steps at page_size 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from hisparse_jax import kit
from hisparse_jax.bench.decode.capacity import INDEXER_RECORDS, account
from hisparse_jax.bench.deployments import DEPLOYMENTS, get_deployment
from hisparse_jax.kit import two_level
from hisparse_jax.models import dsa
from hisparse_jax.models.config import MAX_SIZE

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import one_line_errors  # noqa: E402

MiB = 2**20
SETTINGS = ("TwoLevel", "PAGE64_C64", "PAGE64_C64_FP8", "PAGE64_C128", "PAGE32_C128", "PAGE128_C32")
# The deployments with DSA's lightning indexer, which two-level indexers replace; the others
# (Quest's pages) have no indexer keys to set them against.
SUPPORTED = tuple(name for name, d in DEPLOYMENTS.items() if d.family == dsa.FAMILY.name)
ROOM = 65  # max_context = context + ROOM: the decode bench's room for its steps


def _deployment(name: str) -> str:
    """An argparse type: a deployment of SUPPORTED, or a message saying why not."""
    if name in SUPPORTED:
        return name
    if name in DEPLOYMENTS:
        raise argparse.ArgumentTypeError(
            f"{name} is a {DEPLOYMENTS[name].family} deployment, without DSA's indexer keys that two-level indexers "
            f"replace; give one of {', '.join(SUPPORTED)}")
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(SUPPORTED)}, got {name!r}")


def context_range(deployment: str) -> tuple[int, int]:
    """The contexts the deployment's configs take: max_context = context + ROOM holds at least
    top_k records (top_k x page_size tokens) and is at most MAX_SIZE (2^31 - 1)."""
    config = dsa.Config.preset("realistic", **get_deployment(deployment).derive().overrides, max_context=MAX_SIZE)
    return max(1, config.top_k * config.page_size - ROOM), MAX_SIZE - ROOM


def _tokens(context: int) -> str:
    return f"{context // 1024}K" if context % 1024 == 0 else str(context)


def lines(deployment: str, contexts, settings) -> list[str]:
    derived = get_deployment(deployment).derive()
    kit_fields = {f.name for f in dataclasses.fields(kit.Config)}
    out = [f"{deployment}: {derived.layers} layers per GPU", "",
           "| context | indexer | indexer device metadata | indexer records (device) | together | / DSA keys "
           "| all device state | host pools | fine-key page |", "|---|---|---|---|---|---|---|---|---|"]
    for context in contexts:
        max_context = context + ROOM
        dsa_config = dsa.Config.preset("realistic", **derived.overrides, max_context=max_context)
        base = account(dsa.FAMILY, dsa_config, 1, "hisparse")
        keys = base.by_category("device", per_request=True).get("indexer metadata", 0)
        out.append(f"| {_tokens(context)} | DSA (fp8 keys) | {keys / MiB:.2f} MiB | - | {keys / MiB:.2f} MiB | 1 "
                   f"| {base.per_request('device') / MiB:.1f} MiB | {base.per_request('host') / MiB:.0f} MiB | - |")
        for name in settings:
            indexer = getattr(two_level, name)
            indexer = indexer() if isinstance(indexer, type) else indexer
            family = kit.family(indexer)
            config = family.Config.preset("realistic", max_context=max_context,
                                          **{k: v for k, v in derived.overrides.items() if k in kit_fields})
            bytes_account = account(family, config, 1, "hisparse")
            per_request = bytes_account.by_category("device", per_request=True)
            meta, records = per_request.get("indexer metadata", 0), per_request.get(INDEXER_RECORDS, 0)
            out.append(f"| {_tokens(context)} | {indexer.name} | {meta / MiB:.2f} MiB | {records / MiB:.2f} MiB "
                       f"| {(meta + records) / MiB:.2f} MiB | 1/{keys / (meta + records):.1f} "
                       f"| {bytes_account.per_request('device') / MiB:.1f} MiB "
                       f"| {bytes_account.per_request('host') / MiB:.0f} MiB "
                       f"| {config.index_cache_config(1).record_bytes / 1024:g} KiB |")
    return out


def main(argv=None) -> int:
    parser = one_line_errors(argparse.ArgumentParser(prog="two_level_bytes.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("--deployment", default="glm5-h200", type=_deployment, metavar="DEPLOYMENT",
                        help=f"a DSA deployment slice (docs/deployments.md): {', '.join(SUPPORTED)}")
    parser.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144],
                        help="tokens per request (at least the deployment's top_k less the 65 tokens of room, at "
                             "most 2^31 - 66)")
    parser.add_argument("--indexers", nargs="+", default=list(SETTINGS), choices=SETTINGS, metavar="INDEXER",
                        help=f"names in hisparse_jax.kit.two_level: the class (its defaults) or a named setting: "
                             f"{', '.join(SETTINGS)}")
    args = parser.parse_args(argv)
    low, high = context_range(args.deployment)
    for context in args.contexts:
        if not low <= context <= high:
            parser.error(f"argument --contexts: expected tokens per request in [{low}, {high}] for "
                         f"{args.deployment} (max_context = context + {ROOM} holds its top_k records and is at most "
                         f"2^31 - 1), got {context}")
    for flag, values in (("--contexts", args.contexts), ("--indexers", args.indexers)):
        if len(set(values)) != len(values):
            parser.error(f"argument {flag}: {', '.join(sorted({str(v) for v in values if values.count(v) > 1}))} "
                         "given twice; give each once")
    print("\n".join(lines(args.deployment, args.contexts, args.indexers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

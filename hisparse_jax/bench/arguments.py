"""The arguments of each `hisparse-bench` subcommand, one function per subcommand.

Each function registers its subcommand on the subparsers of `hisparse_jax.bench.cli.parser()`; the
types here check a number when it is parsed, so a bad one is a one-line error before anything runs.
"""

from __future__ import annotations

import argparse
import math

from ..selection import policies as cache_policies, synthetic as traces
from ..models import known_families
from . import indexers, policies
from .decode import bitwise, command
from .decode.plan import CPU_DEFAULTS, DEPLOYMENT_DEFAULTS
from .decode.runner import FILLS
from .deployments import DEPLOYMENTS
from .errors import BenchError


class Parser(argparse.ArgumentParser):
    """argparse without the usage dump: an error is one line (see --help for the usage)."""

    def error(self, message):
        raise BenchError(message, status=2)


def _number(kind, what: str, minimum, maximum=None, why: str = ""):
    """An argparse type: a `kind` number >= minimum (finite, <= maximum if given), else a message
    naming `what` (and `why` the maximum)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        # An int is compared as an int: math.isfinite would cast it to a float (10**400 overflows).
        if not ((isinstance(value, int) or math.isfinite(value)) and value >= minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text} exceeds {maximum} ({why})")
        return value

    parse.__name__ = what
    return parse


_count = _number(int, "a positive integer", 1)
# Positions and record ids are int32, and a context needs room for the tokens decoded after it.
_tokens = _number(int, "a positive number of tokens", 1, 2**30, "positions and record ids are int32")
_factor = _number(float, "a positive factor", 1e-12, 1e9, "a factor of time")
# Memory budgets: at least one byte (a smaller one is 0 B once counted in bytes), finite and far
# above any machine (1 PiB), so that bytes stay integers.
_mib = _number(float, "a positive size of at least one byte", 2.0**-20, 2.0**30, "1 PiB; no machine has more")
_gib = _number(float, "a positive size of at least one byte", 2.0**-30, 2.0**20, "1 PiB; no machine has more")
# Record ids, positions and step counters of the traces are int32.
INT32_MAX = 2**31 - 1


def mode_choice(text: str) -> str:
    """An argparse type for a decode mode: full-kv (the baseline's one name; the library's name
    device works too) -> "device"; hisparse. Shared by hisparse-bench and the train command."""
    mode = {"full-kv": "device", "device": "device", "hisparse": "hisparse"}.get(text.lower())
    if mode is None:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from full-kv, hisparse)")
    return mode


def decode_arguments(sub) -> None:
    """Registers the `decode` subcommand: decode throughput at the capacity wall."""
    d = sub.add_parser("decode", help="decode throughput at the capacity wall",
                       description=command.__doc__.split("\n\n", 1)[1].split("\n\nWithout")[0])
    cpu, slc = CPU_DEFAULTS, DEPLOYMENT_DEFAULTS
    d.add_argument("--deployment", default=None, choices=list(DEPLOYMENTS),
                   help="a deployment slice (docs/deployments.md): sets the model, its per-GPU share and the "
                        "device budget, and the defaults marked 'deployment' below")
    d.add_argument("--explain", action="store_true",
                   help="print the slice's derivation (with --deployment) and each run's batch, then exit")
    d.add_argument("--family", default=None, choices=known_families(), help=f"model family (default: {cpu['family']})")
    d.add_argument("--indexer", default=None, metavar="MODULE:NAME",
                   help="the kit's MLA model with this protocol indexer (docs/kit.md) in place of --family, or of a "
                        "--deployment slice's family (the slice's MLA shapes kept): MODULE a dotted module or a .py "
                        "file, NAME an Indexer or a function returning one")
    d.add_argument("--preset", default=None, help=f"family preset, tiny or realistic (default: {cpu['preset']})")
    d.add_argument("--contexts", type=_tokens, nargs="+", default=None,
                   help=f"prompt tokens per request, one measurement each (default: {cpu['contexts']}; "
                        f"deployment: {slc['contexts']})")
    budget = d.add_mutually_exclusive_group()
    budget.add_argument("--device-budget-mib", type=_mib, default=None,
                        help="HBM budget for one decode state and the decode's working memory (default: "
                             f"{cpu['device_budget_mib']}; deployment: its derivation)")
    budget.add_argument("--device-budget-gib", type=_gib, default=None, help="the same in GiB")
    d.add_argument("--host-budget-gib", type=_gib, default=None,
                   help="pinned host budget for the pools of one state (default: "
                        f"{cpu['host_budget_gib']}; deployment: {slc['host_budget_gib']})")
    d.add_argument("--max-batch", type=_count, default=None,
                   help=f"cap on the batch of any run (default: {cpu['max_batch']}; deployment: {slc['max_batch']})")
    d.add_argument("--top-k", type=_count, default=None, help="k, records selected per stream and step")
    d.add_argument("--hot-slots", type=_count, default=None, help="B >= k, hot slots per stream")
    d.add_argument("--num-layers", type=_count, default=None,
                   help="layers of the model (a slice of the real model's; per-request bytes scale with it)")
    d.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                   help="other Config overrides, e.g. index_share=4 dtype=float32")
    _decode_selection_arguments(d, cpu, slc)
    _decode_run_arguments(d, cpu, slc)


def _decode_selection_arguments(d, cpu: dict, slc: dict) -> None:
    """decode: how the state is filled and how records are selected (model, trace or recorded trace)."""
    d.add_argument("--fill", default=None, choices=FILLS,
                   help="(default: prefill; deployment: synthetic) prefill: the model's dense prefill of random prompts; synthetic: hashed "
                        "non-zero records and metadata, no O(T^2) prefill (long contexts)")
    d.add_argument("--selection", default=None, choices=["indexer", "trace", "trace-no-indexer", "recorded"],
                   help="(default: indexer; deployment: trace) indexer: the model's own top-k (random weights: little locality); trace: "
                        "the calibrated synthetic trace of docs/traces.md (the indexer still runs); "
                        "trace-no-indexer: the trace without computing the indexer (shows its cost); "
                        "recorded: the selections of a recorded trace, --trace-file (the indexer still runs)")
    d.add_argument("--trace", default=None, nargs="+", choices=list(traces.CALIBRATIONS),
                   help="the trace calibrations, one comparison each (docs/traces.md): glm-5.1 reproduces "
                        "GLM-5.1's published LRU misses, deepseek-v3.2 DeepSeek-V3.2's ~44%% step overlap "
                        f"(default: {' '.join(cpu['trace'])}; deployment: {' '.join(slc['trace'])}; "
                        "not with --selection recorded, nor are the --trace-* overrides)")
    d.add_argument("--trace-beta", type=float, default=None, help="override the calibration's beta")
    d.add_argument("--trace-rho-e", type=float, default=None, help="override the calibration's rho_e")
    d.add_argument("--trace-memoryless-layers", type=int, default=None,
                   help="leading selecting layers with no locality (real models: layers 0-1; default: 0)")
    d.add_argument("--trace-file", default=None, metavar="PATH",
                   help="with --selection recorded (required there, refused elsewhere): a recorded selection trace "
                        "(hisparse_jax.selection.recorded), one comparison labelled by the file. Its ids are replayed as "
                        "recorded: the model's selecting layer g of G replays trace layer g x L // G, stream i of "
                        "the batch trace stream i mod its streams (Quest's and NSA's KV heads of a stream share "
                        "its ids), run step t trace step t. Its k must be --top-k and its page size the model's, it "
                        "must hold every step a run decodes, and the contexts must be at least the trace's (every "
                        "id sealed when selected); a longer context keeps the trace's locality at its own context")


def _decode_run_arguments(d, cpu: dict, slc: dict) -> None:
    """decode: which runs are timed and profiled, how often, and where the report goes."""
    d.add_argument("--no-io", action="store_true", help="also time HiSparse without the record copy")
    d.add_argument("--prefetch", action="store_true",
                   help="also time HiSparse at its capacity batch with prefetch (each layer's misses copied on a "
                        "stream of its own, joined before the layer reads; with index_share > 1 a group's later "
                        "layers' copies overlap the earlier layers), timed with the run without (in turns when both states "
                        "fit in memory); with "
                        "--profile, the share of the copy time hidden behind compute")
    d.add_argument("--overlap-groups", type=int, default=1, metavar="G",
                   help="with --prefetch: the prefetch run splits the batch into G groups and runs each layer's "
                        "RESOLVE and attention group by group, one group's copy beside the others' work, also "
                        "with index_share = 1 (Config.overlap_groups; the same bits). HiSparse's capacity batch is "
                        "rounded down to a multiple of G for both its runs (default 1: the whole batch)")
    d.add_argument("--profile", action="store_true",
                   help="profile one more call of each capacity run: device time per step by category "
                        "next to the step's roofline (GPU; hisparse_jax.bench.profile)")
    d.add_argument("--profile-dir", default=None,
                   help="keep the profiler traces there, one folder per run (open them in Perfetto)")
    d.add_argument("--steps", type=_count, default=None,
                   help=f"decode steps per timed call (default: {cpu['steps']}; deployment: {slc['steps']})")
    d.add_argument("--reps", type=_count, default=None,
                   help="timed calls per run, after one untimed call; min / median / max reported "
                        f"(default: {cpu['reps']}; deployment: {slc['reps']})")
    d.add_argument("--modes", nargs="+", type=mode_choice, default=["device", "hisparse"], metavar="MODE",
                   help="the runs: full-kv (the baseline, every record in HBM; `device` is the library's name "
                        "of that mode and works too) and hisparse (default: both)")
    d.add_argument("--no-equal-batch", action="store_true", help="skip HiSparse at the baseline's batch")
    d.add_argument("--one-at-a-time", action="store_true",
                   help="time each run alone, one state in memory at a time (by default the runs of a "
                        "context are timed in turns when their states fit in memory together)")
    d.add_argument("--allow-reference", action="store_true",
                   help="time the pure-JAX reference RESOLVE when no compiled handler is available")
    d.add_argument("--out", default="results/decode", help="folder for decode.json and plots")
    d.add_argument("--no-plots", action="store_true", help="write decode.json only, no PNG plots")


def bitwise_arguments(sub) -> None:
    """Registers the `bitwise` subcommand: HiSparse vs full-KV tokens and logits, bit for bit."""
    b = sub.add_parser("bitwise", help="HiSparse vs full-KV decode, tokens and logits bitwise, at a realistic shape",
                       description=bitwise.__doc__.split("\n\n")[1])
    b.add_argument("--family", default="dsa", choices=known_families(), help="model family (default: %(default)s)")
    b.add_argument("--preset", default="realistic", help="family preset, tiny or realistic (default: %(default)s)")
    b.add_argument("--context", type=_tokens, default=32768, help="prompt tokens of the longest request "
                   "(request i has context - 97 i: ragged prompts; default: %(default)s)")
    b.add_argument("--batch", type=_count, default=4, help="requests (default: %(default)s)")
    b.add_argument("--steps", type=_count, default=32, help="decode steps per call (default: %(default)s)")
    b.add_argument("--reps", type=_count, default=3, help="timed calls per mode, after the compared call and an "
                   "untimed one; the median step is reported (default: %(default)s)")
    b.add_argument("--num-layers", type=_count, default=4, help="layers of the model (default: %(default)s)")
    b.add_argument("--json", default=None, metavar="PATH", help="also write the summary there")


def _integer(minimum: int, what: str):
    """An argparse type: an integer >= minimum, else a message naming `what` (policies' counts)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = what
    return parse


# The largest B/k replayed: a hot buffer holds at most 16384 slots per stream (CacheConfig, the
# CUDA kernel's limit) and k >= 1, so no HiSparse configuration has a larger ratio.
MAX_RATIO = 16384


def _ratio(text: str) -> float:
    """An argparse type: a finite B/k ratio in [1, MAX_RATIO]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a B/k ratio >= 1, got {text!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"expected a B/k ratio >= 1, got {text}")
    if value > MAX_RATIO:
        raise argparse.ArgumentTypeError(f"B/k = {text} exceeds {MAX_RATIO} (a hot buffer holds at most {MAX_RATIO} "
                                         "slots per stream and k >= 1); give a smaller ratio")
    return value


def policies_arguments(sub) -> None:
    """Registers the `policies` subcommand on hisparse-bench's subparsers."""
    p = sub.add_parser("policies", help="eviction policies replayed on a selection trace",
                       description=policies.__doc__.split("\n\n")[1])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace-file", default=None, metavar="PATH",
                        help="a recorded selection trace (hisparse_jax.selection.recorded.save_trace)")
    source.add_argument("--synthetic", nargs="+", default=None, choices=list(traces.CALIBRATIONS),
                        metavar="CALIBRATION",
                        help=f"calibrated synthetic traces, one replay each: {', '.join(traces.CALIBRATIONS)} "
                             "(docs/traces.md)")
    d = policies.SYNTHETIC_DEFAULTS
    # Range-checked as ints here; the trace's bytes are checked against memory before it is made
    # (policies.check_synthetic_memory).
    ids = _number(int, "a positive integer", 1, INT32_MAX, "record ids are int32")
    p.add_argument("--records", type=ids, default=None,
                   help=f"synthetic: records sealed at the first step; each step seals one more (default: {d['records']})")
    p.add_argument("--streams", type=_number(int, "a positive integer", 1, INT32_MAX, "a dimension of the trace's "
                                             "arrays"), default=None,
                   help=f"synthetic: streams (default: {d['streams']})")
    p.add_argument("--layers", type=_number(int, "a positive integer", 1, policies.MAX_LAYERS,
                                            "as Config.num_layers; the generator unrolls one top-k per layer"),
                   default=None, help=f"synthetic: selecting layers (default: {d['layers']}, at most "
                                      f"{policies.MAX_LAYERS})")
    p.add_argument("--steps", type=_number(int, "a positive integer", 1, INT32_MAX, "the step counter is int32"),
                   default=None, help=f"synthetic: decode steps (default: {d['steps']})")
    p.add_argument("--k", type=ids, default=None, help=f"synthetic: records selected per step (default: {d['k']})")
    p.add_argument("--seed", type=_number(int, "an integer >= 0", 0, 2**63 - 1, "seeds are int64"), default=0,
                   help="the synthetic trace's seed and the random policy's (default: 0)")
    p.add_argument("--ratios", type=_ratio, nargs="+", default=list(cache_policies.DEFAULT_RATIOS),
                   help="B/k values, B = round(ratio * k), at most the records the trace seals "
                        "(default: 1 1.5 2 3 4)")
    p.add_argument("--policies", nargs="+", default=list(cache_policies.POLICIES), choices=cache_policies.POLICIES,
                   metavar="POLICY", help=f"some of {', '.join(cache_policies.POLICIES)} (default: all)")
    p.add_argument("--warm", type=_integer(0, "a number of steps >= 0"), default=None,
                   help="misses count from this step on (default: a quarter of the trace's steps)")
    p.add_argument("--out", default="results/policies", help="folder for policies.json and plots (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="write policies.json only, no PNG plots")


def _checkpoint(text: str) -> str:
    if not text.partition("=")[0]:
        raise argparse.ArgumentTypeError(f"expected PATH or PATH=MODULE:NAME, got {text!r}")
    return text


def indexers_arguments(sub) -> None:
    """Registers the `indexers` subcommand: protocol indexers compared, from training to capacity."""
    p = sub.add_parser("indexers", help="protocol indexers compared: loss, KL, misses per policy, bytes, capacity",
                       description=indexers.__doc__.split("\n\n")[0])
    p.add_argument("--indexer", action="append", default=None, metavar="MODULE:NAME",
                   help="an indexer to train here (python -m hisparse_jax.train fit --indexer) and compare: MODULE a "
                        "dotted module or a .py file, NAME an Indexer or a function returning one; 'dsa' for DSA's "
                        "lightning indexer; repeat for more (default, without --checkpoint either: dsa and "
                        "hisparse_jax.kit.page_minmax:PageMinMax)")
    p.add_argument("--checkpoint", action="append", default=None, type=_checkpoint, metavar="PATH[=MODULE:NAME]",
                   help="a trained model.npz to compare (=MODULE:NAME: where its indexer's code is, when outside "
                        "hisparse_jax); repeat for more")
    p.add_argument("--model", default=None, choices=list(indexers.RECORD),
                   help="the trained shape of --indexer's training (default: tiny, about 30 s each on a CPU)")
    count = _integer(1, "a positive integer")
    p.add_argument("--max-steps", type=count, default=None, help="cap on every training phase's steps")
    p.add_argument("--time-scale", type=_factor, default=1.0, help="factor on every training phase's time budget")
    p.add_argument("--roots", nargs="+", default=None, help="folders of text (default: the Python standard library)")
    p.add_argument("--documents", type=count, default=None,
                   help="streams of the recorded trace (default: 2 tiny, 8 trace-model)")
    p.add_argument("--prefill", type=_tokens, default=None,
                   help="tokens before the recorded steps, at least the model's top_k (default: 512 tiny, 32768 "
                        "trace-model)")
    p.add_argument("--steps", type=_number(int, "a positive integer", 1, 2**30, "positions and record ids are int32"),
                   default=None,
                   help="decode steps recorded (default: 128 tiny, 160 trace-model); misses count from a quarter on")
    p.add_argument("--ratios", type=_ratio, nargs="+", default=list(indexers.RATIOS),
                   help="B/k values of the replay (default: 1 2 3 4)")
    p.add_argument("--policies", nargs="+", default=list(cache_policies.POLICIES), choices=cache_policies.POLICIES,
                   metavar="POLICY", help=f"some of {', '.join(cache_policies.POLICIES)} (default: all)")
    p.add_argument("--contexts", type=_tokens, nargs="+", default=list(indexers.CONTEXTS),
                   help="contexts of the byte account (default: 32768 65536 131072 262144)")
    p.add_argument("--deployment", default=None, choices=list(DEPLOYMENTS),
                   help="GPU: also each indexer's capacity batch and throughput ratio on this slice "
                        "(skipped on a CPU with a note)")
    p.add_argument("--slice-contexts", type=_tokens, nargs="+", default=[131072],
                   help="contexts of the slice's runs (default: 131072)")
    p.add_argument("--slice-steps", type=count, default=8, help="decode steps per timed call on the slice")
    p.add_argument("--slice-reps", type=count, default=5, help="timed calls per run on the slice")
    p.add_argument("--out", default="results/indexers",
                   help="folder for indexers.json, indexers.png and each indexer's checkpoint and trace "
                        "(default: %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="write indexers.json only, no PNG")

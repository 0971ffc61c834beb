"""Everything `hisparse-bench decode` checks and sizes before it runs anything.

`build_plan(args)` turns parsed arguments into a Plan: the Config of every context (preset,
overrides and room for every decoded token), each mode's capacity under the budgets, the runs
and how they are timed. Whatever would fail later fails here, as a BenchError holding one line:
a Config the model rejects (its ValueError names `Config.field`; the flags that set the field
are added), a bfloat16 config on XLA:CPU (which cannot run its dots), the pure-JAX reference
RESOLVE unless allowed, a recorded trace (--trace-file) whose k, page size, steps or sealed
records do not fit the runs, a run whose batch 1 does not fit the budgets (with the bytes it needs
and the budget that fits). Sizing compiles the decode of every context and mode for its memory
analysis (hisparse_jax.bench.decode.working_memory); the checks of arguments and of the state bytes
come before any compilation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ... import _ffi
from ..._ffi import extension_error
from ...selection import recorded, synthetic as traces
from ...models import Family, get_family
from ...models.config import MAX_SIZE
from .capacity import Capacity, capacity
from .working_memory import fit_batches, program_memory, working_memory
from ..deployments import get_deployment
from ..errors import BenchError
from .report import MODE_NAMES, fmt_bytes
from .runner import RecordedSelection, tokens_needed

MiB, GiB = 2**20, 2**30

# The small CPU run (`./dev bench`, no arguments): three identical runs on 2 shared cores agree on
# the ratios within the ranges they print, in about a minute (mostly compilation).
CPU_DEFAULTS = dict(family="dsa", preset="tiny", contexts=[512, 1024], device_budget_mib=4.0, host_budget_gib=4.0,
                    max_batch=16, fill="prefill", selection="indexer", trace=["glm-5.1"], steps=8, reps=30)
# A deployment slice (--deployment): long contexts from a synthetic fill, both trace calibrations,
# at least 10 timed calls, a batch cap far above any capacity.
DEPLOYMENT_DEFAULTS = dict(contexts=[32768, 131072, 262144], host_budget_gib=88.0, max_batch=512,
                           fill="synthetic", selection="trace", trace=list(traces.CALIBRATIONS), steps=16, reps=12)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run: kind ("capacity", "equal batch", or "prefetch": HiSparse at its capacity batch
    with Config.prefetch), mode, batch, and the trace it selects by (a calibration, a recorded
    trace, or None: the model's indexer)."""

    kind: str
    mode: str
    batch: int
    trace: traces.TraceConfig | RecordedSelection | None

    @property
    def key(self) -> tuple[str, str, str | None]:
        return self.kind, self.mode, None if self.trace is None else self.trace.name


@dataclasses.dataclass
class ContextPlan:
    """What runs at one context: the config, each mode's capacity, and the runs in the order
    they are started."""

    context: int
    config: object
    caps: dict[str, Capacity]
    runs: list[RunPlan]


@dataclasses.dataclass
class Plan:
    """The checked arguments' runs, context by context, and how they are timed."""

    family: object
    overrides: dict
    contexts: list[ContextPlan]
    traces: list[traces.TraceConfig | RecordedSelection]
    device_budget: int
    host_budget: int
    implementation: str
    in_turns: bool
    timing_note: str
    derivation: object = None
    state_only: bool = False  # capacities of the decode state alone (--explain on a CPU): nothing compiled


def _flag_fields(family) -> dict[str, str]:
    """Config field -> the flag that sets it."""
    return {"top_k": "--top-k", "hot_slots": "--hot-slots", "num_layers": "--num-layers",
            "max_context": "--contexts"}


def _parse_sets(family, args) -> dict:
    """--set FIELD=VALUE pairs -> Config overrides, each cast to the type of the field's value
    in the chosen preset (bool from true/false, "None" for optional fields)."""
    types = {f.name: f.type for f in dataclasses.fields(family.Config)}
    fields = set(types)
    flags = _flag_fields(family)
    preset = family.Config.preset(args.preset)
    out = {}
    given = {}
    for pair in args.set:
        name, sep, text = pair.partition("=")
        if not sep or name not in fields:
            raise BenchError(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        if name in given:  # the last one would win silently
            raise BenchError(f"--set {pair!r}: {name} is also given by --set {given[name]!r}; give it once")
        given[name] = pair
        if name == "max_context":
            raise BenchError(f"--set {pair!r}: max_context is set by --contexts, --steps and --reps "
                             "(the context plus every decoded token)")
        if name in flags and getattr(args, flags[name][2:].replace("-", "_")) is not None:
            raise BenchError(f"--set {pair!r}: {name} is also given by {flags[name]}; give it once")
        current = getattr(preset, name)
        try:
            if text == "None":
                out[name] = None
            elif isinstance(current, bool):
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                out[name] = text.lower() == "true"
            elif isinstance(current, (int, float)):
                out[name] = type(current)(text)
            elif current is None:  # optional fields: pool_records (int), index_dtype, expert_dtype (str)
                out[name] = int(text) if "int" in str(types[name]) else text
            else:
                out[name] = text
        except ValueError:
            kind = type(current).__name__ if current is not None else types[name]
            raise BenchError(f"--set {pair!r}: {name} takes a {kind} (the preset has {current!r})") from None
    return out


def _config_error(family, err: ValueError) -> BenchError:
    """A Config ValueError (it names `Config.field`), with the flags that set the fields it names."""
    message = str(err)
    flags = [flag for field, flag in _flag_fields(family).items() if re.search(rf"\b{field}\b", message)]
    derived = ("; max_context is the context plus every decoded token, steps x (reps + 1)"
               if "max_context" in message else "")
    return BenchError(f"{message} (set by {', '.join(flags + ['--set FIELD=VALUE'])}{derived})")


def _field_value(family, preset: str, overrides: dict, name: str):
    if name in overrides:
        return overrides[name]
    if name in family.Config.PRESETS[preset]:
        return family.Config.PRESETS[preset][name]
    return next(f.default for f in dataclasses.fields(family.Config) if f.name == name)


def _config(family, args, context: int, overrides: dict):
    """The preset with the command line's overrides and room for the prompt plus every decoded
    token (warm-up and timed calls), rounded up to whole pages."""
    overrides = dict(overrides)
    for field, value in (("top_k", args.top_k), ("hot_slots", args.hot_slots),
                         ("num_layers", args.num_layers)):
        if value is not None:
            overrides[field] = value
    page = _field_value(family, args.preset, overrides, "page_size")
    if isinstance(page, int) and page >= 1:  # else the Config names the bad page_size
        needed = tokens_needed(context, args.steps, args.reps, args.no_io, args.profile) + 1
        overrides["max_context"] = -(-needed // page) * page
    try:
        config = family.Config.preset(args.preset, **overrides)
    except ValueError as err:
        raise _config_error(family, err) from None
    _check_weight_dims(family, config)
    return config


def _check_weight_dims(family, config) -> None:
    """Every weight below 2^31 elements, from the weights' shapes alone (eval_shape: nothing is
    allocated, ~30 ms). Each field is already below 2^31, but a product of two of them (heads x
    head dim) made XLA abort the whole process in a reshape (--set index_heads=2147483647); the
    largest weight of the deployments (dsv32-h200) holds 0.44 x 2^31."""
    leaves = jax.tree_util.tree_flatten_with_path(jax.eval_shape(lambda: family.init_weights(config, 0)))[0]
    for path, leaf in leaves:
        if math.prod(leaf.shape) > MAX_SIZE:
            raise BenchError(f"the weight {jax.tree_util.keystr(path)} would have shape {list(leaf.shape)}: 2^31 "
                             "elements or more; lower the fields that size it (--set FIELD=VALUE)")


def _check_selection_flags(args) -> list[str]:
    """--trace-file goes with --selection recorded and only with it, without the synthetic trace's
    flags. Runs before the defaults fill --trace in; returns the synthetic trace's flags given
    (checked against the selection once the defaults are in: _check_trace_flags)."""
    given = [flag for flag, value in (("--trace", args.trace), ("--trace-beta", args.trace_beta),
                                      ("--trace-rho-e", args.trace_rho_e),
                                      ("--trace-memoryless-layers", args.trace_memoryless_layers))
             if value is not None]
    if args.selection != "recorded":
        if args.trace_file is not None:
            raise BenchError("--trace-file replays a recorded trace; add --selection recorded (or drop --trace-file)")
        return given
    if args.trace_file is None:
        raise BenchError("--selection recorded replays a recorded trace; add --trace-file PATH")
    if given:
        raise BenchError(f"{', '.join(given)}: the synthetic trace's calibration does not apply to --selection "
                         f"recorded, which replays --trace-file; drop {'them' if len(given) > 1 else 'it'}")


def _check_trace_flags(args, given: list[str]) -> None:
    """The synthetic trace's flags apply to the runs that select by it (--selection trace or
    trace-no-indexer; a deployment's default): with the indexer's own selection they would be
    ignored. Runs after the defaults fill --selection in."""
    if given and args.selection == "indexer":
        flags = ", ".join(given)
        raise BenchError(f"{flags} {'apply' if len(given) > 1 else 'applies'} to --selection trace (or "
                         "trace-no-indexer), not to the indexer's own selection; add --selection trace or drop "
                         f"{'them' if len(given) > 1 else given[0]}")


def _recorded(args, configs: dict) -> RecordedSelection:
    """The --trace-file trace, checked against every context's config before anything compiles:
    its k and page size are the model's, it holds every step a run decodes, and every id it selects
    is sealed in the benchmark's streams when it is selected (the ids are replayed as recorded)."""
    path = args.trace_file
    try:
        trace = recorded.load_trace(path)
    except ValueError as err:
        raise BenchError(f"--trace-file: {err}") from None
    where = f"--trace-file {path}"
    config = configs[args.contexts[0]]  # top_k and page_size are the same at every context
    if trace.k != config.top_k:
        hot = f" --hot-slots {trace.k}" if trace.k > config.hot_slots else ""
        raise BenchError(f"{where}: the trace selects k={trace.k} records per step, the model's top_k is "
                         f"{config.top_k}; pass --top-k {trace.k}{hot}")
    if trace.page_size != config.page_size:
        raise BenchError(f"{where}: the trace's records are pages of {trace.page_size} tokens, the model's of "
                         f"{config.page_size}; pass --set page_size={trace.page_size}, or replay a trace recorded "
                         "at the model's page size")
    steps = tokens_needed(0, args.steps, args.reps, args.no_io, args.profile)  # what every run decodes
    if trace.steps < steps:
        raise BenchError(f"{where}: the trace holds {trace.steps} decode steps, a run decodes {steps} (--steps x "
                         "(--reps + 1), twice with --no-io, one call more with --profile); lower --steps or --reps")
    # At run step t a stream holding `context` tokens has (context + t) // page_size sealed records
    # (traces.selections' rule), every stream alike; a batch may replay any trace stream (i mod
    # streams), so it needs the most any of them had sealed at step t: the trace's own context.
    t = np.arange(steps)
    need = trace.sealed[:steps].max(axis=1)
    shortest = int(np.max(need * trace.page_size - t))
    for context in sorted(configs):
        short = (context + t) // trace.page_size < need
        if short.any():
            step = int(np.argmax(short))
            raise BenchError(f"{where}: at context {context} a stream has {(context + step) // trace.page_size} "
                             f"sealed records at step {step}, where the trace selects among {need[step]}; pass "
                             f"--contexts of at least {shortest} tokens (the trace's context)")
    return RecordedSelection(str(path), trace)


def _traces(args, family, config) -> list[traces.TraceConfig]:
    """The trace of every calibration in --trace (none with --selection indexer), its memoryless
    layers checked against the model's selecting layers (before anything compiles)."""
    if args.selection == "indexer":
        return []
    memoryless = args.trace_memoryless_layers
    if memoryless is not None and memoryless > 0:
        layers = family.selecting_layout(config, 1)[0]
        if memoryless > layers:
            raise BenchError(f"--trace-memoryless-layers {memoryless}: the {_family_name(args)} model has {layers} "
                             f"selecting layers; give at most {layers} (or raise --num-layers)")
    repeated = sorted({t for t in args.trace if args.trace.count(t) > 1})
    if repeated:
        raise BenchError(f"argument --trace: {', '.join(repeated)} given more than once")
    fields = dict(memoryless_layers=args.trace_memoryless_layers or 0)
    for name, value in (("beta", args.trace_beta), ("rho_e", args.trace_rho_e)):
        if value is not None:
            fields[name] = value
    if len(fields) > 1 and len(args.trace) > 1:
        raise BenchError("--trace-beta / --trace-rho-e change one calibration; give a single --trace with them")
    try:
        return [traces.TraceConfig.calibration(name, config.page_size, **fields) for name in args.trace]
    except ValueError as err:
        raise BenchError(f"--trace-*: {err}") from None


def _device_budget(args) -> int:
    if args.device_budget_gib is not None:
        return int(args.device_budget_gib * GiB)
    return int(args.device_budget_mib * MiB)


def _check_dtype(args, dtype, platform: str) -> None:
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        return  # not a dtype: the Config's own check names it
    if platform == "cpu" and dtype == jnp.bfloat16:
        raise BenchError(
            f"the {_family_name(args)} {args.preset} config computes in bfloat16, which XLA:CPU cannot run "
            "(it has no bf16 x bf16 -> f32 dot); pass --set dtype=float32, or run on a GPU"
        )


def _implementation(args, config, platform: str) -> str:
    """The RESOLVE implementation the decode will run: "ffi", or "reference" (refused unless
    --allow-reference)."""
    requested = config.implementation
    available = extension_error() is None and _ffi.has_ffi(platform)
    if requested == "ffi" and available or requested == "auto" and available:
        return "ffi"
    if requested == "reference":
        if args.allow_reference:
            return "reference"
        raise BenchError("--set implementation=reference times the pure-JAX reference RESOLVE; "
                         "pass --allow-reference too to confirm")
    if extension_error() is not None:
        cause = f" ({extension_error()})"
        why = (f"hisparse_jax was imported from {Path(__file__).parents[2]} without its compiled "
               f"extension{cause}, so RESOLVE would run as the pure-JAX reference: install the package "
               "(`./dev build`, or `pip install --no-build-isolation .`) and run hisparse-bench from "
               "outside the source tree")
    else:
        why = (f"this hisparse_jax build has no RESOLVE handler for {platform} (built for "
               f"{', '.join(_ffi.ffi_platforms()) or 'no platform'}): rebuild it with "
               "`HISPARSE_CUDA=ON pip install --no-build-isolation .`")
    if requested == "ffi":
        raise BenchError(f"--set implementation=ffi: {why}")
    if args.allow_reference:
        return "reference"
    raise BenchError(f"{why}, or pass --allow-reference to time the reference")


def _round_up(x: float) -> float:
    """x rounded up to 3 significant digits."""
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return math.ceil(x / step * (1 - 1e-12)) * step


def _budget_flag(flag: str, needed: int, unit: int) -> str:
    value = _round_up(needed / unit)
    while int(value * unit) < needed:  # float rounding must not undercut the need
        value = _round_up(value * (1 + 1e-3))
    return f"{flag} {value:g}"


def _check_fits(args, family, contexts: list[ContextPlan], budget: int, host_budget: int) -> None:
    """Every run fits batch 1 under both budgets; else one error naming what does not fit and
    the budgets that would fit batch 1 of every run. Device bytes are the state's and the
    decode's working memory at batch 1 (compiled only for the runs that do not fit): before the
    working memory is known (capacities of the state alone) a run does not fit when its state
    does not; after, when the search found no batch."""
    def short_of_device(cap: Capacity) -> bool:
        return cap.state_device_bytes(1) > budget or (cap.working is not None and cap.max_batch == 0)

    def working_at_one(c: ContextPlan, mode: str) -> int:
        if c.caps[mode].working is not None:
            return c.caps[mode].working.at(1).total
        return program_memory(family, c.config, mode, 1, args.steps, trace=args.selection != "indexer",
                              skip_indexer=args.selection == "trace-no-indexer").total

    host_need = {(c.context, mode): cap.host_fixed + cap.host_per_request
                 for c in contexts for mode, cap in c.caps.items()}
    device_short = {(c.context, mode): (cap.state_device_bytes(1), working_at_one(c, mode))
                    for c in contexts for mode, cap in c.caps.items() if short_of_device(cap)}
    host_short = {key: need for key, need in host_need.items() if need > host_budget}
    if not device_short and not host_short:
        return
    parts = []
    if device_short:
        needs = ", ".join(f"{MODE_NAMES[mode]} @ {context}: {fmt_bytes(state)} + {fmt_bytes(work)}"
                          for (context, mode), (state, work) in device_short.items())
        parts.append(f"the device budget of {fmt_bytes(budget)} (batch 1 needs device state + decode working "
                     f"memory of {needs})")
    if host_short:
        needs = ", ".join(f"{MODE_NAMES[mode]} @ {context}: {fmt_bytes(need)}"
                          for (context, mode), need in host_short.items())
        parts.append(f"the host budget of {fmt_bytes(host_budget)} (batch 1 needs host pool of {needs})")
    fixes = []
    if device_short:  # the runs that fit need no more than the budget, below every short run's need
        need = max(state + work for state, work in device_short.values())
        fixes.append(_budget_flag("--device-budget-gib", need, GiB) if args.device_budget_gib is not None
                     else _budget_flag("--device-budget-mib", need, MiB))
    if host_short:
        fixes.append(_budget_flag("--host-budget-gib", max(host_need.values()), GiB))
    raise BenchError(f"batch 1 does not fit {' nor '.join(parts)}; {' and '.join(fixes)} "
                     f"{'fit' if len(fixes) > 1 else 'fits'} batch 1 of "
                     "every run", status=1)


def _memory_limits(platform: str) -> tuple[int | None, str]:
    """(bytes the device can hold, how that was found), None when unknown."""
    limit, source = device_memory_limit()
    if limit is not None:
        return limit, source
    if platform == "cpu":  # device arrays and pinned host pools share the RAM
        return host_memory_limit()
    return None, source


def device_memory_limit() -> tuple[int | None, str]:
    """(bytes the device reports it can hold, how that was found); None when it does not say
    (XLA:CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), "the device's memory limit"
    return None, "unknown device memory"


def host_memory_limit() -> tuple[int, str]:
    """(bytes a benchmark's host arrays may take, how that was found): half the RAM, the bound
    the decode's schedule takes on a CPU (the rest for the process, the OS and what else runs)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2, "half the RAM"


def _timing_schedule(args, contexts: list[ContextPlan], platform: str) -> tuple[bool, str]:
    """(time the runs of a context in turns?, the note saying how and why)."""
    if args.one_at_a_time:
        return False, "each run alone (--one-at-a-time)"
    if all(len(c.runs) == 1 for c in contexts):
        return False, "one run per context"
    limit, source = _memory_limits(platform)
    if limit is None:
        return False, f"each run alone ({source})"
    for c in contexts:
        device = sum(c.caps[r.mode].device_fixed + c.caps[r.mode].device_per_request * r.batch for r in c.runs)
        host = sum(c.caps[r.mode].host_fixed + c.caps[r.mode].host_per_request * r.batch for r in c.runs)
        if platform == "cpu":
            fits, beyond = device + host <= limit, source
        else:
            fits, beyond = device <= limit and host <= _host_budget(args), f"{source} or the host budget"
        if not fits:
            return False, (f"each run alone: the {len(c.runs)} states of context {c.context} need "
                           f"{fmt_bytes(device)} device + {fmt_bytes(host)} host memory together, beyond {beyond}")
    return True, "the runs of a context in turns, one call each per round"


def _host_budget(args) -> int:
    return int(args.host_budget_gib * GiB)


def resolve_defaults(args):
    """Fills the arguments not given: from the deployment's derivation with --deployment, else
    the small CPU run's. Returns the Derivation (None without --deployment)."""
    derivation = None
    if args.deployment is not None:
        try:
            deployment = get_deployment(args.deployment)
        except ValueError as err:
            raise BenchError(f"argument --deployment: {err}") from None
        # A Family value (--indexer's, or hisparse-bench indexers's) replaces the slice's family.
        replaced = isinstance(args.family, Family)
        for flag, name in (("--family", "family"), ("--preset", "preset")):
            given = getattr(args, name)
            if given is not None and not (replaced and name == "family"):
                raise BenchError(f"{flag} {given}: --deployment {deployment.name} sets the model "
                                 f"({deployment.family}); drop {flag}")
        try:
            derivation = deployment.derive(args.num_layers)
        except ValueError as err:
            raise BenchError(f"--num-layers: {err}") from None
        args.family, args.preset = args.family if replaced else deployment.family, "realistic"
        if args.device_budget_gib is None and args.device_budget_mib is None:
            args.device_budget_gib = derivation.device_budget / GiB
        for name, value in DEPLOYMENT_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    for name, value in CPU_DEFAULTS.items():
        if name == "device_budget_mib" and args.device_budget_gib is not None:
            continue
        if getattr(args, name) is None:
            setattr(args, name, value)
    return derivation


def _with_working_memory(args, family, config, state_only: Capacity, budget: int, host_budget: int) -> Capacity:
    """The capacity of `state_only`'s mode counting its timed decode's working memory too
    (`args.steps` steps a call, with trace ids when it selects by a trace), fitted at batches
    bracketing the state-only answer, which bounds the search's."""
    working = working_memory(family, config, state_only.mode, args.steps, trace=args.selection != "indexer",
                             skip_indexer=args.selection == "trace-no-indexer",
                             batches=fit_batches(state_only.max_batch))
    return capacity(family, config, state_only.mode, device_budget=budget, host_budget=host_budget,
                    max_batch_cap=args.max_batch, working=working)


def _indexer_family(args) -> None:
    """--indexer MODULE:NAME: the kit's MLA model with that protocol indexer becomes the family
    (in place of --family's, or of a deployment slice's: the slice keeps its MLA shapes)."""
    spec = getattr(args, "indexer", None)
    if spec is None:
        return
    if isinstance(args.family, str):
        raise BenchError(f"--family {args.family}: --indexer {spec} gives the model (the kit's MLA model with that "
                         "indexer); drop --family")
    from ... import kit
    from ...train.indexer_spec import load_indexer

    try:
        args.family = kit.family(load_indexer(spec))
    except (TypeError, ValueError) as err:
        raise BenchError(f"argument --indexer: {err}") from None


def _family_name(args) -> str:
    return getattr(args.family, "name", args.family)


def build_plan(args) -> Plan:
    """Checks everything that can be checked before any compilation, then sizes every run."""
    trace_flags = _check_selection_flags(args)
    _indexer_family(args)
    derivation = resolve_defaults(args)
    _check_trace_flags(args, trace_flags)
    family = get_family(args.family)
    if args.preset not in family.Config.PRESETS:
        raise BenchError(f"argument --preset: unknown preset {args.preset!r} for {_family_name(args)}; presets: "
                         f"{', '.join(family.Config.PRESETS)}")
    repeated = sorted({c for c in args.contexts if args.contexts.count(c) > 1})
    if repeated:
        raise BenchError(f"argument --contexts: {', '.join(map(str, repeated))} given more than once")
    repeated = sorted({m for m in args.modes if args.modes.count(m) > 1})
    if repeated:
        raise BenchError(f"argument --modes: {', '.join(repeated)} given more than once")
    if args.no_io and "hisparse" not in args.modes:
        raise BenchError("--no-io times HiSparse without the record copy; add hisparse to --modes")
    if args.prefetch and "hisparse" not in args.modes:
        raise BenchError("--prefetch times HiSparse with its copies on a stream of their own; add hisparse to --modes")
    _check_overlap_groups(family, args)
    overrides = _parse_sets(family, args)
    if derivation is not None:
        # A replacing family keeps the slice's fields it has (the kit's MLA model: all but DSA's
        # lightning indexer's; its own indexer's knobs are the indexer's).
        fields = {f.name for f in dataclasses.fields(family.Config)}
        overrides = {**{k: v for k, v in derivation.overrides.items() if k in fields}, **overrides}
    budget, host_budget = _device_budget(args), _host_budget(args)
    _allow_pinned_host(host_budget)  # before the backend starts
    platform = _ffi.platform_of(jax.default_backend())
    # --explain on a CPU prints a GPU slice's derivation without compiling it (a bfloat16 config
    # cannot run here, and its working memory is the GPU program's): batches from the state alone.
    state_only = args.explain and platform == "cpu"
    if not state_only:
        _check_dtype(args, _field_value(family, args.preset, overrides, "dtype"), platform)
    configs = {context: _config(family, args, context, overrides) for context in args.contexts}
    trace_list = ([_recorded(args, configs)] if args.selection == "recorded"
                  else _traces(args, family, configs[args.contexts[0]]))
    implementation = _implementation(args, configs[args.contexts[0]], platform)
    if implementation == "reference" and "implementation" in {f.name for f in dataclasses.fields(family.Config)}:
        # Pin "auto" to the reference it stands for here, so the report names what runs. ("auto"
        # standing for "ffi" stays: it still lets a kernel without a handler here fall back.)
        configs = {c: dataclasses.replace(cfg, implementation="reference") for c, cfg in configs.items()}
    # The state bytes first (no compilation), then the decode's working memory (compiles).
    contexts = [ContextPlan(context, config, {m: capacity(family, _whole_batch(config), m, device_budget=budget,
                                                           host_budget=host_budget, max_batch_cap=args.max_batch)
                                              for m in args.modes}, [])
                for context, config in configs.items()]
    _check_fits(args, family, contexts, budget, host_budget)
    for c in contexts:
        if not state_only:
            c.caps = {m: _with_working_memory(args, family, _whole_batch(c.config), cap, budget, host_budget)
                      for m, cap in c.caps.items()}
        # HiSparse's runs split into groups (--overlap-groups, or --set overlap_groups=G with
        # --set prefetch=true): a multiple of G streams each.
        groups = max(args.overlap_groups, getattr(c.config, "overlap_groups", 1))
        batch = {m: cap.max_batch - (cap.max_batch % groups if m == "hisparse" else 0) for m, cap in c.caps.items()}
        if batch.get("hisparse", 1) == 0 and c.caps["hisparse"].max_batch > 0:
            raise BenchError(f"--overlap-groups {groups}: HiSparse's capacity batch at context {c.context} is "
                             f"{c.caps['hisparse'].max_batch} streams, fewer than the groups; use --overlap-groups "
                             f"{c.caps['hisparse'].max_batch} or fewer")
        for trace in trace_list or [None]:  # each calibration (or the recorded trace) is a comparison of its own
            c.runs += [RunPlan("capacity", m, batch[m], trace) for m in args.modes]
            if not args.no_equal_batch and {"device", "hisparse"} <= c.caps.keys():
                _check_equal_batch_groups(c)
                c.runs.append(RunPlan("equal batch", "hisparse", c.caps["device"].max_batch, trace))
            if args.prefetch:  # the same batch and state as the capacity run, copies off the compute stream
                c.runs.append(RunPlan("prefetch", "hisparse", batch["hisparse"], trace))
    _check_fits(args, family, contexts, budget, host_budget)
    in_turns, note = _timing_schedule(args, contexts, platform)
    return Plan(family, overrides, contexts, trace_list, budget, host_budget, implementation, in_turns, note,
                derivation, state_only)


def _whole_batch(config):
    """`config` without overlap groups, for the capacity search: it tries any batch, and the
    groups change the order of a step's work, not its bytes (the runs then take a multiple of
    G streams)."""
    return dataclasses.replace(config, overlap_groups=1) if getattr(config, "overlap_groups", 1) > 1 else config


def _check_equal_batch_groups(c: ContextPlan) -> None:
    """The equal-batch run takes full-KV's batch: with overlap groups in every HiSparse run
    (--set overlap_groups=G) that batch must split into G groups."""
    groups, batch = getattr(c.config, "overlap_groups", 1), c.caps["device"].max_batch
    if batch % groups:
        raise BenchError(f"--set overlap_groups={groups}: the equal-batch run takes full-KV's batch {batch} at context "
                         f"{c.context}, not a multiple of {groups}; add --no-equal-batch, or use --overlap-groups "
                         f"{groups} --prefetch (the prefetch run only)")


def _check_overlap_groups(family, args) -> None:
    """--overlap-groups G: a positive int, for the prefetch run of a family that has the knob."""
    groups = args.overlap_groups
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise BenchError(f"argument --overlap-groups: must be an int >= 1 (1: the whole batch), got {groups!r}")
    if groups == 1:
        return
    if not args.prefetch:
        raise BenchError(f"--overlap-groups {groups} splits the prefetch run's batch so that one group's copy overlaps "
                         "another's work; add --prefetch")
    if "overlap_groups" not in {f.name for f in dataclasses.fields(family.Config)}:
        raise BenchError(f"--overlap-groups: the {family.name} family has no overlap groups (the kit's models, e.g. "
                         "dsa, have); drop --overlap-groups")


def _allow_pinned_host(host_budget: int) -> None:
    """XLA's GPU client caps pinned host memory at 64 GiB unless XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB
    says otherwise; unless the user set it, lift the cap. Its allocator grows in regions that double
    (a 33.8 GiB pool takes a 64 GiB region), and the cap bounds the regions, not the pools: a cap of
    the budget plus headroom left a third pool out at 72 GiB of 88 (BENCHMARKS.md, dsv32-h200).
    Twice the budget covers the rounding; the allocator falls back to smaller regions when the
    machine cannot pin a larger one. Must run before the backend starts (the first device use)."""
    if "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB" not in os.environ:
        os.environ["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] = str(2 * math.ceil(host_budget / 2**30) + 8)

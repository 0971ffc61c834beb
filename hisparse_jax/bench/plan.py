"""Everything `hisparse-bench decode` checks and sizes before it compiles anything.

`build_plan(args)` turns parsed arguments into a Plan: the Config of every context (preset,
overrides and room for every decoded token), each mode's capacity under the budgets, the runs
and how they are timed. Whatever would fail later fails here, as a BenchError holding one line:
a Config the model rejects (its ValueError names `Config.field`; the flags that set the field
are added), a bfloat16 config on XLA:CPU (which cannot run its dots), the pure-JAX reference
RESOLVE unless allowed, a run whose batch 1 does not fit the budgets (with the bytes it needs
and the budget that fits).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp

from .. import _ffi, traces
from ..models import get_family
from .capacity import Capacity, capacity
from .report import MODE_NAMES, fmt_bytes
from .runner import tokens_needed

MiB, GiB = 2**20, 2**30


class BenchError(Exception):
    """A refusal: printed as one line `hisparse-bench: error: ...`, exit status `status`
    (2: a bad argument; 1: the arguments are valid but nothing can be measured)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(" ".join(message.split()))  # one line, whatever the source wrote
        self.status = status


@dataclasses.dataclass
class ContextPlan:
    """What runs at one context: the config, each mode's capacity, and the runs (kind, mode,
    batch) in the order they are started."""

    context: int
    config: object
    caps: dict[str, Capacity]
    runs: list[tuple[str, str, int]]


@dataclasses.dataclass
class Plan:
    """The checked arguments' runs, context by context, and how they are timed."""

    family: object
    overrides: dict
    contexts: list[ContextPlan]
    trace: traces.TraceConfig | None
    device_budget: int
    host_budget: int
    implementation: str
    in_turns: bool
    timing_note: str


def _flag_fields(family) -> dict[str, str]:
    """Config field -> the flag that sets it."""
    return {"top_k": "--top-k", "hot_slots": "--hot-slots", "num_layers": "--num-layers",
            "max_context": "--contexts"}


def _parse_sets(family, args) -> dict:
    """--set FIELD=VALUE pairs -> Config overrides, each cast to the type of the field's value
    in the chosen preset (bool from true/false, "None" for optional fields)."""
    fields = {f.name for f in dataclasses.fields(family.Config)}
    flags = _flag_fields(family)
    preset = family.Config.preset(args.preset)
    out = {}
    for pair in args.set:
        name, sep, text = pair.partition("=")
        if not sep or name not in fields:
            raise BenchError(f"--set {pair!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
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
            elif current is None:  # optional int fields (e.g. pool_records)
                out[name] = int(text)
            else:
                out[name] = text
        except ValueError:
            raise BenchError(f"--set {pair!r}: {name} takes a {type(current).__name__} "
                             f"(the preset has {current!r})") from None
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
        return family.Config.preset(args.preset, **overrides)
    except ValueError as err:
        raise _config_error(family, err) from None


def _trace(args, config) -> traces.TraceConfig | None:
    if args.selection == "indexer":
        return None
    fields = dict(memoryless_layers=args.trace_memoryless_layers)
    for name, value in (("beta", args.trace_beta), ("rho_e", args.trace_rho_e)):
        if value is not None:
            fields[name] = value
    try:
        return traces.TraceConfig.calibration(args.trace, config.page_size, **fields)
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
            f"the {args.family} {args.preset} config computes in bfloat16, which XLA:CPU cannot run "
            "(it has no bf16 x bf16 -> f32 dot); pass --set dtype=float32, or run on a GPU"
        )


def _implementation(args, config, platform: str) -> str:
    """The RESOLVE implementation the decode will run: "ffi", or "reference" (refused unless
    --allow-reference)."""
    requested = config.implementation
    available = _ffi._ext is not None and _ffi.has_ffi(platform)
    if requested == "ffi" and available or requested == "auto" and available:
        return "ffi"
    if requested == "reference":
        if args.allow_reference:
            return "reference"
        raise BenchError("--set implementation=reference times the pure-JAX reference RESOLVE; "
                         "pass --allow-reference too to confirm")
    if _ffi._ext is None:
        cause = f" ({_ffi._IMPORT_ERROR})" if _ffi._IMPORT_ERROR is not None else ""
        why = (f"hisparse_jax was imported from {Path(_ffi.__file__).parent} without its compiled "
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


def _check_fits(args, contexts: list[ContextPlan], budget: int, host_budget: int) -> None:
    """Every run fits batch 1 under both budgets; else one error naming what does not fit and
    the budgets that would fit batch 1 of every run."""
    batch1 = {(c.context, mode): (cap.device_fixed + cap.device_per_request, cap.host_fixed + cap.host_per_request)
              for c in contexts for mode, cap in c.caps.items()}
    short = {memory: [(key, need[i]) for key, need in batch1.items() if need[i] > limit]
             for i, (memory, limit) in enumerate((("device", budget), ("host", host_budget)))}
    if not short["device"] and not short["host"]:
        return
    parts = []
    for memory, failing in short.items():
        if failing:
            limit = budget if memory == "device" else host_budget
            needs = ", ".join(f"{MODE_NAMES[mode]} @ {context}: {fmt_bytes(need)}" for (context, mode), need in failing)
            what = "device state" if memory == "device" else "host pool"
            parts.append(f"the {memory} budget of {fmt_bytes(limit)} (batch 1 needs {what} of {needs})")
    fixes = []
    if short["device"]:
        need = max(d for d, _ in batch1.values())
        fixes.append(_budget_flag("--device-budget-gib", need, GiB) if args.device_budget_gib is not None
                     else _budget_flag("--device-budget-mib", need, MiB))
    if short["host"]:
        fixes.append(_budget_flag("--host-budget-gib", max(h for _, h in batch1.values()), GiB))
    raise BenchError(f"batch 1 does not fit {' nor '.join(parts)}; {' and '.join(fixes)} "
                     f"{'fit' if len(fixes) > 1 else 'fits'} batch 1 of "
                     "every run", status=1)


def _memory_limits(platform: str) -> tuple[int | None, str]:
    """(bytes the device can hold, how that was found), None when unknown."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), "the device's memory limit"
    if platform == "cpu":  # device arrays and pinned host pools share the RAM
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2, "half the RAM"
    return None, "unknown device memory"


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
        device = sum(c.caps[m].device_fixed + c.caps[m].device_per_request * b for _, m, b in c.runs)
        host = sum(c.caps[m].host_fixed + c.caps[m].host_per_request * b for _, m, b in c.runs)
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


def build_plan(args) -> Plan:
    """Checks everything that can be checked before any compilation, and sizes every run."""
    family = get_family(args.family)
    if args.preset not in family.Config.PRESETS:
        raise BenchError(f"argument --preset: unknown preset {args.preset!r} for {args.family}; presets: "
                         f"{', '.join(family.Config.PRESETS)}")
    repeated = sorted({c for c in args.contexts if args.contexts.count(c) > 1})
    if repeated:
        raise BenchError(f"argument --contexts: {', '.join(map(str, repeated))} given more than once")
    repeated = sorted({m for m in args.modes if args.modes.count(m) > 1})
    if repeated:
        raise BenchError(f"argument --modes: {', '.join(repeated)} given more than once")
    if args.no_io and "hisparse" not in args.modes:
        raise BenchError("--no-io times HiSparse without the record copy; add hisparse to --modes")
    overrides = _parse_sets(family, args)
    budget, host_budget = _device_budget(args), _host_budget(args)
    _allow_pinned_host(host_budget)  # before the backend starts
    platform = _ffi.platform_of(jax.default_backend())
    _check_dtype(args, _field_value(family, args.preset, overrides, "dtype"), platform)
    configs = {context: _config(family, args, context, overrides) for context in args.contexts}
    trace = _trace(args, configs[args.contexts[0]])
    implementation = _implementation(args, configs[args.contexts[0]], platform)
    if implementation == "reference" and "implementation" in {f.name for f in dataclasses.fields(family.Config)}:
        # Pin "auto" to the reference it stands for here, so the report names what runs. ("auto"
        # standing for "ffi" stays: it still lets a kernel without a handler here fall back.)
        configs = {c: dataclasses.replace(cfg, implementation="reference") for c, cfg in configs.items()}
    contexts = []
    for context, config in configs.items():
        caps = {m: capacity(family, config, m, device_budget=budget, host_budget=host_budget,
                            max_batch_cap=args.max_batch) for m in args.modes}
        runs = [("capacity", m, caps[m].max_batch) for m in args.modes]
        if not args.no_equal_batch and {"device", "hisparse"} <= caps.keys():
            runs.append(("equal batch", "hisparse", caps["device"].max_batch))
        contexts.append(ContextPlan(context, config, caps, runs))
    _check_fits(args, contexts, budget, host_budget)
    in_turns, note = _timing_schedule(args, contexts, platform)
    return Plan(family, overrides, contexts, trace, budget, host_budget, implementation, in_turns, note)


def _allow_pinned_host(host_budget: int) -> None:
    """XLA's GPU client caps pinned host memory at 64 GiB unless XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB
    says otherwise; unless the user set it, lift the cap to the host budget plus headroom. Must run
    before the backend starts (the first device use)."""
    if "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB" not in os.environ:
        os.environ["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] = str(math.ceil(host_budget / 2**30) + 8)

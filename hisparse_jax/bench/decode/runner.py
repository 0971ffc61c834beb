"""Times the jitted decode of one family at one batch and context, in one mode.

The state holds `context` tokens per stream, from the family's own dense
prefill of random prompts ("prefill") or from a synthetic fill
("synthetic", hisparse_jax.bench.decode.synthetic: no O(T^2) prefill, for long
contexts). A TraceConfig makes the selection follow the calibrated synthetic
trace (hisparse_jax.selection.synthetic, docs/traces.md) instead of the indexer on random
weights: the ids of every step a run will decode are generated once, before
anything is timed (`traces.selections`), kept in host memory, and each call gets
its next `steps` of them on device before its clock starts. The model still runs
its indexer and top-k; only their ids are replaced. A RecordedSelection (a
recorded trace, hisparse_jax.selection.recorded) takes the same path: its ids, mapped onto
the model's selecting layers and streams, replace the generated ones.

The decode is `hisparse_jax.decode.generate` (one jitted lax.scan over
`steps`, state donated). `start_run` builds the state and makes the first
generate call, which compiles and warms the hot caches; it is not timed.
`time_in_turns` then times `reps` further calls of each run, one call of
every run per round: on a shared or throttling machine a change in load then
hits every run of a comparison alike instead of whichever ran at that moment.
Each timed call gives one sample, its wall time divided by `steps`; a
DecodeTiming keeps all of them (min / median / max).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from ... import decode
from ...selection import recorded, synthetic as traces
from .. import profile
from .synthetic import synthetic_state, without_fetch

FILLS = ("prefill", "synthetic")

@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    """One measured decode run.

    Attributes:
      step_seconds_all: per timed call, its wall time / steps (seconds per decode step over
        all streams), in call order.
      misses_per_step: mean records fetched from the host pool per step (all layers and
        streams) over the timed calls; 0 outside "hisparse".
      selected_per_step: records selected per step (all layers and streams).
      fetch: False for a no-IO run (RESOLVE without the record copy).
      tokens: [steps, batch] int32 tokens of the last timed call (for equality checks).
      index_misses_per_step: as misses_per_step, for a kit indexer's own records
        (kit.RecordKind: its second RESOLVE per selecting group); 0 without them.
    """

    mode: str
    batch: int
    context: int
    steps: int
    step_seconds_all: tuple[float, ...]
    misses_per_step: float
    selected_per_step: float
    fetch: bool
    tokens: np.ndarray
    index_misses_per_step: float = 0.0

    @property
    def step_seconds(self) -> float:
        """Median seconds per step (TPOT)."""
        return float(np.median(self.step_seconds_all))

    @property
    def step_seconds_min(self) -> float:
        return min(self.step_seconds_all)

    @property
    def step_seconds_max(self) -> float:
        return max(self.step_seconds_all)

    @property
    def tokens_per_second(self) -> float:
        """batch / median step seconds."""
        return self.batch / self.step_seconds


@dataclasses.dataclass
class DecodeRun:
    """One state being decoded: its model, its state (donated and replaced at every call),
    the tokens of its last call ([steps, batch] int32; the next call starts from the last row;
    [batch] first tokens before any call), how it selects (a trace's ids for every step it will
    decode, [total steps, layers, *streams, k] in host memory, and the next step's index;
    skip_indexer) and the samples of its timed calls so far."""

    family: ModuleType
    config: object
    weights: object
    context: int
    steps: int
    state: object
    last_tokens: jax.Array
    trace_ids: np.ndarray | None = None
    trace_step: int = 0
    skip_indexer: bool = False
    misses_shape: tuple[int, ...] = ()
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    fetched_per_step: list[float] = dataclasses.field(default_factory=list)
    index_fetched_per_step: list[float] = dataclasses.field(default_factory=list)


def initial_state(family: ModuleType, config, weights, mode: str, batch: int, context: int, *,
                  fill: str = "prefill", seed: int = 0):
    """(state holding `context` tokens per stream, first tokens [batch] int32) to decode from."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {FILLS}, got {fill!r}")
    rng = np.random.default_rng(seed)
    if fill == "prefill":
        prompts = jnp.asarray(rng.integers(0, config.vocab, (batch, context)), jnp.int32)
        state = family.init_state(config, batch, mode)
        state, logits = decode.prefill(family, config, weights, state, prompts,
                                       jnp.full((batch,), context, jnp.int32))
        first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        state = synthetic_state(family, config, batch, mode, context, seed=seed)
        first = jnp.asarray(rng.integers(0, config.vocab, (batch,)), jnp.int32)
    return state, first


def tokens_needed(context: int, steps: int, reps: int, no_io: bool = False, profile: bool = False) -> int:
    """Tokens a stream holds once all its calls ran: the context, then every decode call
    (warm-up and timed; twice with no_io; one more profiled call). Config.max_context must
    exceed it."""
    return context + steps * ((reps + 1) * (2 if no_io else 1) + (1 if profile else 0))


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (it holds arrays)
class RecordedSelection:
    """A recorded trace replayed as a run's selection, named by the file it was read from.

    Mapped onto a model whose selecting layout is (G layers, streams [b, *rest]): selecting layer
    g replays trace layer g * layers // G (proportionally: a shallower trace repeats its layers, a
    deeper one skips some), stream i of the batch trace stream i mod streams, the same ids for
    every trailing stream index (Quest's and NSA's KV heads all select what the trace's stream
    selected), and step t of the run the trace's step t. The ids are used as recorded: the
    benchmark's context may be longer than the trace's (hisparse_jax.bench.decode.plan checks that every
    id is sealed when it is selected); the locality is the trace's, at its own context.
    """

    path: str
    trace: recorded.RecordedTrace

    @property
    def name(self) -> str:
        """A short label for tables and plot legends (the file's stem); `describe` and the JSON
        give the path once."""
        return f"recorded {Path(self.path).stem}"

    def as_dict(self) -> dict:
        """The trace's file, source and shape, for a report."""
        t = self.trace
        return dict(path=self.path, source=t.source, steps=t.steps, layers=t.layers, streams=t.streams, k=t.k,
                    page_size=t.page_size)

    def describe(self) -> str:
        """One line naming the trace, its source and how it is mapped, for benchmark output."""
        t = self.trace
        # The source's headline fields only (the whole source, training history included, is in the JSON).
        brief = {k: t.source[k] for k in ("kind", "model", "model_sha256", "prefill", "steps") if k in t.source}
        if "documents" in t.source:
            brief["documents"] = len(t.source["documents"])
        return (f"{self.name} = recorded trace {self.path} (source {json.dumps(brief, sort_keys=True)}): {t.steps} steps, {t.layers} "
                f"selecting layers, {t.streams} streams, k={t.k}, page_size={t.page_size}, "
                f"{t.sealed[0].min()}-{t.sealed[0].max()} sealed at its first step; replayed as recorded, "
                f"layers mapped proportionally, stream i of a batch on trace stream i mod {t.streams}, shared "
                "by the stream's KV heads: the trace's locality at its own context")


def recorded_ids(family: ModuleType, config, selection: RecordedSelection, batch: int, steps: int) -> np.ndarray:
    """A recorded trace's ids for the first `steps` steps of a run at `batch`, mapped onto the
    model (RecordedSelection): [steps, layers, *streams, k] int32 in host memory."""
    t = selection.trace
    layers, streams, _ = family.selecting_layout(config, batch)
    if steps > t.steps or t.k != config.top_k:
        raise ValueError(f"{selection.name} holds {t.steps} steps of k={t.k}; the run needs {steps} of "
                         f"k={config.top_k}")
    ids = t.ids[:steps, np.arange(layers) * t.layers // layers][:, :, np.arange(batch) % t.streams]
    ids = ids.reshape(steps, layers, batch, *([1] * (len(streams) - 1)), t.k)
    return np.ascontiguousarray(np.broadcast_to(ids, (steps, layers, *streams, t.k)))


def trace_ids(family: ModuleType, config, trace: traces.TraceConfig | RecordedSelection, lengths: jax.Array,
              steps: int, seed: int = 0) -> np.ndarray:
    """A trace's ids for `steps` decode steps from streams holding `lengths` tokens, in host
    memory: [steps, layers, *streams, k] int32 (family.selecting_layout): generated for a
    TraceConfig, mapped from the file for a RecordedSelection."""
    if isinstance(trace, RecordedSelection):
        return recorded_ids(family, config, trace, int(lengths.shape[0]), steps)
    layers, streams, records = family.selecting_layout(config, int(lengths.shape[0]))
    ids = traces.selections(trace, layers, streams, records, config.top_k, lengths, steps,
                            page_size=config.page_size, seed=seed)
    return np.asarray(jax.device_get(ids))


def _selection_arguments(run: DecodeRun) -> dict:
    """generate's selection arguments for `run`'s next call: none for the model's own indexer;
    else the trace's ids of its next `steps` steps, on device before the call (and its clock)."""
    if run.trace_ids is None:
        return {}
    if run.trace_step + run.steps > len(run.trace_ids):
        raise ValueError(f"the run decoded past the {len(run.trace_ids)} steps its trace was generated for")
    ids = jnp.asarray(run.trace_ids[run.trace_step : run.trace_step + run.steps])
    run.trace_step += run.steps
    return dict(forced=decode.ForcedTrace(jax.block_until_ready(ids), skip_indexer=run.skip_indexer))


def warm_up(run: DecodeRun, first_tokens) -> DecodeRun:
    """The untimed first call: compiles this state's decode and fills its hot caches."""
    out = decode.generate(run.family, run.config, run.weights, run.state, first_tokens, run.steps,
                          **_selection_arguments(run))
    run.state, run.last_tokens = out.state, jax.block_until_ready(out.tokens)
    run.misses_shape = tuple(out.misses.shape)
    return run


def start_run(family: ModuleType, config, weights, mode: str, batch: int, context: int, steps: int, *,
              fill: str = "prefill", trace: traces.TraceConfig | RecordedSelection | None = None,
              trace_steps: int = 0, skip_indexer: bool = False, seed: int = 0) -> DecodeRun:
    """A warmed-up run of `mode` at `batch` from a state holding `context` tokens per stream.

    With a trace, its ids for `trace_steps` steps (every step the run will decode, warm-up
    included) are generated (or mapped from a recorded trace) first; skip_indexer=True does not
    compute the model's indexer at all.
    """
    state, first = initial_state(family, config, weights, mode, batch, context, fill=fill, seed=seed)
    ids = None if trace is None else trace_ids(family, config, trace, state.lengths, trace_steps, seed)
    run = DecodeRun(family, config, weights, context, steps, state, first, ids, 0, skip_indexer)
    return warm_up(run, first)


def without_io(run: DecodeRun) -> DecodeRun:
    """A warmed-up run that continues `run`'s state (and trace) with RESOLVE's record copy
    switched off (the pure resolve cost). `run` must not be called again: its state is donated."""
    quiet = DecodeRun(run.family, run.config, run.weights, run.context, run.steps, without_fetch(run.state),
                      run.last_tokens, run.trace_ids, run.trace_step, run.skip_indexer)
    run.state = None
    return warm_up(quiet, jnp.asarray(run.last_tokens[-1]))


def profile_run(run: DecodeRun, bandwidths: dict[str, float], trace_dir: str | None = None) -> dict:
    """One profiled call of `run` (hisparse_jax.bench.profile; the trace kept in `trace_dir`):
    its report row."""
    first = jax.block_until_ready(run.last_tokens[-1])
    selection = _selection_arguments(run)
    batch = int(run.state.lengths.shape[0])
    profiled, run.last_tokens, run.state = profile.profile_decode(
        run.family, run.config, run.weights, run.state, first, run.steps, context=run.context,
        bandwidths=bandwidths, trace_dir=trace_dir, **selection)
    return dict(mode=run.state.store.mode, context=run.context, batch=batch, **profiled.as_dict())


def timed_call(run: DecodeRun) -> None:
    """One timed generate call of `run`; appends its seconds per step and misses per step."""
    # The first tokens are sliced out and ready before the clock starts (slicing compiles
    # once per shape, which must not be timed).
    first = jax.block_until_ready(run.last_tokens[-1])
    selection = _selection_arguments(run)
    t0 = time.perf_counter()
    generated = decode.generate(run.family, run.config, run.weights, run.state, first, run.steps, **selection)
    jax.block_until_ready(generated.tokens)
    run.step_seconds.append((time.perf_counter() - t0) / run.steps)
    run.state, run.last_tokens = generated.state, generated.tokens
    run.fetched_per_step.append(float(np.asarray(generated.misses).sum()) / run.steps)
    if generated.index_misses is not None:
        run.index_fetched_per_step.append(float(np.asarray(generated.index_misses).sum()) / run.steps)


def time_in_turns(runs: list[DecodeRun], reps: int, on_round=None) -> list[DecodeTiming]:
    """`reps` rounds of one timed call per run; the order rotates by one run per round so
    that no run always follows the same one. on_round(i) is called after round i. Python's
    garbage collector is paused meanwhile (as timeit does), so that it runs in no timed call."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(reps):
            for j in range(len(runs)):
                timed_call(runs[(i + j) % len(runs)])
            if on_round is not None:
                on_round(i)
    finally:
        if was_enabled:
            gc.enable()
    return [timing_of(run) for run in runs]


def timing_of(run: DecodeRun) -> DecodeTiming:
    """The DecodeTiming of `run`'s timed calls so far (at least one)."""
    if not run.step_seconds:
        raise ValueError("timing_of: the run has no timed call yet")
    mode = run.state.store.mode
    layers_and_streams = int(np.prod(run.misses_shape[1:]))  # misses: [steps, layers, *streams]
    return DecodeTiming(
        mode=mode,
        batch=int(run.state.lengths.shape[0]),
        context=run.context,
        steps=run.steps,
        step_seconds_all=tuple(run.step_seconds),
        misses_per_step=float(np.mean(run.fetched_per_step)) if mode == "hisparse" else 0.0,
        selected_per_step=float(layers_and_streams * run.config.top_k),
        fetch=run.state.store.fetch,
        tokens=np.asarray(run.last_tokens),
        index_misses_per_step=(float(np.mean(run.index_fetched_per_step))
                               if mode == "hisparse" and run.index_fetched_per_step else 0.0),
    )

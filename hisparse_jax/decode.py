"""The generic decode loop: any model family (hisparse_jax.models) under one jit.

`generate` runs `family.decode_step` in a `lax.scan` over steps, inside one
jax.jit with the state donated: the hot buffers and device metadata are
updated in place, and the host pool is written in place by the pool-write FFI
call, so it stays in pinned_host memory across calls. Calls with equal shapes,
config and static options reuse the compiled program.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from .models import Family, get_family
from .models.family import in_decode_layout
from .models.paging import ForcedSelection, StepOutput

@dataclasses.dataclass(frozen=True)
class ForcedTrace:
    """Selections a decode attends to instead of the model's own top-k (a selection trace).

    Attributes:
      ids: [steps, layers, *S, k] int32, ascending per stream with -1 padding
        (hisparse_jax.selection.synthetic.selections, or a recorded trace's ids mapped onto the
        run; shapes from family.selecting_layout). The model still computes its indexer and top-k
        and a runtime select replaces their ids, so a step costs what a real step costs.
      skip_indexer: do not compute the indexer at all (a diagnostic that shows its cost by
        difference).
    """

    ids: jax.Array | None
    skip_indexer: bool = False


@dataclasses.dataclass(frozen=True)
class Generated:
    """What `generate` returns.

    Attributes:
      tokens: [steps, b] int32; tokens[i] is produced by step i and fed to step i + 1 (unless
        teacher_tokens).
      logits: [steps, b, V] float32 with return_logits, else None.
      misses: [steps, *family shape] int32 records RESOLVE fetched (zeros outside "hisparse").
      state: the new state (its host pool still pinned_host); the one passed in was donated.
      selections: with record_selection, [steps, layers, *S, k] int32 ids every selecting layer
        attended to (ascending per stream, -1 padding); else None.
      index_misses: [steps, groups, *S] int32 records of a kit indexer's own record kind
        RESOLVE fetched (kit.RecordKind; zeros outside "hisparse"); None for other models.
      index_selections: with record_selection and a kit.RecordKind, [steps, groups, *S, fetch]
        int32 ids of the indexer's own records each group fetched (ascending, -1 padding).
    """

    tokens: jax.Array
    logits: jax.Array | None
    misses: jax.Array
    state: object
    selections: jax.Array | None = None
    index_misses: jax.Array | None = None
    index_selections: jax.Array | None = None


_STATIC = ("family", "config", "steps", "sampling", "return_logits", "skip_indexer", "record_selection")

SAMPLING = ("greedy", "sample")


def next_tokens(logits: jax.Array, sampling: str, key: jax.Array) -> jax.Array:
    """logits [b, V] float32 -> [b] int32: argmax (lowest id on ties) or a seeded draw."""
    if sampling == "greedy":
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if sampling == "sample":
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")


def _generate_program(family, config, steps, sampling, return_logits, skip_indexer, weights, state, first_tokens,
                      key, selections, forced_on, teacher_tokens=None, record_selection=False):
    def step(carry, xs):
        state, tokens = carry
        i, ids, teacher = xs
        forced = None if ids is None else ForcedSelection(ids, forced_on, skip_indexer)
        with jax.named_scope("decode_step"):
            out = family.decode_step(config, weights, state, tokens, forced, record_selection)
        with jax.named_scope("sample"):
            nxt = next_tokens(out.logits, sampling, jax.random.fold_in(key, i))
        fed = nxt if teacher is None else teacher
        return (out.state, fed), (nxt, out.logits if return_logits else None, out.misses, out.selected,
                                  out.index_misses, out.index_selected)

    carry = (state, first_tokens)
    xs = (jnp.arange(steps, dtype=jnp.int32), selections, teacher_tokens)
    (state, _), (tokens, logits, misses, recorded, index_misses, index_recorded) = jax.lax.scan(step, carry, xs)
    if index_recorded is not None:
        return tokens, logits, misses, state, recorded, index_misses, index_recorded
    if index_misses is not None:  # a kit indexer's own records (kit.RecordKind)
        return tokens, logits, misses, state, recorded, index_misses
    if record_selection:
        return tokens, logits, misses, state, recorded
    return tokens, logits, misses, state


# The jitted decode program behind `generate` and `trace_generate` (public so that program tests
# and benchmarks can trace it and read its compilation cache; call `generate` to run it).
generate_program = jax.jit(_generate_program, static_argnames=_STATIC, donate_argnames=("state",))


def _prefill_program(family, config, weights, state, prompts, lengths):
    return family.prefill(config, weights, state, prompts, lengths)


_prefill_jit = jax.jit(_prefill_program, static_argnames=("family", "config"), donate_argnames=("state",))


def _is_concrete(x) -> bool:
    """A value eager checks may read back: not traced, and (multi-host) all on this process."""
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_fully_addressable


def _check_family_config(family: Family, config) -> None:
    if not isinstance(config, family.Config):
        raise TypeError(
            f"config is a {type(config).__module__}.{type(config).__name__}, expected "
            f"{family.name}'s Config ({family.Config.__module__}.{family.Config.__name__})"
        )


def _check_batch(name: str, x, batch: int) -> None:
    if jnp.ndim(x) != 1 or jnp.shape(x)[0] != batch:
        raise ValueError(f"{name} must have shape [batch] = [{batch}], got {jnp.shape(x)}")


def _like_lengths(state, tokens) -> jax.Array:
    """tokens as int32 on state.lengths' sharding: committed like the arrays the
    program returns, so feeding its own outputs back never changes the cache key."""
    return jax.device_put(jnp.asarray(tokens, jnp.int32), state.lengths.sharding)


def _check_context(config, lengths, steps: int) -> None:
    """Eager only: the streams must have room for `steps` more tokens."""
    if not _is_concrete(lengths):
        return
    longest = int(np.max(jax.device_get(lengths)))
    if longest + steps > config.max_context:
        raise ValueError(
            f"generate: a stream holds {longest} tokens; {steps} more steps reach "
            f"{longest + steps}, beyond Config.max_context={config.max_context}; "
            "raise max_context or generate fewer steps"
        )


def generate(
    family,
    config,
    weights,
    state,
    first_tokens: jax.Array,
    steps: int,
    *,
    sampling: str = "greedy",
    seed: int = 0,
    return_logits: bool = False,
    forced: ForcedTrace | None = None,
    record_selection: bool = False,
    teacher_tokens: jax.Array | None = None,
) -> Generated:
    """Decodes `steps` tokens per stream in one jitted scan.

    Args:
      family: a family name ("dsa", ...), a models.Family, or a family module (its FAMILY).
      state: the family's State; DONATED (use the returned one).
      first_tokens: [b] int32, fed at step 0 (typically argmax of prefill logits).
      sampling: "greedy" (argmax, lowest id on ties) or "sample" (categorical,
        key fold_in(key(seed), step)).
      return_logits: also return every step's logits (an output of the program: without it the
        program does not keep them).
      forced: a ForcedTrace, ids to attend instead of the model's own top-k, or None.
      record_selection: also return the ids every selecting layer attended to at every step
        (the model's own top-k, or the forced ids), for hisparse_jax.selection.recorded.
        Needs a "hisparse" or "device" state and an unsharded family.
      teacher_tokens: [steps, b] int32 or None. Teacher forcing: the token fed to step i + 1 is
        teacher_tokens[i], not the one sampled (the model reads a given continuation, e.g. the
        rest of a document); the returned tokens stay the model's own samples.
    Returns:
      Generated(tokens, logits, misses, state, selections).
    """
    family = get_family(family)
    _check_family_config(family, config)
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"generate: steps must be a positive int, got {steps!r}")
    if sampling not in SAMPLING:
        raise ValueError(f"generate: sampling must be one of {SAMPLING}, got {sampling!r}")
    _check_batch("first_tokens", first_tokens, state.lengths.shape[0])
    _check_context(config, state.lengths, int(steps))
    warn_unless_decode_layout(family, config, weights, jax.default_backend())
    out = generate_program(**_arguments(family, config, weights, state, first_tokens, steps, sampling, seed,
                                        return_logits, forced, record_selection, teacher_tokens))
    return Generated(*out)


# (id(family), id(config), id(weights)) -> a weak reference to the weights whose layout was found
# to be the decode layout: a timed decode loop passes the same objects every call, and checking
# them again (flattening the weights, hashing the config) would put ~0.2 ms of host time in each.
_CHECKED: dict[tuple[int, int, int], weakref.ref] = {}


def _layout_checked(family, config, weights) -> bool:
    ref = _CHECKED.get((id(family), id(config), id(weights)))
    return ref is not None and ref() is weights


def _remember_layout(family, config, weights) -> None:
    try:
        ref = weakref.ref(weights)
    except TypeError:  # a dict or tuple of weights: checked on every call
        return
    if len(_CHECKED) > 256:
        _CHECKED.clear()
    _CHECKED[(id(family), id(config), id(weights))] = ref


def warn_unless_decode_layout(family, config, weights, backend: str) -> None:
    """On a GPU (`backend`), weights outside the family's decode layout cost a weight-sized copy
    every step: XLA's dot merger concatenates the separate input projections that the decode layout
    holds as one matrix (seen on an H200). The same values either way, so a warning, not an error;
    XLA:CPU does not merge them."""
    if backend != "gpu" or _layout_checked(family, config, weights):
        return
    if in_decode_layout(family, config, weights):
        _remember_layout(family, config, weights)
        return
    warnings.warn(f"generate: the {family.name} weights are not in the family's decode layout, so on a GPU XLA "
                  "concatenates their separate input projections every step (a weight-sized copy); convert them "
                  "once when loaded: hisparse_jax.models.family.decode_weights(family, config, weights)",
                  stacklevel=3)


def _arguments(family, config, weights, state, first_tokens, steps, sampling, seed, return_logits,
               forced, record_selection=False, teacher_tokens=None) -> dict:
    batch = state.lengths.shape[0]
    if record_selection:
        family.selecting_layout(config, batch)  # a sharded family refuses here, with its reason
        if state.store.mode == "dense":
            raise ValueError('generate: record_selection needs a "hisparse" or "device" state; a "dense" state '
                             "attends to every record and selects none")
    if teacher_tokens is not None:
        want = (int(steps), batch)
        if tuple(jnp.shape(teacher_tokens)) != want or not jnp.issubdtype(jnp.result_type(teacher_tokens), jnp.integer):
            raise ValueError(f"generate: teacher_tokens must be integer [steps, batch] = {list(want)}, got "
                             f"{jnp.result_type(teacher_tokens)} {list(jnp.shape(teacher_tokens))}")
        teacher_tokens = jax.device_put(jnp.asarray(teacher_tokens, jnp.int32), state.lengths.sharding)
    if forced is not None and not isinstance(forced, ForcedTrace):
        raise TypeError(f"generate: forced must be a decode.ForcedTrace, got {type(forced).__name__}")
    selections = None if forced is None else forced.ids
    skip_indexer = forced is not None and forced.skip_indexer
    if selections is not None:
        layers, streams, _ = family.selecting_layout(config, state.lengths.shape[0])
        want = (int(steps), layers, *streams, config.top_k)
        if tuple(jnp.shape(selections)) != want or jnp.result_type(selections) != jnp.int32:
            raise ValueError(
                f"generate: selections must be int32 [steps, layers, *streams, k] = {list(want)}, got "
                f"{jnp.result_type(selections)} {list(jnp.shape(selections))}"
            )
        if state.store.mode == "dense":
            raise ValueError('generate: a "dense" state attends to every record; it takes no selections')
    elif skip_indexer:
        raise ValueError("generate: skip_indexer=True needs selections (what else would select?)")
    return dict(
        family=family, config=config, steps=int(steps), sampling=sampling, return_logits=bool(return_logits),
        skip_indexer=bool(skip_indexer), record_selection=bool(record_selection), weights=weights, state=state,
        first_tokens=_like_lengths(state, first_tokens), key=jax.random.key(seed), selections=selections,
        # A program input, not a constant: XLA cannot drop the indexer the selections override.
        forced_on=jnp.asarray(True) if selections is not None else None, teacher_tokens=teacher_tokens,
    )


def trace_generate(family, config, weights, state, first_tokens, steps, *, sampling="greedy", seed=0,
                   return_logits=False, forced=None, record_selection=False,
                   teacher_tokens=None) -> jax.stages.Traced:
    """The traced (not run) program of `generate`: `.jaxpr`, `.lower().as_text()`,
    `.lower().compile().as_text()` for program tests and benchmarks."""
    family = get_family(family)
    return generate_program.trace(**_arguments(family, config, weights, state, first_tokens, steps, sampling, seed,
                                            return_logits, forced, record_selection, teacher_tokens))


def prefill(family, config, weights, state, prompts: jax.Array, lengths: jax.Array):
    """Jitted family.prefill with the (fresh) state donated.

    Args:
      prompts: [b, T] int32, T <= config.max_context; lengths: [b] int32 in [1, T].
    Returns:
      (state, logits [b, V] float32 of each prompt's last token).
    """
    family = get_family(family)
    _check_family_config(family, config)
    prompts = jnp.asarray(prompts, jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    if prompts.ndim != 2:
        raise ValueError(f"prefill: prompts must be [batch, T], got shape {prompts.shape}")
    batch, T = prompts.shape
    _check_batch("lengths", lengths, batch)
    _check_batch("state.lengths", state.lengths, batch)
    if T > config.max_context:
        raise ValueError(
            f"prefill: prompts of T={T} tokens exceed Config.max_context={config.max_context}"
        )
    if _is_concrete(lengths):
        host = jax.device_get(lengths)
        if host.min() < 1 or host.max() > T:
            raise ValueError(f"prefill: lengths must lie in [1, T={T}], got {host.tolist()}")
    if _is_concrete(state.lengths) and jax.device_get(state.lengths).any():
        raise ValueError("prefill: the state already holds tokens; prefill a fresh state from init_state")
    return _prefill_jit(family=family, config=config, weights=weights, state=state, prompts=prompts,
                        lengths=lengths)


@functools.partial(jax.jit, static_argnames=("family", "config"), donate_argnames=("state",))
def _step_jit(family, config, weights, state, tokens):
    return family.decode_step(config, weights, state, tokens, None)


def decode_step(family, config, weights, state, tokens: jax.Array) -> StepOutput:
    """One jitted family.decode_step with the state donated (eager stepping, tests): its
    StepOutput (state, logits, misses)."""
    family = get_family(family)
    _check_family_config(family, config)
    return _step_jit(family=family, config=config, weights=weights, state=state,
                     tokens=_like_lengths(state, tokens))

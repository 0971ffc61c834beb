"""Decode runs compared bit for bit: "hisparse" against "device", "dense" against a selection of
every record, with a one-line message naming the first differing step, stream and element."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .. import decode
from . import arguments


@dataclasses.dataclass(frozen=True)
class Run:
    """What one prefill + greedy generate produced (arrays as NumPy) and the state after it."""

    prefill_logits: np.ndarray  # [b, V]
    tokens: np.ndarray  # [steps, b]
    logits: np.ndarray  # [steps, b, V]
    misses: np.ndarray  # [steps, L, *streams]: records RESOLVE fetched (zeros outside "hisparse")
    state: object  # the family's State after decoding

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.state.lengths)


def run_decode(family, config, weights, mode: str, prompts, lengths=None, steps: int = 8, selections=None) -> Run:
    """Prefills `prompts` ([b, T] int; `lengths` [b], None: all T) in `mode` and greedily decodes
    `steps` tokens with every step's logits. `selections`: forced ids [steps, layers, *S, k] int32
    (decode.ForcedTrace) or None (the family's own top-k)."""
    family = arguments.family_of(family)
    steps = arguments.steps_of(steps)
    prompts, lengths = arguments.prompts_of(prompts, lengths)
    state = arguments.new_state(family, config, len(lengths), mode)
    state, prefill_logits = decode.prefill(family, config, weights, state, jnp.asarray(prompts), jnp.asarray(lengths))
    first = jnp.argmax(prefill_logits, axis=-1).astype(jnp.int32)
    forced = None if selections is None else decode.ForcedTrace(jnp.asarray(selections, jnp.int32))
    out = decode.generate(family, config, weights, state, first, steps, return_logits=True, forced=forced)
    return Run(np.asarray(prefill_logits), np.asarray(out.tokens), np.asarray(out.logits), np.asarray(out.misses),
               out.state)


def _bits(x: np.ndarray) -> np.ndarray:
    """The raw bits of x (so -0.0 != 0.0 and NaNs compare by payload: zero tolerance)."""
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def first_difference(what: str, a: np.ndarray, b: np.ndarray, axes: tuple[str, ...]) -> str | None:
    """None when a and b are bit equal, else a line naming the first differing element (row-major,
    so the earliest step) by `axes` ("step", "stream", ...) with both values and their bits."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{what}: shapes differ, {a.dtype} {list(a.shape)} vs {b.dtype} {list(b.shape)}"
    differ = _bits(a) != _bits(b)
    if not differ.any():
        return None
    index = np.unravel_index(int(np.argmax(differ)), a.shape)
    where = ", ".join(f"{name} {int(i)}" for name, i in zip(axes, index))
    x, y = a[index], b[index]
    return (f"{what} differ first at {where} ({int(differ.sum())} of {differ.size} elements differ): "
            f"{x.item()!r} vs {y.item()!r} (bits {int(_bits(np.asarray(x))):#x} vs {int(_bits(np.asarray(y))):#x})")


def assert_runs_equal(a: Run, b: Run, names: tuple[str, str] = ("first", "second")) -> None:
    """Prefill logits, then every step's logits, then the tokens of two runs are bit equal (zero
    tolerance); else an AssertionError naming the first differing step, stream and element."""
    for what, x, y, axes in (("prefill logits", a.prefill_logits, b.prefill_logits, ("stream", "vocab entry")),
                             ("logits", a.logits, b.logits, ("step", "stream", "vocab entry")),
                             ("tokens", a.tokens, b.tokens, ("step", "stream"))):
        line = first_difference(what, x, y, axes)
        if line:
            raise AssertionError(f"{names[0]} vs {names[1]}: {line}")


def assert_hisparse_matches_device(family, config, weights, prompts, lengths=None, steps: int = 8) -> tuple[Run, Run]:
    """Decodes `prompts` in "hisparse" mode (records in the pinned-host pool, fetched into the hot
    buffer by RESOLVE, evicted LRU) and in "device" mode (full KV on the device), and asserts their
    prefill logits, every step's logits and tokens are bit for bit equal (zero tolerance).

    Why exact: the two modes run the same ops on the same shapes and differ only in where a
    selected record is read from, so any difference (even one ulp) means the hierarchical cache
    served a wrong or stale record. Pick config.hot_slots a little above top_k so that records
    are evicted every step (the returned hisparse run's `misses` show how many were fetched).

    Args:
      family: a hisparse_jax.models.Family or a family name ("dsa", "nsa", "quest").
      config: family.Config; weights: family.init_weights(config, seed).
      prompts: [b, T] int token ids; lengths: [b] ints in [1, T] (None: every prompt is T long).
      steps: greedy decode steps (>= 1); prompt lengths + steps must fit config.max_context.
    Returns:
      (hisparse Run, device Run).
    """
    hisparse = run_decode(family, config, weights, "hisparse", prompts, lengths, steps)
    device = run_decode(family, config, weights, "device", prompts, lengths, steps)
    assert_runs_equal(hisparse, device, ("hisparse", "device"))
    return hisparse, device


def every_record_config(family, config):
    """`config` with top_k = hot_slots = every record a stream can seal (config.num_records): a
    sparse decode with it selects every record, so it must equal a "dense" decode."""
    family = arguments.family_of(family)
    records = config.num_records
    try:
        return dataclasses.replace(config, top_k=records, hot_slots=records)
    except ValueError as error:
        raise ValueError(f"config: selecting every record needs top_k = hot_slots = num_records = {records}, which "
                         f"{family.name}'s Config refuses ({error}); use a smaller max_context") from error


def assert_dense_matches_selecting_every_record(family, config, weights, prompts, lengths=None,
                                                steps: int = 8) -> tuple[Run, Run]:
    """Decodes `prompts` in "dense" mode (attention to every sealed record in place, no selection)
    and in "hisparse" mode with top_k = hot_slots = every record (`every_record_config`), and
    asserts prefill logits, every step's logits and tokens bit for bit equal (zero tolerance).

    Why exact: a selection of every record attends to the same records in the same order as the
    dense path, through the family's selection, RESOLVE and gather code; a difference means the
    sparse path drops, repeats, misorders or misreads a record. config's top_k and hot_slots are
    replaced (weights do not depend on them); the other fields, and the arguments, are as in
    assert_hisparse_matches_device.
    Returns:
      (dense Run, every-record hisparse Run).
    """
    every = every_record_config(family, config)
    dense = run_decode(family, every, weights, "dense", prompts, lengths, steps)
    selecting = run_decode(family, every, weights, "hisparse", prompts, lengths, steps)
    assert_runs_equal(dense, selecting, ("dense", "every-record selection"))
    return dense, selecting

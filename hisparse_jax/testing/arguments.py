"""The argument checks of hisparse_jax.testing: a bad argument is a one-line error naming the
argument and the fix, raised before anything compiles (a compile error from deep in a family's
code would not say which argument was wrong)."""

from __future__ import annotations

from types import ModuleType

import jax
import numpy as np

from .. import _dispatch, kv_store, targets
from ..models import Family, get_family, known_families


def family_of(family) -> Family:
    """The Family a helper's `family` argument names: a Family, a family name or a family module."""
    if not isinstance(family, (Family, str, ModuleType)):
        raise TypeError(f"family: expected a hisparse_jax.models.Family or a family name "
                        f"({', '.join(known_families())}), got a {type(family).__name__}")
    try:
        return get_family(family)
    except (ValueError, TypeError) as error:
        raise type(error)(f"family: {error}") from error


def steps_of(steps) -> int:
    """`steps` as an int >= 1 (a bool or float is refused: a decode runs whole steps)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps: the decode steps to compare must be an int >= 1, got {steps!r}; pass e.g. steps=8")
    return int(steps)


def prompts_of(prompts, lengths) -> tuple[np.ndarray, np.ndarray]:
    """(prompts [b, T] int32, lengths [b] int32) as NumPy; lengths None: every prompt is T long."""
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer) or 0 in prompts.shape:
        raise ValueError(f"prompts: expected token ids [batch, T] (integers, batch and T >= 1), got "
                         f"{prompts.dtype} {list(prompts.shape)}")
    if lengths is None:
        return prompts.astype(np.int32), np.full((prompts.shape[0],), prompts.shape[1], np.int32)
    lengths = np.asarray(lengths)
    if lengths.shape != (prompts.shape[0],) or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths: expected [batch] = [{prompts.shape[0]}] integers (one per prompt), got "
                         f"{lengths.dtype} {list(lengths.shape)}; or pass lengths=None for full prompts")
    return prompts.astype(np.int32), lengths.astype(np.int32)


def batch_of(batch) -> int:
    """`batch` as an int >= 1: the streams of a traced program (it sizes the pool and every buffer)."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch: the streams of the traced program must be an int >= 1, got {batch!r}")
    return int(batch)


def new_state(family: Family, config, batch: int, mode: str):
    """family.init_state(config, batch, mode), or a ValueError naming `mode` when the family's
    init_state refuses it (its own error kept in the message: a refusal for another reason reads
    as what it is)."""
    if mode not in kv_store.MODES:
        raise ValueError(f"mode: expected one of {kv_store.MODES}, got {mode!r}")
    if not isinstance(config, family.Config):
        raise TypeError(f"config: a {type(config).__name__}, expected {family.name}'s Config; build one with "
                        f"family.Config.tiny(...)")
    try:
        return family.init_state(config, batch, mode)
    except (ValueError, NotImplementedError, KeyError) as error:
        raise ValueError(f"mode: family {family.name}'s init_state refused mode {mode!r} ({error}); this check "
                         f"decodes in that mode, so the family must support it") from error


def on_ffi(config) -> None:
    """Raises unless RESOLVE runs as its custom call: the program checks count and follow it."""
    if _dispatch.choose_implementation("resolve", config.implementation, targets.RESOLVE) != "ffi":
        raise ValueError(f"config: implementation={config.implementation!r} runs RESOLVE as its JAX reference on "
                         f"{jax.default_backend()} (no custom call to check); build the package's handlers "
                         "(hisparse_jax.has_ffi()) and use implementation='auto' or 'ffi'")

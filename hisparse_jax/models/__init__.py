"""Model families that decode through a HiSparse RecordStore.

A family is a module (looked up by name with `get_family`) exposing one protocol,
so `hisparse_jax.decode` and the benchmarks drive every family the same way.
Shapes: b = batch, T = prompt length, V = vocab, L = sparse layers.

`Config`
    Frozen, hashable dataclass (a static jit argument), validated at construction
    with ValueErrors that name the field (`Config.top_k: ...`). Presets:
    `Config.tiny(**overrides)` (CPU tests in seconds), `Config.realistic(**overrides)`
    (GPU benchmark shapes) and `Config.preset(name, **overrides)`. Fields every
    family has: `top_k` (records selected per stream and step), `hot_slots` (B),
    `max_context` (tokens per stream), `page_size` (tokens per record).
    `config.cache_config(batch) -> hisparse_jax.CacheConfig` sizes the store.

`init_weights(config, seed) -> Weights`
    Registered pytree; per-layer weights stacked on a leading layer axis so the
    layer loop is a `lax.scan`.

`init_state(config, batch, mode) -> State`
    Registered pytree with at least `store` (a kv_store.RecordStore in `mode`:
    "hisparse", "device" or "dense"), `tail` (the open page of every layer and
    stream, on device), the family's indexer metadata (on device) and `lengths`
    ([b] int32 tokens held per stream) and `trace` (None, or a TraceState).

`prefill(config, weights, state, prompts [b, T] int32, lengths [b] int32)`
    `-> (state, logits [b, V] float32)`. Dense causal prefill of ragged prompts
    (row i valid up to lengths[i], 1 <= lengths[i] <= T <= max_context) into a
    fresh state: sealed pages go to the store with `write_sealed`, the open page
    to the tail; logits are those of each prompt's last token.

`decode_step(config, weights, state, tokens [b] int32)`
    `-> (state, logits [b, V] float32, misses int32 [L, *streams])`. Appends one
    token per stream to the tail, selects sealed records with the family's
    indexer (all sealed records in position order in "dense" mode), attends to
    the gathered records plus the tail, and seals the open page once it is full.
    Every mode runs the same ops on the same shapes; only the selection (dense)
    or the placement of records (hisparse/device) differs, so "hisparse" and
    "device" agree bit for bit.

`trace_layout(config, batch) -> (layers, stream_shape, num_records)`
    The shape of a `hisparse_jax.traces.TraceState` that steers this family's
    selection: a State whose `trace` field holds one (default None) ranks
    records by the calibrated synthetic trace instead of its own indexer scores
    (which it still computes), for benchmarks with realistic locality.

`decode.generate(family, ...)` runs `decode_step` in a jitted `lax.scan` over
steps with the state donated; see hisparse_jax/decode.py.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> module path; modules are imported on first use.
FAMILIES = {
    "dsa": "hisparse_jax.models.dsa",
    "nsa": "hisparse_jax.models.nsa",
    "quest": "hisparse_jax.models.quest",
}

PROTOCOL = ("Config", "init_weights", "init_state", "prefill", "decode_step", "trace_layout")


def known_families() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


def get_family(name: str | ModuleType) -> ModuleType:
    """The family module called `name` (a module passes through unchanged)."""
    if isinstance(name, ModuleType):
        return name
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known families: {', '.join(known_families())}")
    module = importlib.import_module(FAMILIES[name])
    missing = [attr for attr in PROTOCOL if not hasattr(module, attr)]
    if missing:
        raise TypeError(f"model family {name!r} ({module.__name__}) lacks {', '.join(missing)}")
    return module


__all__ = ["FAMILIES", "PROTOCOL", "get_family", "known_families"]

"""Model families that decode through a HiSparse RecordStore.

A family is a value, a `Family` (models/family.py) of the functions below: each family module
defines its `FAMILY`, `get_family` looks it up by name, and `hisparse_jax.decode`, `sharding`
and the benchmarks drive every family the same way. A user-defined family is a `Family(...)`;
one around a new sparse indexer is `hisparse_jax.kit.family(MyIndexer(...))` (docs/kit.md).
Shapes: b = batch, T = prompt length, V = vocab, L = sparse layers.

`Config`
    Frozen, hashable dataclass (a static jit argument) built on `config.ModelConfig`, which
    holds the fields every family shares (sizes, top_k, hot_slots, max_context, page_size,
    pool_records, dtype, implementation), validated at construction with ValueErrors that name
    the field (`Config.top_k: ...`). Presets: `Config.tiny(**overrides)` (CPU tests in
    seconds), `Config.realistic(**overrides)` (GPU benchmark shapes) and
    `Config.preset(name, **overrides)`. `config.cache_config(batch) -> CacheConfig` sizes the
    store; `config.implementation` picks the RESOLVE and top-k kernels (same bits in each).

`init_weights(config, seed) -> Weights`
    Registered pytree; per-layer weights are a tuple of per-layer pytrees (one buffer per
    layer: the decode step unrolls its layers and reads each layer's weights in place). A
    layer's feed-forward branch is its `mlp` (layers.MLPWeights) or, with config.experts > 0,
    its `moe` (moe.MoEWeights), the other None. `weights.weight_bytes(family, config)` gives
    their bytes by component from the shapes alone; a family lists the weights its selection
    reads in `Family.selection_weights` (names on their pytree paths).

`init_state(config, batch, mode) -> State`
    Registered pytree whose every array field declares its layout (memory kind, byte category,
    batch axis; hisparse_jax.layout), with at least `store` (a kv_store.RecordStore in `mode`:
    "hisparse", "device" or "dense"), `tail` (the open page of every layer) and `lengths`
    ([b] int32 tokens held per stream). Per-layer arrays are tuples of per-layer buffers.

`prefill(config, weights, state, prompts [b, T] int32, lengths [b] int32)`
    `-> (state, logits [b, V] float32)`. Dense causal prefill of ragged prompts (row i valid up
    to lengths[i], 1 <= lengths[i] <= T <= max_context) into a fresh state: sealed pages go to
    the store with `write_sealed`, the open page to the tail; logits are those of each prompt's
    last token.

`decode_step(config, weights, state, tokens [b] int32, forced=None, record_selection=False)`
    `-> paging.StepOutput(state, logits [b, V] float32, misses int32 [L, *streams], selected)`.
    Appends one token per stream to the tail, selects sealed records with the family's indexer
    and `paging.select` (every sealed record, in place, in "dense" mode), attends to them plus
    the tail, and seals the open page once it is full. `forced` (a paging.ForcedSelection)
    replaces the selected ids by a trace's at run time; with `record_selection` (static) the
    step also returns the ids every selecting layer attended to (`paging.stack_selected`).
    Every mode runs the same ops on the same shapes;
    only the selection (dense) or the placement of records (hisparse/device) differs, so
    "hisparse" and "device" agree bit for bit.

`selecting_layout(config, batch) -> (layers, stream_shape, num_records)`
    The shape of the selections a trace feeds this family
    (hisparse_jax.selection.synthetic.selections: [steps, layers, *stream_shape, top_k]).

`metadata_bytes_read(config, context) -> int`
    Device bytes one decode step reads per request besides weights and the attended records
    (index keys, page bounds, compressed KV, dense layers): the family's part of the step's
    roofline (hisparse_jax.bench.profile).

`decode.generate(family, ...)` runs `decode_step` in a jitted `lax.scan` over
steps with the state donated; see hisparse_jax/decode.py.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .family import Family

# name -> the module defining its FAMILY; modules are imported on first use.
FAMILIES = {
    "dsa": "hisparse_jax.models.dsa",
    "nsa": "hisparse_jax.models.nsa",
    "quest": "hisparse_jax.models.quest",
}


def known_families() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


def get_family(family: str | Family | ModuleType) -> Family:
    """The Family called `family`; a Family passes through unchanged, a family module gives its
    FAMILY."""
    if isinstance(family, Family):
        return family
    if isinstance(family, ModuleType):
        value = getattr(family, "FAMILY", None)
        if not isinstance(value, Family):
            raise TypeError(f"module {family.__name__} defines no FAMILY = models.Family(...)")
        return value
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known families: {', '.join(known_families())}")
    return importlib.import_module(FAMILIES[family]).FAMILY


__all__ = ["FAMILIES", "Family", "get_family", "known_families"]

"""What every model family must do, one suite with the family injected (fixture `case`).

- "hisparse" and "device" decode to the same tokens and logits, bit for bit, while LRU evicts;
- "dense" equals a sparse selection of every record, bit for bit;
- decode equals a dense prefill of the same tokens (float tolerance: an independent computation);
- the prompt past each length is never read; generate and prefill check their inputs;
- every implementation (C++/CUDA handlers and the pure-JAX references) gives the same bits;
- a forced selection (a trace's ids) is what the model attends, whatever its own indexer says.
End-to-end runs (prefill of 3 ragged prompts, 64 greedy steps) are cached per (config, mode).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import gpu_attention_may_differ
from model_helpers import STEPS, assert_bitwise_equal

from hisparse_jax import decode
from hisparse_jax.selection import synthetic as traces
from hisparse_jax.models import get_family, known_families


def _stores(config, batch):
    cache = config.cache_config(batch)
    return cache.num_layers, cache.stream_shape


# --------------------------------------------------------------------------- modes agree bit for bit


@pytest.mark.parametrize("spare", [2, 0], ids=["B=k+2", "B=k"])
def test_hisparse_matches_device_while_evicting(case, spare):
    config = case.config(hot_slots=case.k + spare)
    hisparse, device = case.run(config, "hisparse"), case.device_baseline()
    assert_bitwise_equal(hisparse, device)
    layers, streams = _stores(config, len(case.lengths))
    assert hisparse.misses.shape == (STEPS, layers, *streams)
    per_step = hisparse.misses.reshape(STEPS, -1).sum(-1)
    assert (per_step > 0).mean() >= 0.9, f"misses per step: {per_step}"
    assert (hisparse.misses <= case.k).all()
    assert not device.misses.any()
    assert hisparse.state.store.host_pool.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(hisparse.lengths, np.asarray(case.lengths) + STEPS)


def test_dense_equals_a_selection_of_every_record(case):
    if gpu_attention_may_differ(case.family):
        pytest.skip("XLA's attention on a GPU may sum the dense read and the gathered records in other orders: a CPU check (docs/testing.md)")
    every = case.config(**case.every_record)
    hisparse, dense = case.run(every, "hisparse"), case.run(every, "dense")
    assert_bitwise_equal(hisparse, dense)
    # Nothing is evicted: each record is fetched once, when first selectable; the last step
    # selects the records sealed before it.
    fetched = hisparse.misses.sum(axis=0)  # [L, b, *heads]
    selectable = (np.asarray(case.lengths) + STEPS - 1) // every.page_size
    np.testing.assert_array_equal(fetched, np.broadcast_to(
        selectable.reshape(-1, *([1] * (fetched.ndim - 2))), fetched.shape))
    # ... and a real selection does change the output.
    config = case.config()
    assert not np.array_equal(case.run(config, "device").logits, case.run(config, "dense").logits)


def test_implementations_give_the_same_bits(case, ffi_backend):
    if not ffi_backend:
        pytest.skip(f"no FFI handler on {jax.default_backend()}: every implementation is the reference")
    reference = case.config(implementation="reference")
    assert_bitwise_equal(case.run(reference, "hisparse"), case.run(case.config(implementation="ffi"), "hisparse"))


# --------------------------------------------------------------------------- an independent computation


def test_decode_matches_prefill_of_the_same_tokens(case):
    """Dense decode at position p == dense prefill of the first p + 1 tokens (float tolerance).

    Prefill is plain causal attention over the whole sequence; decode runs the paged state (tail,
    sealing, page order, the family's side buffers), so agreement checks that bookkeeping.
    """
    config = case.config()
    dense = case.run(config, "dense")
    tokens, lengths = case.prompts()
    sequence = np.zeros((len(lengths), int(lengths.max()) + STEPS), np.int32)
    sequence[:, : tokens.shape[1]] = tokens[:, : sequence.shape[1]]
    fed = np.concatenate([dense.prefill_logits.argmax(-1)[None], dense.tokens[:-1]])  # [STEPS, b]
    for i, n in enumerate(lengths):
        sequence[i, n : n + STEPS] = fed[:, i]
    P = config.page_size
    for step in sorted({0, 1, P - 1, P, 40, STEPS - 1}):  # around page boundaries of the ragged rows
        state = case.module.init_state(config, len(lengths), "dense")
        _, logits = decode.prefill(case.family, config, case.weights(), state, sequence, lengths + step + 1)
        np.testing.assert_allclose(np.asarray(logits), dense.logits[step], rtol=2e-4, atol=2e-4)


# --------------------------------------------------------------------------- inputs


def test_prefill_ignores_tokens_past_each_length(case):
    config = case.config()
    tokens, lengths = (jnp.asarray(a) for a in case.prompts())
    other = jnp.where(jnp.arange(tokens.shape[1]) < lengths[:, None], tokens, (tokens + 7) % 256)
    outs = []
    for p in (tokens, other):
        state = case.module.init_state(config, len(case.lengths), "device")
        outs.append(decode.prefill(case.family, config, case.weights(), state, p, lengths))
    (s1, l1), (s2, l2) = outs
    for a, b in zip(jax.tree.leaves((s1, l1)), jax.tree.leaves((s2, l2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(s1.lengths), np.asarray(lengths))


def test_generate_and_prefill_check_their_inputs(case):
    config = case.config()
    tokens, lengths = (jnp.asarray(a) for a in case.prompts())
    state = case.module.init_state(config, len(case.lengths), "hisparse")
    state, logits = decode.prefill(case.family, config, case.weights(), state, tokens, lengths)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    room = config.max_context - int(lengths.max())
    with pytest.raises(ValueError, match=f"max_context={config.max_context}"):
        decode.generate(case.family, config, case.weights(), state, first, room + 1)
    with pytest.raises(ValueError, match="fresh state"):
        decode.prefill(case.family, config, case.weights(), state, tokens, lengths)
    with pytest.raises(TypeError, match="Config"):
        decode.generate(case.family, object(), case.weights(), state, first, 1)
    with pytest.raises(ValueError, match="selections must be int32"):
        decode.generate(case.family, config, case.weights(), state, first, 2,
                        forced=decode.ForcedTrace(jnp.zeros((2, 1), jnp.int32)))
    with pytest.raises(ValueError, match="skip_indexer=True needs selections"):
        decode.generate(case.family, config, case.weights(), state, first, 2, forced=decode.ForcedTrace(None, True))
    with pytest.raises(TypeError, match="forced must be a decode.ForcedTrace"):
        decode.generate(case.family, config, case.weights(), state, first, 2, forced=jnp.zeros((2, 1), jnp.int32))


def test_family_registry(case):
    assert get_family(case.family) is case.module and get_family(case.module) is case.module
    assert case.family in known_families()
    with pytest.raises(ValueError, match="unknown model family 'llama'"):
        get_family("llama")


def test_presets_are_valid_and_hashable(case):
    for name in case.module.Config.PRESETS:
        config = case.module.Config.preset(name)
        hash(config)  # a static jit argument
        assert config.cache_config(2).record_bytes == config.record_bytes
    assert case.module.Config.preset("tiny", top_k=2) == case.module.Config.tiny(top_k=2)
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny, realistic"):
        case.module.Config.preset("huge")
    with pytest.raises(ValueError, match="unknown field.*d_modle"):
        case.module.Config.tiny(d_modle=32)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(top_k=9, hot_slots=8), "top_k"),  # k > B
        (dict(pool_records=8), "max_context"),  # context beyond the pool
        (dict(max_context=250, page_size=16), "page_size"),  # page size not dividing the context
        (dict(page_size=8, prefill_chunk=12), "prefill_chunk"),
        (dict(dtype="float16"), "dtype"),
        (dict(hot_slots=0), "hot_slots"),
        (dict(num_layers=0), "num_layers"),
        (dict(implementation="cuda"), "implementation"),
        (dict(hot_slots=20000, top_k=16), "hot_slots"),  # beyond the CUDA kernel's B
    ],
)
def test_bad_shared_fields_name_the_field(case, overrides, field):
    with pytest.raises(ValueError, match=rf"{field}\b"):
        case.config(**overrides)


# --------------------------------------------------------------------------- forced selections


def _lru_misses(ids: np.ndarray, hot_slots: int) -> np.ndarray:
    """Records an LRU cache of `hot_slots` fetches for each selection of ids [steps, *S, k], in
    RESOLVE's order: misses evict the least recently used non-hit records, then the hits become
    the most recently used, in their old order."""
    steps, *streams, k = ids.shape
    flat = ids.reshape(steps, -1, k)
    misses = np.zeros(flat.shape[:2], np.int64)
    caches = [collections.OrderedDict() for _ in range(flat.shape[1])]
    for t in range(steps):
        for s, cache in enumerate(caches):
            chosen = [int(i) for i in dict.fromkeys(flat[t, s]) if i >= 0]
            hits = [r for r in cache if r in chosen]
            for i in chosen:
                if i not in cache:
                    misses[t, s] += 1
                    if len(cache) >= hot_slots:
                        del cache[next(r for r in cache if r not in chosen)]
                    cache[i] = True
            for r in hits:
                cache.move_to_end(r)
    return misses.reshape(steps, *streams)


def test_a_forced_selection_is_what_the_model_attends(case):
    """Trace ids fed through generate replace the model's top-k: hisparse == device bit for bit,
    RESOLVE misses what an LRU replay of the ids misses, the indexer-free diagnostic gives the
    same bits, and the tokens differ from the model's own selection."""
    config = case.config()
    batch = len(case.lengths)
    layers, streams, records = case.module.selecting_layout(config, batch)
    trace = traces.TraceConfig.for_page_size(config.page_size)
    ids = np.asarray(traces.selections(trace, layers, streams, records, config.top_k,
                                       jnp.asarray(case.lengths), STEPS, config.page_size))
    assert ids.shape == (STEPS, layers, *streams, config.top_k)
    hisparse = case.run(config, "hisparse", selections=ids)
    assert_bitwise_equal(hisparse, case.run(config, "device", selections=ids))
    assert not np.array_equal(hisparse.tokens, case.device_baseline().tokens)
    store_layers = _stores(config, batch)[0]
    per_selector = store_layers // layers  # DSA: the layers of an indexer group resolve the same ids
    for layer in range(store_layers):
        want = _lru_misses(ids[:, layer // per_selector], config.hot_slots)
        # Step 0 also fetches what the prompt sealed before the cache existed, exactly like the replay.
        np.testing.assert_array_equal(hisparse.misses[:, layer], want, err_msg=f"layer {layer}")

    state = case.module.init_state(config, batch, "hisparse")
    tokens, lengths = (jnp.asarray(a) for a in case.prompts())
    state, logits = decode.prefill(case.family, config, case.weights(), state, tokens, lengths)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    skipped = decode.generate(case.family, config, case.weights(), state, first, STEPS,
                              forced=decode.ForcedTrace(jnp.asarray(ids), skip_indexer=True))
    np.testing.assert_array_equal(np.asarray(skipped.tokens), hisparse.tokens)

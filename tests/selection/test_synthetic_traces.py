"""The calibrated selection-trace generator (docs/synthetic.md) and the ids it feeds a decode."""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax.selection import synthetic


def _lru_miss_rate(selections, capacity: int, warm: int) -> float:
    """Misses per selected id of an LRU cache of `capacity` ids, after `warm` steps."""
    lru, missed, seen = collections.OrderedDict(), 0, 0
    for step, ids in enumerate(selections):
        fresh = 0
        for r in ids.tolist():
            if r in lru:
                lru.move_to_end(r)
            else:
                fresh += 1
                lru[r] = None
        while len(lru) > capacity:
            lru.popitem(last=False)
        if step >= warm:
            missed, seen = missed + fresh, seen + len(ids)
    return missed / seen


def _selections(config, n, k, steps, layers=1, seed=0):
    """[steps, layers, k] top-k ids of one stream over n sealed records."""
    trace = synthetic.init_trace(config, layers, (1,), n, seed=seed)
    out = []
    for _ in range(steps):
        trace, top = _step(trace, k, layers)
        out.append(np.asarray(top))
    return np.stack(out)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _step(trace, k, layers):
    trace = synthetic.advance(trace)
    sealed = jnp.full((1,), trace.slow.shape[-1], jnp.int32)
    tops = [jax.lax.top_k(synthetic.scores(trace, l, sealed)[0], k)[1] for l in range(layers)]
    return trace, jnp.stack(tops)


def _overlap(a, b) -> float:
    return len(np.intersect1d(a, b)) / len(a)


def test_defaults_reproduce_the_published_locality():
    """n = 65,536, k = 2048: step overlap ~0.73, LRU misses ~27% / 14% / 6% at B = k / 2k / 4k
    (four seeds measured 27.0-27.7%, 13.8-14.4%, 6.0-6.4%; docs/synthetic.md has the published figures)."""
    n, k, steps, warm = 65536, 2048, 100, 40
    sel = _selections(synthetic.TraceConfig(), n, k, steps)[:, 0]
    overlap = np.mean([_overlap(sel[t], sel[t + 1]) for t in range(warm, steps - 1)])
    assert 0.69 <= overlap <= 0.77, overlap
    for capacity, low, high in ((k, 0.25, 0.30), (2 * k, 0.125, 0.16), (4 * k, 0.052, 0.072)):
        rate = _lru_miss_rate(sel, capacity, warm)
        assert low <= rate <= high, (capacity, rate)


def test_memoryless_layers_forget_and_adjacent_layers_agree():
    n, k = 4096, 256
    config = synthetic.TraceConfig(memoryless_layers=1)
    sel = _selections(config, n, k, steps=12, layers=3)
    step_overlap = lambda l: np.mean([_overlap(sel[t, l], sel[t + 1, l]) for t in range(4, 11)])
    # Layer 0 redraws every step: overlap near the sink/local ids plus chance (k / n).
    chance = (config.sink + config.local) / k + k / n
    assert step_overlap(0) < chance + 0.1
    assert step_overlap(1) > 0.5 and step_overlap(2) > 0.5
    # Innovations chained across layers (rho_layer 0.9): adjacent layers select more alike
    # than with independent innovations (rho_layer 0), where only the shared u aligns them.
    adjacent = lambda s: np.mean([_overlap(s[t, 1], s[t, 2]) for t in range(12)])
    unchained = _selections(dataclasses.replace(config, rho_layer=0.0), n, k, steps=12, layers=3)
    assert adjacent(sel) > adjacent(unchained) + 0.1


def test_sink_and_local_records_are_always_selected():
    n, k = 1000, 80
    config = synthetic.TraceConfig(sink=4, local=16)
    sealed = jnp.asarray([n, 500], jnp.int32)
    trace = synthetic.advance(synthetic.init_trace(config, 2, (2,), n, seed=3))
    for layer in range(2):
        top = np.asarray(jax.lax.top_k(synthetic.scores(trace, layer, sealed), k)[1])
        for stream, count in enumerate((n, 500)):
            must = set(range(4)) | set(range(count - 16, count))
            assert must <= set(top[stream].tolist())


def test_same_seed_same_trace_and_steps_differ():
    config = synthetic.TraceConfig()
    a = _selections(config, 2048, 128, steps=3, seed=7)
    b = _selections(config, 2048, 128, steps=3, seed=7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[1], a[2])


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(beta=1.5), r"TraceConfig\.beta"),
        (dict(rho_u=1.0), r"TraceConfig\.rho_u"),
        (dict(rho_layer=-0.1), r"TraceConfig\.rho_layer"),
        (dict(sink=-1), r"TraceConfig\.sink"),
        (dict(memoryless_layers=2.0), r"TraceConfig\.memoryless_layers"),
    ],
)
def test_bad_parameters_name_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        synthetic.TraceConfig(**fields)


def test_init_trace_rejects_more_memoryless_layers_than_layers():
    with pytest.raises(ValueError, match="memoryless_layers=3 exceeds the 2 selecting layers"):
        synthetic.init_trace(synthetic.TraceConfig(memoryless_layers=3), 2, (1,), 16)


def test_for_page_size_counts_sink_and_local_in_tokens():
    config = synthetic.TraceConfig.for_page_size(16)
    assert (config.sink, config.local) == (1, 4)
    assert synthetic.TraceConfig.for_page_size(1) == synthetic.TraceConfig()


def test_named_calibrations():
    glm = synthetic.TraceConfig.calibration("glm-5.1")
    assert (glm.beta, glm.rho_e, glm.name) == (0.75, 0.8, "glm-5.1") and glm == synthetic.TraceConfig()
    deepseek = synthetic.TraceConfig.calibration("deepseek-v3.2", page_size=16)
    assert (deepseek.beta, deepseek.rho_e, deepseek.sink, deepseek.local) == (0.55, 0.5, 1, 4)
    assert "deepseek-v3.2-like" in synthetic.describe(deepseek)
    with pytest.raises(ValueError, match="unknown trace calibration 'llama'.*glm-5.1, deepseek-v3.2"):
        synthetic.TraceConfig.calibration("llama")


def test_selections_are_the_stepped_generator_top_k():
    """selections() == init_trace, then advance + top-k of every layer's scores each step, with the
    sealed records growing by one page every page_size steps; ascending ids, -1 padding."""
    config, layers, k, P, steps = synthetic.TraceConfig(sink=1, local=2), 2, 6, 4, 9
    lengths = jnp.asarray([9, 30], jnp.int32)  # 2 and 7 sealed pages of 4 at the first step
    ids = np.asarray(synthetic.selections(config, layers, (2,), 16, k, lengths, steps, page_size=P, seed=5))
    assert ids.shape == (steps, layers, 2, k) and ids.dtype == np.int32
    trace = synthetic.init_trace(config, layers, (2,), 16, seed=5)
    for t in range(steps):
        trace = synthetic.advance(trace)
        sealed = (np.asarray(lengths) + t) // P
        for layer in range(layers):
            scores = np.asarray(synthetic.scores(trace, layer, jnp.asarray(sealed)))
            for s, n in enumerate(sealed):
                order = sorted(range(n), key=lambda i: (-scores[s, i], i))[:k]
                want = sorted(order) + [-1] * (k - len(order))
                np.testing.assert_array_equal(ids[t, layer, s], want, err_msg=f"step {t} layer {layer} stream {s}")


def test_selections_check_their_arguments():
    with pytest.raises(ValueError, match="steps must be a positive int"):
        synthetic.selections(synthetic.TraceConfig(), 1, (1,), 16, 4, jnp.asarray([8]), 0)
    with pytest.raises(ValueError, match=r"k must be an int in \[1, num_records=16\]"):
        synthetic.selections(synthetic.TraceConfig(), 1, (1,), 16, 17, jnp.asarray([8]), 2)

"""generate(record_selection=True) returns the ids every selecting layer attended to, the same in
every mode that selects; teacher_tokens feeds a given continuation."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import make_prompts, weights_for

from hisparse_jax import decode
from hisparse_jax.selection import synthetic as traces
from hisparse_jax.models import get_family

STEPS = 6


def _decode(family_name, config, mode, **options):
    family = get_family(family_name)
    weights = weights_for(family_name, config)
    prompts, lengths = make_prompts(vocab=config.vocab)
    state = family.init_state(config, prompts.shape[0], mode)
    state, logits = decode.prefill(family, config, weights, state, prompts, lengths)
    return decode.generate(family, config, weights, state, jnp.argmax(logits, -1).astype(jnp.int32), STEPS,
                           **options)


@pytest.mark.parametrize("family_name", ["dsa", "quest"])
def test_recorded_selections_are_the_same_in_both_selecting_modes(family_name):
    config = get_family(family_name).Config.tiny()
    hisparse = _decode(family_name, config, "hisparse", record_selection=True)
    device = _decode(family_name, config, "device", record_selection=True)
    layers, streams, records = get_family(family_name).selecting_layout(config, 3)
    ids = np.asarray(hisparse.selections)
    assert ids.shape == (STEPS, layers, *streams, config.top_k) and ids.dtype == np.int32
    assert np.array_equal(ids, np.asarray(device.selections))
    valid = ids >= 0
    assert valid.any() and (ids < records).all()
    # ascending ids, then padding: what top-k returns
    assert not (valid[..., 1:] & ~valid[..., :-1]).any()
    assert not (valid[..., 1:] & (ids[..., 1:] <= ids[..., :-1])).any()


def test_forced_selections_are_what_is_recorded():
    family = get_family("dsa")
    config = family.Config.tiny()
    _, lengths = make_prompts(vocab=config.vocab)
    layers, streams, records = family.selecting_layout(config, 3)
    forced = traces.selections(traces.TraceConfig.calibration("glm-5.1"), layers, streams, records, config.top_k,
                               lengths, STEPS)
    out = _decode("dsa", config, "hisparse", record_selection=True, forced=decode.ForcedTrace(forced))
    assert np.array_equal(np.asarray(out.selections), np.asarray(forced))


def test_teacher_tokens_feed_the_continuation():
    config = get_family("dsa").Config.tiny()
    teacher = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab, (STEPS, 3)), jnp.int32)
    free = _decode("dsa", config, "device", return_logits=True)
    forced = _decode("dsa", config, "device", return_logits=True, teacher_tokens=teacher)
    # step 0 reads the same token; later steps read the teacher's, so their logits differ
    assert np.array_equal(np.asarray(free.logits[0]), np.asarray(forced.logits[0]))
    assert not np.allclose(np.asarray(free.logits[1:]), np.asarray(forced.logits[1:]))
    # the returned tokens are the model's own samples
    assert np.array_equal(np.asarray(forced.tokens), np.argmax(np.asarray(forced.logits), -1))


def test_record_selection_and_teacher_tokens_refuse_bad_use():
    config = get_family("dsa").Config.tiny()
    with pytest.raises(ValueError, match='record_selection needs a "hisparse" or "device" state'):
        _decode("dsa", config, "dense", record_selection=True)
    with pytest.raises(ValueError, match=r"teacher_tokens must be integer \[steps, batch\] = \[6, 3\]"):
        _decode("dsa", config, "device", teacher_tokens=jnp.zeros((STEPS, 2), jnp.int32))

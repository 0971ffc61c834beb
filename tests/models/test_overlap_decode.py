"""Overlap groups (Config.overlap_groups = G, kit.overlap): each layer's RESOLVE and attention run
group by group of streams, so that one group's prefetched copy overlaps the other groups' work
even where every layer selects its own records (index_share = 1). Only the order of the work
changes: tokens, logits, misses, slots, LRU state and hot bytes are bit-identical at G = 1, 2, 4,
with the C++ RESOLVE and the pure-JAX reference, with a shared indexer too, and equal to the
full-KV ("device") decode. The compiled program runs one resolve_prefetch and one join per group
per sparse layer per step, keeps the pool pinned and copies neither it nor the hot buffer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from model_helpers import CASES, make_prompts, weights_for

from hisparse_jax import hlo, testing
from hisparse_jax.testing import IN_PLACE

LENGTHS = (37, 20, 5, 29)  # four streams: two groups of two, four of one
STEPS = 16
CASE = CASES["dsa"]


def _config(index_share=1, **overrides):
    return CASE.config(num_layers=2, index_share=index_share, **overrides)


@functools.cache
def _run(config, mode="hisparse"):
    prompts, lengths = make_prompts(0, LENGTHS, CASE.T)
    return testing.run_decode("dsa", config, weights_for("dsa", config), mode, prompts, lengths, STEPS)


def _assert_same_state(a, b):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        x, y = np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y))
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"state{jax.tree_util.keystr(path)} differs"


def _xla_attention_on_gpu():
    # The tiny configs' attention is XLA's, which is not batch invariant on a GPU: the groups
    # refuse it there (test_overlap_needs_the_attention_kernel_on_gpu); the kernel tests cover GPUs.
    if jax.default_backend() != "cpu":
        pytest.skip("overlap groups refuse XLA's attention on a GPU; the kernel-shaped tests cover it")


@pytest.mark.parametrize("index_share, groups, implementation",
                         [(1, 2, "auto"), (1, 4, "auto"), (2, 2, "auto"), (1, 2, "reference")])
def test_overlap_groups_give_the_same_bits(index_share, groups, implementation):
    _xla_attention_on_gpu()
    whole = _run(_config(index_share, prefetch=True, implementation=implementation))
    split = _run(_config(index_share, prefetch=True, implementation=implementation, overlap_groups=groups))
    testing.assert_runs_equal(split, whole)
    np.testing.assert_array_equal(split.misses, whole.misses)
    assert whole.misses.sum() > 0, "nothing was fetched: the test would prove nothing"
    _assert_same_state(split.state, whole.state)  # slots, LRU, hot bytes, pool, keys
    testing.assert_runs_equal(split, _run(_config(index_share), "device"))


def test_device_and_dense_run_the_whole_batch():
    # No copy to hide: the knob leaves "device" and "dense" as they are, bit for bit.
    config = _config(prefetch=True, overlap_groups=2)
    for mode in ("device", "dense"):
        testing.assert_runs_equal(_run(config, mode), _run(_config(), mode))


def _assert_hot_not_copied(program, config, groups):
    cache = config.cache_config(len(LENGTHS))
    L, b, *rest = cache.hot_shape
    hot = {hlo.shape_text(cache.hot_shape, cache.dtype), hlo.shape_text((L * groups, b // groups, *rest), cache.dtype)}
    bad = [f"{name} = {shape} {opcode}" for name, shape, opcode, root in program.materialized()
           if hlo.array_type(shape) in hot and opcode not in IN_PLACE]
    assert not bad, "the hot buffer (or its group view) is copied:\n" + "\n".join(bad)


def test_overlap_program(ffi_backend):
    if not ffi_backend:
        pytest.skip(f"no RESOLVE FFI handler on {jax.default_backend()}: resolve runs the JAX reference")
    _xla_attention_on_gpu()
    config = _config(prefetch=True, overlap_groups=2)
    weights = weights_for("dsa", config)
    _assert_hot_not_copied(testing.assert_clean_decode_program("dsa", config, weights, len(LENGTHS), 8), config, 2)

    # The count check still catches a resolve too many: this program, checked as if G were 1.
    traced = testing.trace_decode("dsa", config, weights, len(LENGTHS), "hisparse", 8)
    with pytest.raises(AssertionError, match="expected one call per sparse layer"):
        testing.assert_one_resolve_per_sparse_layer_per_step(traced, dataclasses.replace(config, overlap_groups=1), 8)


def test_bad_overlap_groups_are_refused():
    with pytest.raises(ValueError, match="overlap_groups.*set prefetch=True"):
        _config(overlap_groups=2)
    with pytest.raises(ValueError, match="overlap_groups"):
        _config(prefetch=True, overlap_groups=0)
    config = _config(prefetch=True, overlap_groups=3)
    with pytest.raises(ValueError, match="overlap_groups=3 must divide the batch of 4 streams"):
        testing.trace_decode("dsa", config, weights_for("dsa", config), len(LENGTHS), "hisparse", 2)


# The sparse attention kernel's domain (tests/models/test_dsa.py's KERNEL_SHAPED): its groups read
# the hot buffer through the [L * G, b / G, ...] view by layer index.
KERNEL_SHAPED = dict(n_heads=64, qk_nope_dim=16, qk_rope_dim=64, v_head_dim=16, kv_lora_rank=512, dtype="bfloat16",
                     max_context=1024, top_k=512, hot_slots=520, prefill_chunk=64)


@pytest.mark.gpu
def test_overlap_groups_with_the_attention_kernel_give_the_same_bits():
    config = lambda **o: _config(**KERNEL_SHAPED, attention_implementation="ffi", prefetch=True, **o)
    whole, split = _run(config()), _run(config(overlap_groups=2))
    testing.assert_runs_equal(split, whole)
    _assert_same_state(split.state, whole.state)
    testing.assert_runs_equal(split, _run(_config(**KERNEL_SHAPED, attention_implementation="ffi"), "device"))


@pytest.mark.gpu
def test_overlap_program_with_the_attention_kernel():
    # The kernel reads the hot buffer through the group view: a bitcast, never a copy.
    config = _config(**KERNEL_SHAPED, attention_implementation="ffi", prefetch=True, overlap_groups=2)
    _assert_hot_not_copied(testing.assert_clean_decode_program("dsa", config, weights_for("dsa", config),
                                                               len(LENGTHS), 8), config, 2)


@pytest.mark.gpu
def test_overlap_needs_the_attention_kernel_on_gpu():
    # An H200 run failed the bit-equality at G = 2 and 4 with XLA's attention (its batched dots
    # need not be batch invariant there): the groups refuse it, naming why the kernel cannot run.
    config = _config(prefetch=True, overlap_groups=2)
    with pytest.raises(ValueError, match="needs the sparse attention kernel.*latent"):
        testing.trace_decode("dsa", config, weights_for("dsa", config), len(LENGTHS), "hisparse", 2)

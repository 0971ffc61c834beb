"""hisparse_jax.testing on the three shipped families at tiny sizes, and each helper failing on a
family broken on purpose: a helper that cannot fail proves nothing.

- a decode whose "hisparse" (or "dense") path is off by one ulp in one logit fails the bitwise
  helpers, with a message naming the step, stream and vocab entry;
- a step that copies the weights fails the program check, and so do a step that resolves twice
  and one that merges the input projections itself (kit.inputs) instead of reading them merged;
- bad arguments (not a family, steps < 1, a mode the family lacks, RESOLVE without its custom
  call) are one-line errors naming the argument.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import gpu_attention_may_differ

import hisparse_jax
from hisparse_jax import hlo, targets, testing
from hisparse_jax.kit import inputs as kit_inputs
from hisparse_jax.models import get_family

STEPS = 8
# Per family: tiny-preset overrides (k < B: LRU evicts every step; the fewest layers that run every
# kind of layer) and ragged prompt lengths with several sealed records each. NSA and Quest hold 32
# records of 16 tokens: no small buffer (the open page) then has the type of a record-indexed one
# (page bounds), which the copy check would take for a copy of it.
SETUPS = {
    "dsa": (dict(num_layers=1, top_k=8, hot_slots=10, max_context=128), (37, 20, 5)),
    "nsa": (dict(num_layers=1, top_k=3, hot_slots=5, max_context=512), (170, 101, 37)),
    "quest": (dict(num_layers=2, dense_layers=1, top_k=4, hot_slots=6, max_context=512), (170, 101, 37)),
}


def _setup(name):
    overrides, lengths = SETUPS[name]
    family = get_family(name)
    config = family.Config.tiny(**overrides)
    prompts = np.random.default_rng(0).integers(0, config.vocab, (len(lengths), max(lengths)), dtype=np.int32)
    return config, family.init_weights(config, 0), prompts, np.asarray(lengths, np.int32)


needs_ffi = pytest.mark.skipif(not hisparse_jax.has_ffi(), reason="no RESOLVE handler on this backend")


# --------------------------------------------------------------------------- the shipped families pass


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_hisparse_matches_device_on_the_shipped_families(name):
    config, weights, prompts, lengths = _setup(name)
    hisparse, device = testing.assert_hisparse_matches_device(name, config, weights, prompts, lengths, STEPS)
    assert hisparse.misses.sum() > 0 and not device.misses.any(), "nothing was fetched: the check proved nothing"
    assert hisparse.tokens.shape == (STEPS, len(lengths))


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_dense_matches_selecting_every_record_on_the_shipped_families(name):
    if gpu_attention_may_differ(name):
        pytest.skip("XLA's attention on a GPU may sum the dense read and the gathered records in other orders: a CPU check (docs/testing.md)")
    config, weights, prompts, lengths = _setup(name)
    dense, selecting = testing.assert_dense_matches_selecting_every_record(get_family(name), config, weights,
                                                                           prompts, lengths, STEPS)
    assert selecting.state.store.mode == "hisparse" and dense.state.store.mode == "dense"


@needs_ffi
@pytest.mark.parametrize("name", sorted(SETUPS))
def test_clean_decode_program_on_the_shipped_families(name):
    config, weights, _, lengths = _setup(name)
    program = testing.assert_clean_decode_program(name, config, weights, batch=len(lengths), steps=STEPS)
    assert program.entry is not None


# --------------------------------------------------------------------------- broken families fail


def _variant(name: str, why: str, decode_step=None, init_state=None):
    """The shipped family `name` with its decode_step and/or init_state replaced."""
    base = get_family(name)
    return dataclasses.replace(base, name=f"{name} {why}", decode_step=decode_step or base.decode_step,
                               init_state=init_state or base.init_state)


def _off_by_one_ulp(name: str, mode: str):
    """A family whose `mode` decode raises one logit (stream 1, entry 5) by one ulp every step."""
    base = get_family(name)

    def decode_step(config, weights, state, tokens, *args, **kwargs):
        out = base.decode_step(config, weights, state, tokens, *args, **kwargs)
        if state.store.mode != mode:
            return out
        logits = out.logits.at[1, 5].set(jnp.nextafter(out.logits[1, 5], jnp.inf))
        return dataclasses.replace(out, logits=logits)

    return _variant(name, f"off by one ulp in {mode}", decode_step)


def test_one_ulp_in_hisparse_fails_with_where():
    config, weights, prompts, lengths = _setup("dsa")
    broken = _off_by_one_ulp("dsa", "hisparse")
    with pytest.raises(AssertionError, match=r"^hisparse vs device: logits differ first at step 0, stream 1, "
                                             r"vocab entry 5 \(8 of \d+ elements differ\)") as raised:
        testing.assert_hisparse_matches_device(broken, config, weights, prompts, lengths, STEPS)
    assert "\n" not in str(raised.value)


def test_one_ulp_in_dense_fails_with_where():
    config, weights, prompts, lengths = _setup("dsa")
    broken = _off_by_one_ulp("dsa", "dense")
    with pytest.raises(AssertionError, match=r"^dense vs every-record selection: logits differ first at step 0, "
                                             r"stream 1, vocab entry 5"):
        testing.assert_dense_matches_selecting_every_record(broken, config, weights, prompts, lengths, STEPS)


def test_differing_tokens_and_prefill_are_located():
    run = testing.Run(np.zeros((2, 4), np.float32), np.zeros((3, 2), np.int32), np.zeros((3, 2, 4), np.float32),
                      np.zeros((3, 1, 2), np.int32), None)
    tokens = run.tokens.copy()
    tokens[2, 1] = 7
    with pytest.raises(AssertionError, match=r"tokens differ first at step 2, stream 1 .*: 0 vs 7"):
        testing.assert_runs_equal(run, dataclasses.replace(run, tokens=tokens))
    negative_zero = np.full((2, 4), -0.0, np.float32)  # equal as floats, not as bits
    with pytest.raises(AssertionError, match=r"prefill logits differ first at stream 0, vocab entry 0"):
        testing.assert_runs_equal(run, dataclasses.replace(run, prefill_logits=negative_zero))
    testing.assert_runs_equal(run, run)


def _copies_its_weights(name: str):
    """A family whose step multiplies every weight matrix by a token-dependent 1 (behind an
    optimization barrier, so XLA must materialize it): the same bits, and a weight copy per step."""
    base = get_family(name)

    def decode_step(config, weights, state, tokens, *args, **kwargs):
        one = jnp.where(tokens[0] >= 0, 1.0, 2.0)
        weights = jax.tree.map(lambda w: jax.lax.optimization_barrier(w * one.astype(w.dtype))
                               if w.ndim >= 2 and jnp.issubdtype(w.dtype, jnp.floating) else w, weights)
        return base.decode_step(config, weights, state, tokens, *args, **kwargs)

    return _variant(name, "copying its weights", decode_step)


@needs_ffi
def test_a_weight_copy_fails_the_program_check():
    config, weights, _, _ = _setup("dsa")
    with pytest.raises(AssertionError, match=r"^hisparse decode program: \d+ weight-, key- or KV-sized arrays "
                                             r"produced in the step \(each a copy\), first \S+ = f32\["):
        testing.assert_clean_decode_program(_copies_its_weights("dsa"), config, weights, steps=STEPS)


def _merges_its_inputs_every_step(name: str):
    """A family whose step concatenates each layer's input projections itself (kit.inputs.merge
    inside the step instead of once at load): the same math, a copy of those weights per call."""
    base = get_family(name)

    def decode_step(config, weights, state, tokens, *args, **kwargs):
        return base.decode_step(config, kit_inputs.merge(config, weights), state, tokens, *args, **kwargs)

    return _variant(name, "merging its input projections in the step", decode_step)


def test_merging_the_inputs_in_the_step_fails_the_program_check():
    """The merged layout's matrices count as weights even when the weights given are apart: a
    step that builds them is caught (one layer and two steps: a short compile)."""
    config, weights, _, _ = _setup("dsa")
    # 220 columns: w_q 4 x 24, w_kv 32 + 8, the indexer's w_q 4 x 16, w_k 16, w_head 4
    with pytest.raises(AssertionError, match=r"^device decode program: \d+ weight-, key- or KV-sized arrays "
                                             r"produced in the step \(each a copy\), .* = f32\[64,220\]\S* concatenate"):
        testing.assert_no_big_copies(_merges_its_inputs_every_step("dsa"), config, weights, "device", steps=2)


@needs_ffi
def test_resolving_twice_fails_the_program_check():
    base = get_family("dsa")

    def decode_step(config, weights, state, tokens, *args, **kwargs):
        first = base.decode_step(config, weights, state, tokens, *args, **kwargs)
        return base.decode_step(config, weights, first.state, tokens, *args, **kwargs)

    config, weights, _, _ = _setup("dsa")
    with pytest.raises(AssertionError, match=r"hisparse_resolve: expected one call per sparse layer \(1\) per step"):
        testing.assert_clean_decode_program(_variant("dsa", "resolving twice", decode_step), config, weights,
                                            steps=STEPS)


@needs_ffi
def test_a_pool_off_host_or_copied_fails_the_pool_check():
    """The compiled program's text edited two ways: the pool's layout without S(5), and the pool
    copied on its way to RESOLVE; each edit must fail the check that passes on the original."""
    config, weights, _, lengths = _setup("dsa")
    text = testing.trace_decode("dsa", config, weights, len(lengths)).lower().compile().as_text()
    testing.assert_host_pool_stays_pinned(hlo.parse(text), config, len(lengths))
    with pytest.raises(AssertionError, match=r"^the pool f32\[.*\] is not an S\(5\) \(pinned host\) parameter"):
        testing.assert_host_pool_stays_pinned(hlo.parse(text.replace(":S(5)}", "}")), config, len(lengths))
    program = hlo.parse(text)
    resolve = next(i for i in program.instructions.values() if i.target == targets.RESOLVE)
    pool = program.instructions[resolve.operands[0]]
    copied = resolve.line.replace(f"%{pool.name}", "%pool.copy", 1)
    copy = f"  %pool.copy = {pool.shape} copy(%{pool.name})"
    edited = text.replace(resolve.line, f"{copy}\n{copied}", 1)
    with pytest.raises(AssertionError, match=r"^pool.copy = copy produces a pool-shaped array: a copy of the pool"):
        testing.assert_host_pool_stays_pinned(hlo.parse(edited), config, len(lengths))


# --------------------------------------------------------------------------- bad arguments


def test_bad_arguments_name_the_argument():
    config, weights, prompts, lengths = _setup("dsa")
    check = testing.assert_hisparse_matches_device
    with pytest.raises(TypeError, match=r"^family: expected a hisparse_jax.models.Family or a family name"):
        check(42, config, weights, prompts, lengths, STEPS)
    with pytest.raises(ValueError, match=r"^family: unknown model family 'llama'"):
        check("llama", config, weights, prompts, lengths, STEPS)
    for steps in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"^steps: .* int >= 1"):
            check("dsa", config, weights, prompts, lengths, steps)
    with pytest.raises(ValueError, match=r"^prompts: expected token ids \[batch, T\]"):
        check("dsa", config, weights, prompts[0], lengths, STEPS)
    with pytest.raises(ValueError, match=r"^lengths: expected \[batch\] = \[3\]"):
        check("dsa", config, weights, prompts, lengths[:2], STEPS)
    with pytest.raises(TypeError, match=r"^config: a Config, expected nsa's Config"):
        check("nsa", config, weights, prompts, lengths, STEPS)
    with pytest.raises(ValueError, match=r"^mode: expected one of"):
        testing.run_decode("dsa", config, weights, "paged", prompts, lengths, STEPS)


def test_a_mode_the_family_lacks_names_the_mode():
    base = get_family("dsa")

    def init_state(config, batch, mode):
        if mode == "dense":
            raise NotImplementedError("no dense attention here")
        return base.init_state(config, batch, mode)

    config, weights, prompts, lengths = _setup("dsa")
    with pytest.raises(ValueError, match=r"^mode: family dsa without dense's init_state refused mode 'dense' "
                                         r"\(no dense attention here\)"):
        testing.assert_dense_matches_selecting_every_record(_variant("dsa", "without dense", init_state=init_state),
                                                            config, weights, prompts, lengths, STEPS)


def test_the_program_check_needs_the_resolve_custom_call():
    config, weights, _, _ = _setup("dsa")
    with pytest.raises(ValueError, match=r"^config: implementation='reference' runs RESOLVE as its JAX reference"):
        testing.assert_clean_decode_program("dsa", dataclasses.replace(config, implementation="reference"), weights)

"""Training the DSA model (hisparse_jax.train): the loss goes down on a tiny run, the training
forward is the decode model's, the sparse phase is the decode's selection rule, checkpoints and
recorded traces round-trip, and the command line refuses bad arguments in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.models import dsa
from hisparse_jax.selection.recorded import load_trace
from hisparse_jax.train import __main__ as train_cli
from hisparse_jax.train import fit as fit_lib
from hisparse_jax.train.checkpoint import load_model, save_model
from hisparse_jax.train.corpus import Corpus, WindowSampler
from hisparse_jax.train.forward import check_trainable, forward, forward_loss
from hisparse_jax.train.record import record_trace

import stdlib_text


@pytest.fixture(scope="module")
def corpus(text_root) -> Corpus:
    # Everything long is held out with probability 1/2: the recorder needs a long held-out document.
    return Corpus.from_roots([text_root], held_out_fraction=0.2, long_tokens=40000, long_fraction=0.5)


def corpus_windows(corpus: Corpus, batch: int, length: int) -> WindowSampler:
    """Held-out windows [batch, length], seeded."""
    return WindowSampler(Corpus.packed(corpus.held_out), batch, length, seed=0)


# The forward jitted, as fit runs it: one compile per (config, sparse) instead of an eager
# op-by-op forward (per-op dispatch and compiles made these tests 10-18 s each on XLA:CPU).
jit_forward = jax.jit(forward, static_argnames=("config", "sparse", "chunk", "measure"))
jit_forward_loss = jax.jit(forward_loss, static_argnames=("config", "sparse", "chunk", "measure"))


def _tiny_plan(**changes) -> fit_lib.TrainPlan:
    return dataclasses.replace(fit_lib.PLANS["tiny"], **changes)


@pytest.fixture(scope="module")
def trained(corpus):
    config = fit_lib.model_config("tiny")
    weights, history, summary = fit_lib.fit(config, _tiny_plan(log_every=1), corpus, log=lambda m: None)
    return config, weights, history, summary


def test_tiny_training_reduces_the_loss(trained):
    _, _, history, summary = trained
    first, last = history[0]["lm"], np.mean([h["lm"] for h in history[-5:]])
    assert last < first - 0.5, (first, last)  # from ~ln(256) = 5.5 nats per byte
    phases = summary["phases"]
    assert [p["name"] for p in phases] == ["pretrain", "dense warm-up", "sparse"]
    assert all(p["steps_run"] == p["steps"] for p in phases)
    # held-out loss improves from phase to phase, with either attention
    held = [p["evaluation"]["dense"]["lm"] for p in phases]
    assert held[-1] < held[0]
    assert all(np.isfinite(p["evaluation"]["sparse"]["kl"]).all() for p in phases)


def test_sparse_attention_with_every_key_selected_is_dense(corpus):
    """With top_k >= T the sparse rule selects every sealed key: the same attention and KL bits."""
    config = fit_lib.model_config("tiny", top_k=64, hot_slots=64)
    weights = dsa.init_weights(config, 3)
    tokens = jnp.asarray(next(iter(corpus_windows(corpus, 2, 65))))
    dense = jit_forward_loss(config, weights, tokens, sparse=False, chunk=32)
    sparse = jit_forward_loss(config, weights, tokens, sparse=True, chunk=32)
    assert np.array_equal(np.asarray(dense[0]), np.asarray(sparse[0]))
    assert np.array_equal(np.asarray(dense[1]["kl"]), np.asarray(sparse[1]["kl"]))


def test_sparse_attention_depends_on_the_selection(corpus):
    config = fit_lib.model_config("tiny")  # top_k 16 of 64 keys
    weights = dsa.init_weights(config, 3)
    tokens = jnp.asarray(next(iter(corpus_windows(corpus, 2, 65))))
    dense, _ = jit_forward(config, weights, tokens[:, :-1], sparse=False, chunk=32)
    sparse, _ = jit_forward(config, weights, tokens[:, :-1], sparse=True, chunk=32)
    d, s = np.asarray(dense), np.asarray(sparse)
    # positions 0..16 have at most 16 sealed keys: all selected, the same logits; later ones differ
    np.testing.assert_allclose(d[:, :17], s[:, :17], rtol=1e-5, atol=1e-5)
    assert np.abs(d[:, 17:] - s[:, 17:]).max() > 1e-3


def test_training_forward_is_the_decode_model(corpus):
    """Teacher-forced decoding from a one-token prompt is the sparse training forward, position by
    position: the same weights, records, indexer and top-k rule (float tolerance: the decode's
    indexer and attention order their sums differently)."""
    config = fit_lib.model_config("tiny", max_context=64, prefill_chunk=32)
    weights = dsa.init_weights(config, 5)
    tokens = np.asarray(next(iter(corpus_windows(corpus, 2, 64))))
    expected, _ = jit_forward(config, weights, jnp.asarray(tokens), sparse=True, chunk=32)
    state = dsa.init_state(config, 2, "device")
    state, first_logits = decode.prefill(dsa, config, weights, state, jnp.asarray(tokens[:, :1]),
                                         jnp.ones((2,), jnp.int32))
    steps = tokens.shape[1] - 1
    teacher = jnp.asarray(np.concatenate([tokens[:, 2:], tokens[:, -1:]], axis=1).T)  # fed after step i
    logits = decode.generate(dsa, config, weights, state, jnp.asarray(tokens[:, 1]), steps,
                             return_logits=True, teacher_tokens=teacher).logits
    got = np.concatenate([np.asarray(first_logits)[:, None], np.moveaxis(np.asarray(logits), 0, 1)], axis=1)
    np.testing.assert_allclose(got, np.asarray(expected), rtol=2e-4, atol=2e-4)


def test_checkpoint_round_trips(trained, tmp_path):
    config, weights, _, _ = trained
    save_model(tmp_path / "m.npz", config, weights, dict(note="x"))
    loaded, back, meta = load_model(tmp_path / "m.npz", max_context=512, hot_slots=64)
    assert meta == dict(note="x") and loaded.max_context == 512 and loaded.d_model == config.d_model
    for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(back)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="d_model change the weights"):
        load_model(tmp_path / "m.npz", d_model=32)
    with pytest.raises(ValueError, match="no such file"):
        load_model(tmp_path / "missing.npz")


def test_bfloat16_checkpoint_round_trips(tmp_path):
    config = fit_lib.model_config("tiny", dtype="bfloat16")
    weights = dsa.init_weights(config, 1)
    save_model(tmp_path / "m.npz", config, weights)
    _, back, _ = load_model(tmp_path / "m.npz")
    for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(back)):
        assert b.dtype == jnp.bfloat16 and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_recorded_trace_is_what_generate_selected(trained, corpus, tmp_path):
    config, weights, _, _ = trained
    save_model(tmp_path / "m.npz", config, weights)
    trace = record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=100, steps=12)
    assert trace.ids.shape == (12, config.num_layers, 1, config.top_k)
    assert np.array_equal(trace.sealed[:, 0], 100 + np.arange(12))
    assert (trace.ids >= 0).all()  # 100 sealed records >= k: every row full
    assert np.isfinite(trace.source["decode_loss_nats_per_byte"])
    doc = corpus.long_documents(113)[0]
    assert trace.source["documents"] == [dict(name=doc.name, tokens=int(doc.tokens.size))]
    # the same decode, eagerly: the ids generate recorded are the model's own top-k at each step
    loaded, w, _ = load_model(tmp_path / "m.npz", max_context=trace.source["steps"] + 128)
    state = dsa.init_state(loaded, 1, "hisparse")
    text = doc.tokens[:113].astype(np.int32)[None]
    state, _ = decode.prefill(dsa, loaded, w, state, jnp.asarray(text[:, :100]), jnp.asarray([100], jnp.int32))
    ids = decode.generate(dsa, loaded, w, state, jnp.asarray(text[:, 100]), 12, record_selection=True,
                          teacher_tokens=jnp.asarray(text[:, 101:].T)).selections
    assert np.array_equal(np.asarray(ids), trace.ids)


def test_record_refuses_what_it_cannot_decode(trained, corpus, tmp_path):
    config, weights, _, _ = trained
    save_model(tmp_path / "m.npz", config, weights)
    with pytest.raises(ValueError, match="held-out documents have"):
        record_trace(tmp_path / "m.npz", corpus, documents=50, prefill=100, steps=12)
    with pytest.raises(ValueError, match="fewer records than top_k"):
        record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=8, steps=12)
    with pytest.raises(ValueError, match=r"steps must be an int in \[1, 2\^30\]"):
        record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=100, steps=0)


def test_record_takes_a_top_k_above_the_models_hot_slots(trained, corpus, tmp_path):
    """--top-k 48 on the tiny model (hot_slots 32) was refused as the checkpoint's fault, advising
    'raise hot_slots' (a flag record does not have): record raises the decode's hot slots itself."""
    config, weights, _, _ = trained
    save_model(tmp_path / "m.npz", config, weights)
    trace = record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=100, steps=4, top_k=48)
    assert trace.k == 48 > config.hot_slots
    with pytest.raises(ValueError, match="record: prefill=40 tokens hold fewer records than top_k=48"):
        record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=40, steps=4, top_k=48)
    with pytest.raises(ValueError, match=r"record: top_k must be None or an int in \[1, 2\^30\], got 0"):
        record_trace(tmp_path / "m.npz", corpus, documents=1, prefill=40, steps=4, top_k=0)


def test_corpus_split_is_by_path_and_complete(text_root):
    a = Corpus.from_roots([text_root], held_out_fraction=0.3)
    b = Corpus.from_roots([text_root], held_out_fraction=0.3)
    assert [d.name for d in a.held_out] == [d.name for d in b.held_out]
    names = sorted(d.name for d in a.train + a.held_out)
    assert names == sorted(f"text/{n}" for n in stdlib_text.FILES)
    assert set(d.name for d in a.train).isdisjoint(d.name for d in a.held_out)


def test_corpus_refuses_an_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="no text files"):
        Corpus.from_roots([tmp_path])
    with pytest.raises(ValueError, match="is not a folder"):
        Corpus.from_roots([tmp_path / "missing"])


def test_training_refuses_shapes_it_does_not_train():
    with pytest.raises(ValueError, match="index_share=2"):
        check_trainable(fit_lib.model_config("tiny", index_share=2))
    with pytest.raises(ValueError, match="chunk=24 must divide"):
        _tiny_plan(chunk=24)
    with pytest.raises(ValueError, match="attention must be"):
        fit_lib.Phase("x", "local", steps=1, seq_len=32, batch=1)


def test_cli_fit_and_record(text_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli.main(["fit", "--model", "tiny", "--max-steps", "2", "--roots", str(text_root),
                           "--out", str(out)]) == 0
    meta = json.loads((out / "training.json").read_text())
    assert [p["steps_run"] for p in meta["summary"]["phases"]] == [2, 2, 2]
    # The default split holds text/dataclasses.py (58K tokens) out: a document to decode.
    assert train_cli.main(["record", "--checkpoint", str(out / "model.npz"), "--documents", "1", "--prefill", "64",
                           "--steps", "4", "--roots", str(text_root), "--out", str(tmp_path / "t.npz")]) == 0
    trace = load_trace(tmp_path / "t.npz")
    assert trace.ids.shape[:3] == (4, 2, 1)
    assert trace.source["documents"][0]["name"] == "text/dataclasses.py"
    assert trace.source["command"].startswith("python -m hisparse_jax.train record --checkpoint")
    assert "wrote" in capsys.readouterr().out


def test_record_names_the_baseline_full_kv_as_hisparse_bench_does():
    base = ["record", "--checkpoint", "m.npz", "--out", "t.npz"]
    assert train_cli.parser().parse_args(base).mode == "device"  # the library's decode mode: full-KV
    for given, mode in [("full-kv", "device"), ("device", "device"), ("hisparse", "hisparse")]:
        assert train_cli.parser().parse_args([*base, "--mode", given]).mode == mode


@pytest.mark.parametrize("argv, message", [
    (["fit", "--model", "huge", "--out", "x"], "invalid choice"),
    (["fit", "--model", "tiny", "--max-steps", "0", "--out", "x"],
     "argument --max-steps: expected an int in [1, 2^31 - 1]"),
    (["fit", "--model", "tiny", "--time-scale", "0", "--out", "x"],
     "argument --time-scale: expected a number in (0, 1e6]"),
    (["fit", "--model", "tiny", "--seed", "-1", "--out", "x"], "argument --seed: expected an int in [0, 2^31 - 1]"),
    (["record", "--checkpoint", "missing.npz", "--out", "x.npz", "--roots", "."], "no such file"),
    (["fit", "--out", "/dev/null/x"], "'/dev/null' is not a folder"),
    (["record", "--checkpoint", "m.npz", "--out", "/dev/null/t.npz"], "'/dev/null' is not a folder"),
    pytest.param(["fit", "--model", "trace-model", "--out", "x"], "XLA:CPU cannot train",
                 marks=pytest.mark.skipif(jax.default_backend() != "cpu", reason="a GPU trains bfloat16")),
    (["fit"], "required"),
    (["record", "--checkpoint", "m.npz", "--mode", "full", "--out", "t.npz"], "choose from full-kv, hisparse"),
])
def test_cli_bad_arguments_are_one_line(argv, message, capsys):
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("hisparse_jax.train: error:")

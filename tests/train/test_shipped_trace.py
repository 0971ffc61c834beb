"""The trained model and its recorded trace that ship in the repository: the trace is the model's,
its figures in BENCHMARKS.md come from it, and the weights are trained (they predict Python)."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hisparse_jax import decode
from hisparse_jax.selection import policies
from hisparse_jax.models import dsa
from hisparse_jax.selection.recorded import load_trace
from hisparse_jax.train.checkpoint import load_model
from hisparse_jax.train.record import next_token_loss

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-02-h200" / "trace-model"
pytestmark = pytest.mark.skipif(not (RESULTS / "trace.npz").is_file(), reason="the shipped trace is not in this tree")


@pytest.fixture(scope="module")
def trace():
    return load_trace(RESULTS / "trace.npz")


def test_the_trace_is_the_shipped_model_decoding_32k(trace):
    assert trace.ids.shape == (160, 6, 8, 2048) and trace.page_size == 1
    assert np.array_equal(trace.sealed, 32768 + np.arange(160)[:, None].repeat(8, 1))
    assert (trace.ids >= 0).all()  # 32K sealed records: every selection full
    digest = hashlib.sha256((RESULTS / "model.npz").read_bytes()).hexdigest()[:16]
    assert trace.source["model_sha256"] == digest
    assert len(trace.source["documents"]) == 8 and min(d["tokens"] for d in trace.source["documents"]) > 32768 + 160


def test_benchmarks_lru_figure_is_this_trace(trace):
    """BENCHMARKS.md: LRU misses 17.3% at B/k = 2 from step 40 on (2,043,748 of 11,796,480 ids)."""
    ids = trace.ids.reshape(trace.steps, trace.layers * trace.streams, trace.k)
    misses = policies.simulate(ids, 4096, "lru")
    assert int(misses[40:].sum()) == 2043748 and int((ids[40:] >= 0).sum()) == 11796480


def test_the_shipped_weights_predict_python(capsys):
    """Loaded in float32 (XLA:CPU has no bf16 dot), teacher-forced on a standard-library module:
    far below the 5.5 nats per byte of an untrained byte model. Saved before checkpoints carried
    a hash, its content is verified against checkpoint.KNOWN_UNHASHED: no warning."""
    config, weights, meta = load_model(RESULTS / "model.npz", dtype="float32", top_k=128, hot_slots=128,
                                       max_context=1024)
    assert capsys.readouterr().err == ""
    assert meta["model"] == "trace-model" and config.index_rope_dim == 32
    text = np.frombuffer((Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_bytes()[:1024 - 1],
                         np.uint8).astype(np.int32)[None]
    prompt, steps = 768, 1024 - 1 - 768 - 1
    state = dsa.init_state(config, 1, "device")
    state, _ = decode.prefill(dsa, config, weights, state, jnp.asarray(text[:, :prompt]), jnp.asarray([prompt]))
    teacher = jnp.asarray(text[:, prompt + 1 : prompt + 1 + steps].T)
    logits = decode.generate(dsa, config, weights, state, jnp.asarray(text[:, prompt]), steps,
                             return_logits=True, teacher_tokens=teacher).logits
    loss = next_token_loss(logits, teacher)
    assert loss < 2.0, loss

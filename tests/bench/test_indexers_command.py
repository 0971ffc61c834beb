"""`hisparse-bench indexers` refuses what it cannot compare in one line, before any training (the
whole pipeline runs in tests/kit/test_example_pipeline.py)."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest

from hisparse_jax import kit
from hisparse_jax.bench import cli, indexers_report
from hisparse_jax.bench.decode.plan import build_plan
from hisparse_jax.bench.deployments import get_deployment


@pytest.mark.parametrize("argv, message", [
    (["--roots", "/no/such/folder"], "argument --roots: corpus: '/no/such/folder' is not a folder"),
    (["--indexer", "no_such_module_xyz:X"], "argument --indexer: --indexer 'no_such_module_xyz:X': no module named"),
    (["--indexer", "hisparse_jax.kit.page_minmax:NOPE"], "has no name 'NOPE'"),
    (["--checkpoint", "missing.npz"], "argument --checkpoint: checkpoint 'missing.npz': no such file"),
    (["--checkpoint", "=x.py:Y"], "expected PATH or PATH=MODULE:NAME"),
    (["--indexer", "dsa", "--out", "/dev/null/x"], "'/dev/null' is not a folder"),
    (["--indexer", "dsa", "--ratios", "0.5"], "ratio"),
    # Bounded and distinct lists (--ratios 1e12 was a MemoryError after the whole evaluation).
    (["--indexer", "dsa", "--ratios", "1e12"], "argument --ratios: B/k = 1e12 exceeds 16384"),
    (["--indexer", "dsa", "--ratios", "2", "2.0"], "argument --ratios: 2 given more than once"),
    (["--indexer", "dsa", "--policies", "lru", "lru"], "argument --policies: lru given more than once"),
    (["--indexer", "dsa", "--contexts", "512", "512"], "argument --contexts: 512 given more than once"),
    (["--indexer", "dsa", "--slice-contexts", "512", "512"], "argument --slice-contexts: 512 given more than once"),
    (["--indexer", "dsa", "--prefill", "99999999999999999999"],
     "argument --prefill: 99999999999999999999 exceeds 1073741824 (positions and record ids are int32)"),
    (["--indexer", "dsa", "--steps", "99999999999"], "argument --steps: 99999999999 exceeds 1073741824"),
    (["--indexer", "dsa", "--out", ""], "--out: an empty path; give a folder"),
    pytest.param(["--indexer", "dsa", "--model", "trace-model"], "XLA:CPU cannot train",
                 marks=pytest.mark.skipif(jax.default_backend() != "cpu", reason="a GPU trains bfloat16")),
])
def test_a_bad_comparison_is_one_line(argv, message, tmp_path, capsys):
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert cli.main(["indexers", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("hisparse-bench: error:"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--prefill", "8"], "argument --prefill: 8 is below DSA's top_k = 16 (the prefill must hold k records"),
    (["--prefill", "1073741824", "--steps", "8"],
     "argument --steps: --prefill 1073741824 + --steps 8 tokens exceed 1073741824"),
    (["--documents", "100000"], "held-out documents have 641 tokens (--prefill 512 + --steps 128 + 1), 100000 asked "
                                "for; lower --documents, --prefill or --steps"),
])
def test_a_trace_that_cannot_be_recorded_is_refused_before_training(argv, message, text_root, tmp_path, capsys,
                                                                     monkeypatch):
    """What `record` refused after the training and the held-out evaluation (exit 1), refused
    before them (exit 2): the corpus is read, nothing trained."""
    from hisparse_jax.bench import indexers
    monkeypatch.setattr(indexers, "_train", lambda *a: pytest.fail("trained before checking the recording"))
    assert cli.main(["indexers", "--indexer", "dsa", "--roots", str(text_root), *argv,
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("hisparse-bench: error: argument --"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--family", "nsa", "--indexer", "hisparse_jax.kit.page_minmax:PageMinMax"], "--family nsa: --indexer"),
    (["--indexer", "no_such_module_xyz:X"], "argument --indexer: --indexer 'no_such_module_xyz:X': no module named"),
])
def test_decode_refuses_a_bad_indexer_in_one_line(argv, message, tmp_path, capsys):
    assert cli.main(["decode", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_deployment_slice_takes_an_indexer_and_keeps_its_mla_shapes(capsys):
    """The slice's family replaced by the kit's model with the example indexer: the slice's MLA
    fields kept, DSA's lightning fields dropped, the indexer's keys in the byte account."""
    example = Path(__file__).resolve().parents[2] / "examples" / "my_indexer.py"
    argv = ["decode", "--deployment", "glm5-h200", "--indexer", f"{example}:INDEXER", "--contexts", "32768", "--explain"]
    plan = build_plan(cli.parser().parse_args(argv))
    config, dsa_slice = plan.contexts[0].config, get_deployment("glm5-h200").derive().overrides
    assert isinstance(config, kit.Config) and type(config.indexer).__name__ == "DotIndexer"
    assert (config.n_heads, config.kv_lora_rank, config.top_k) == (dsa_slice["n_heads"], dsa_slice["kv_lora_rank"],
                                                                    dsa_slice["top_k"])
    metadata = plan.contexts[0].caps["hisparse"].device_per_request_by_category["indexer metadata"]
    assert metadata == config.num_layers * config.max_context * 8 * 2  # dim 8 bf16 keys per token and layer
    assert cli.main(argv) == 0 and "context 32768: hisparse batch" in capsys.readouterr().out


def _entry(label: str, deployment) -> dict:
    rates = {p: [0.5, 0.25, 0.125, 0.0625] for p in ("lru", "belady")}
    by_context = {"32768": dict(hisparse=2 << 20, full_kv=12 << 20, hisparse_by_category={"indexer metadata": 1 << 20})}
    return dict(label=label, top_k=16, parameters=2048, deployment=deployment,
                held_out=dict(dense_lm=3.1, sparse_lm=3.2, sparse_minus_dense=0.1, kl_dense=0.3, kl_sparse=0.2,
                              captured=0.5),
                misses=dict(ratios=[1.0, 2.0, 3.0, 4.0], miss_rate=rates, step_overlap=[0.2, None],
                            layer_overlap=[0.1], warm=8, steps=32, streams=2, trace=dict(prefill=512)),
                bytes_per_request=by_context)


def test_the_report_shows_a_slice_measured_and_a_slice_refused():
    """The GPU-only slice rows (a CPU never measures them) and a refusal in its row."""
    measured = dict(slice="glm5-h200", rows=[dict(context=131072, full_kv_batch=2, hisparse_batch=75,
                                                  throughput_ratio=3.5)])
    refused = dict(slice="glm5-h200", error="batch 1 does not fit", rows=[])
    report = dict(device="NVIDIA H200", contexts=[32768], ratios=[1.0, 2.0, 3.0, 4.0], policies=["lru", "belady"],
                  indexers=[_entry("A", measured), _entry("B", refused)])
    text = indexers_report.format_report(report)
    assert "| A | glm5-h200 | 131072 | 2 | 75 | 3.50 |" in text
    assert "| B | glm5-h200 | not measured: batch 1 does not fit |" in text
    assert "| A | lru | 50.0% | 25.0% | 12.5% | 6.2% | 0.200 | 0.100 |" in text
    assert "| A | 16 | 3.1000 | 3.2000 | +0.1000 | 0.3000 | 0.2000 | 50.0% | 2,048 |" in text

"""The worked example of docs/research.md, at tiny size on a CPU: an indexer in a file outside the
package (examples/my_indexer.py) goes through training, recording, the policy lab, the capacity
benchmark, the comparison command and hisparse_jax.testing's checks, by the commands a
researcher types, with nothing inside hisparse_jax naming it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hisparse_jax import kit, testing
from hisparse_jax.bench import cli
from hisparse_jax.selection.recorded import load_trace
from hisparse_jax.train import __main__ as train_cli
from hisparse_jax.train.checkpoint import load_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_indexer.py"
SPEC = f"{EXAMPLE}:INDEXER"
# text_root (tests/conftest.py): the default split holds text/dataclasses.py (58K tokens) out, a
# document long enough to record.


def test_the_example_is_a_small_file_outside_the_package():
    assert EXAMPLE.is_file() and len(EXAMPLE.read_text().splitlines()) < 60
    assert "hisparse_jax" not in EXAMPLE.parent.parts
    assert not any("DotIndexer" in p.read_text() for p in (ROOT / "hisparse_jax").rglob("*.py"))
    assert EXAMPLE.read_text().strip() in (ROOT / "docs" / "research.md").read_text()  # the page shows this file


@pytest.fixture(scope="module")
def trained(text_root, tmp_path_factory) -> Path:
    """python -m hisparse_jax.train fit --indexer examples/my_indexer.py:INDEXER (2 steps a phase)."""
    out = tmp_path_factory.mktemp("train")
    assert train_cli.main(["fit", "--indexer", SPEC, "--max-steps", "2", "--roots", str(text_root),
                           "--out", str(out)]) == 0
    return out


def test_train_record_and_replay_it(trained, text_root, tmp_path, capsys):
    meta = json.loads((trained / "training.json").read_text())
    assert meta["indexer"]["class_name"] == "DotIndexer" and [p["steps_run"] for p in meta["summary"]["phases"]] == [2] * 3
    argv = ["record", "--checkpoint", str(trained / "model.npz"), "--documents", "1", "--prefill", "64", "--steps", "16",
            "--roots", str(text_root), "--out", str(tmp_path / "trace.npz")]
    assert train_cli.main(argv) == 2  # a checkpoint does not import the researcher's code by itself
    assert f"pass --indexer {EXAMPLE}:DotIndexer" in capsys.readouterr().err
    assert train_cli.main([*argv, "--indexer", SPEC]) == 0
    trace = load_trace(tmp_path / "trace.npz")
    assert trace.ids.shape[:3] == (16, 2, 1) and trace.source["indexer"]["fields"] == dict(dim=8)
    assert cli.main(["policies", "--trace-file", str(tmp_path / "trace.npz"), "--ratios", "1", "2", "--no-plots",
                     "--out", str(tmp_path / "policies")]) == 0
    replay = json.loads((tmp_path / "policies" / "policies.json").read_text())["traces"][0]
    assert replay["miss_rate"]["lru"][0] > replay["miss_rate"]["lru"][1] > 0  # a larger buffer misses less


def test_the_capacity_benchmark_runs_it(tmp_path):
    assert cli.main(["decode", "--indexer", SPEC, "--contexts", "256", "--steps", "2", "--reps", "2",
                     "--no-equal-batch", "--no-plots", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "decode.json").read_text())
    assert report["family"] == "DotIndexer"
    caps = {r["mode"]: r for r in report["rows"]}
    assert caps["hisparse"]["batch"] >= 1 and caps["device"]["batch"] >= 1
    assert report["ratios"][0]["device_bytes_per_request_full_kv_over_hisparse"] > 1


def test_hisparse_is_exact_and_clean_with_it(trained):
    config, weights, _ = load_model(trained / "model.npz", indexer=SPEC, max_context=64, top_k=4, hot_slots=6)
    family = kit.family(config.indexer)
    prompts = np.random.default_rng(0).integers(0, config.vocab, (3, 40), dtype=np.int32)
    lengths = np.array([40, 23, 9], np.int32)
    hisparse, _ = testing.assert_hisparse_matches_device(family, config, weights, prompts, lengths, steps=8)
    assert hisparse.misses.sum() > 0  # records were fetched: the cache worked
    testing.assert_dense_matches_selecting_every_record(family, config, weights, prompts, lengths, steps=8)
    testing.assert_clean_decode_program(family, config, weights, batch=3, steps=8)


def test_the_comparison_command_measures_it(trained, text_root, tmp_path):
    assert cli.main(["indexers", "--checkpoint", f"{trained / 'model.npz'}={SPEC}", "--roots", str(text_root),
                     "--documents", "1", "--prefill", "64", "--steps", "16", "--contexts", "32768",
                     "--policies", "lru", "belady", "--no-plots", "--out", str(tmp_path)]) == 0
    (entry,) = json.loads((tmp_path / "indexers.json").read_text())["indexers"]
    held = entry["held_out"]
    assert entry["label"] == "DotIndexer" and np.isfinite([held["dense_lm"], held["sparse_lm"], held["kl_dense"]]).all()
    assert 0 < held["captured"] < 1
    assert len(entry["misses"]["miss_rate"]["lru"]) == 4  # B/k = 1, 2, 3, 4
    per_token = entry["bytes_per_request"]["32768"]["hisparse_by_category"]["indexer metadata"] / 32768
    assert per_token == 2 * 8 * 4  # 2 layers x dim 8 x float32: the example's own declaration

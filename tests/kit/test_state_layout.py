"""The indexer's metadata, declared once through hisparse_jax.layout, is counted (the byte
account: tests/kit/test_page_minmax.py), filled (the benchmarks' synthetic state) and sharded
(hisparse_jax.sharding) by the library, with nothing written for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import hisparse_jax
from hisparse_jax import kit
from hisparse_jax.bench.decode import synthetic

WORKER = Path(__file__).with_name("kit_sharding_worker.py")


def test_the_synthetic_fill_fills_the_metadata():
    family = kit.family(kit.PageMinMax(page=8, dim=16, heads=2))
    config = family.Config.tiny(num_layers=2, top_k=8, hot_slots=10, max_context=64)
    state = synthetic.synthetic_state(family, config, 2, "device", 40)
    for bounds in (*state.page_max, *state.page_min):
        assert np.isfinite(np.asarray(bounds)).all() and np.asarray(bounds).std() > 0.5  # unit-variance hashes
    np.testing.assert_array_equal(np.asarray(state.lengths), 40)


def test_a_kit_family_shards_over_the_batch_bit_for_bit():
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="2", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(Path(hisparse_jax.__file__).resolve().parents[1]),
                                           *[p for p in sys.path if p]]))
    env["XLA_FLAGS"] = " ".join([f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
                                + ["--xla_force_host_platform_device_count=2"])
    proc = subprocess.run([sys.executable, str(WORKER)], env=env, cwd=str(WORKER.parent), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == dict(devices=2, metadata_devices=2, tokens=True, logits=True, misses=report["misses"])
    assert report["misses"] > 0

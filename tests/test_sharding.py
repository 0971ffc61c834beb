"""Streams sharded over a mesh of 4 CPU devices (hisparse_jax.sharding).

JAX fixes the CPU device count when it starts its backends, and this process runs
the rest of the suite on one device, so the checks run in a subprocess
(tests/sharding_worker.py, JAX_NUM_CPU_DEVICES=4) that imports the same installed
hisparse_jax and prints one JSON report; each test below asserts one of its checks:

- sharded RESOLVE (shard_map, one custom call per device) == single-device RESOLVE,
  bit for bit, over several steps and layers, eager-stepped and as one scanned program;
- each pool shard lives in pinned_host memory of a different device;
- the compiled programs (scanned resolve, DSA generate) run one RESOLVE per layer per
  step on per-device shapes, keep the pool shard an S(5) parameter that only custom
  calls touch, and contain no all-gather / all-reduce / collective-permute / all-to-all;
- DSA tiny prefill + generate sharded == the single-device decode of each shard's
  streams, bit for bit (tokens, logits, misses, final state), pool still pinned_host;
- sampled tokens == the single-device categorical draw from the sharded logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hisparse_jax

DEVICES = 4
WORKER = Path(__file__).with_name("sharding_worker.py")
CHECKS = (
    "sharded_resolve_bitwise",
    "pool_shards_pinned_per_device",
    "sharded_dsa_decode_bitwise",
    "sharded_dsa_decode_hlo",
    "sharded_dsa_prefetch_bitwise",
    "sharded_sampling_draws",
    "sharded_state_checks",
    "sharded_family_refuses_benchmark_only_state",
)


@pytest.fixture(scope="module")
def report() -> dict:
    package_root = str(Path(hisparse_jax.__file__).resolve().parents[1])  # the installed package
    env = dict(os.environ)
    env.update(
        JAX_NUM_CPU_DEVICES=str(DEVICES),
        HISPARSE_SHARD_DEVICES=str(DEVICES),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([package_root, *[p for p in sys.path if p]]),
    )
    env["XLA_FLAGS"] = " ".join(
        [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
        + [f"--xla_force_host_platform_device_count={DEVICES}"]
    )
    proc = subprocess.run(
        [sys.executable, str(WORKER)], env=env, cwd=str(WORKER.parent), capture_output=True, text=True,
        timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(f"sharding worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}")
    out = json.loads(lines[-1])
    assert out["info"]["devices"] == DEVICES, out["info"]
    assert Path(out["info"]["hisparse_jax"]).resolve() == Path(hisparse_jax.__file__).resolve().parent, (
        "the worker imported another hisparse_jax", out["info"],
    )
    return out


@pytest.mark.parametrize("name", CHECKS)
def test_multi_device(report, name):
    result = report["checks"].get(name)
    assert result is not None, f"the worker did not run {name}"
    assert result["ok"], json.dumps(result, indent=1)[:6000]

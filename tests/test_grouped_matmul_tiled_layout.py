"""The grouped matmul's tiled-weight experiment (ffi/grouped_matmul_tiled.h), its layout checked on
the host: ffi/tests/grouped_matmul_tiled_check.cc compiled with the system's C++ compiler and run
(a permutation of the weight bytes, the kernel's load addresses, 512 contiguous bytes a warp's
load, TileWeights). The kernel itself is checked on a GPU (ffi/tests/grouped_matmul_cuda_check.cu
built with -DHISPARSE_GROUPED_MATMUL_TILE_ROWS=16 or 32; benchmarks/gpu_run.sh grouped-matmul-tiled)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


@pytest.mark.skipif(_compiler() is None, reason="no C++ compiler on PATH")
def test_tiled_layout(tmp_path):
    binary = tmp_path / "grouped_matmul_tiled_check"
    subprocess.run([_compiler(), "-O1", "-std=c++17", "-I", str(ROOT / "ffi"),
                    str(ROOT / "ffi" / "tests" / "grouped_matmul_tiled_check.cc"), "-o", str(binary)],
                   check=True, capture_output=True, timeout=120)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("0 failed"), run.stdout

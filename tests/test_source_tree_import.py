"""Python started in the repository's root imports the source tree, which has no compiled
extension: the package says so once instead of quietly running only the pure-JAX references."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_source_tree_without_its_extension_warns():
    if any((ROOT / "hisparse_jax").glob("_hisparse_ffi*")):
        pytest.skip("this source tree has its extension built in place (an editable install)")
    done = subprocess.run([sys.executable, "-c", "import hisparse_jax as hs; print(hs.ffi_platforms())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "()"
    assert "imported from the source tree" in done.stderr and "without its compiled extension" in done.stderr
    assert done.stderr.count("imported from the source tree") == 1

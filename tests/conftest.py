"""Test setup: import the *installed* hisparse_jax (with its compiled extension),
inject the implementations, and skip GPU-only tests cleanly without a GPU.

Run with `./dev test` (builds and installs into .venv first), or against any
installed build, e.g.:
  pip install --no-build-isolation --no-deps --target SITE .
  PYTHONPATH=SITE python -m pytest tests -q
Knobs: HISPARSE_TEST_SCALE=10 multiplies the random sequences and hypothesis
examples (soak runs); HYPOTHESIS_PROFILE=hisparse-ci derandomizes hypothesis.
GPU: on a machine whose default backend is gpu, build with HISPARSE_CUDA=ON;
"ffi" then means the CUDA handler and the tests marked `gpu` run.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_REPO = Path(__file__).resolve().parents[1]


def _prefer_installed_package() -> None:
    """`python -m pytest` puts the current directory first on sys.path; from the
    repository root that would import the source tree, which has no compiled
    extension, instead of the installed package. Move the repository root to the
    end of sys.path (its other top-level folders stay importable) unless the
    source tree was built in place."""
    if any((_REPO / "hisparse_jax").glob("_hisparse_ffi*")):
        return
    is_repo = [Path(p or os.getcwd()).resolve() == _REPO for p in sys.path]
    sys.path[:] = [p for p, r in zip(sys.path, is_repo) if not r] + [
        p for p, r in zip(sys.path, is_repo) if r
    ]


_prefer_installed_package()
sys.path.insert(0, str(Path(__file__).parent))  # helpers and oracle, whatever pytest's import mode

import jax  # noqa: E402

_INSTALL = (
    "Run the tests with `./dev test`, or install the package first: `pip install "
    "--no-build-isolation .` (HISPARSE_CUDA=ON for the CUDA handlers)."
)
try:
    import hisparse_jax  # noqa: E402
except ModuleNotFoundError as err:
    if err.name != "hisparse_jax":
        raise
    pytest.exit(f"hisparse_jax is not installed ({err}). {_INSTALL}", returncode=4)

if hisparse_jax.ffi_extension_error() is not None:
    pytest.exit(
        f"hisparse_jax was imported from {Path(hisparse_jax.__file__).parent} without its compiled "
        f"extension ({hisparse_jax.ffi_extension_error()}). {_INSTALL}",
        returncode=4,
    )

from helpers import IMPLEMENTATIONS  # noqa: E402

# Examples are slow (a jitted call per step) and the first one of a shape
# compiles; the `implementation` fixture is a plain string, safe to share.
settings.register_profile(
    "hisparse",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("hisparse-ci", parent=settings.get_profile("hisparse"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "hisparse"))


def pytest_configure(config):
    # The controller of an xdist run only (workers have `workerinput`): it sees every report.
    if (config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None)
            and not hasattr(config, "workerinput")):
        from progress_plugin import FileProgress

        config.pluginmanager.register(FileProgress(config), "hisparse-file-progress")


def pytest_report_header(config):
    return (
        f"hisparse_jax from {Path(hisparse_jax.__file__).parent}; jax {jax.__version__} on "
        f"{jax.default_backend()}; ffi platforms {hisparse_jax.ffi_platforms()}; "
        f"implementations {IMPLEMENTATIONS}"
    )


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
    if on_gpu() and hisparse_jax.built_with_cuda():
        return
    reason = (
        "needs a GPU backend" if not on_gpu() else "hisparse_jax was built without CUDA (HISPARSE_CUDA=ON)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drops each test module's compiled programs after it. XLA:CPU maps every compiled program's
    code into memory regions of its own (about ten a program) and keeps them while jax's caches
    hold the executable. A worker running its share of the whole suite held ~37000 mappings after
    28 of the 71 files and kept growing toward Linux's limit of 65530 a process (vm.max_map_count);
    at the limit LLVM cannot allocate and the compile segfaults in backend_compile_and_load (a CI
    worker died so near the end of the suite; with the limit lowered to 20000 the suite crashed
    the same way without this fixture and passed with it). Programs shared within a module stay
    cached."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request) -> str:
    """Every implementation that runs on the default backend ("reference", and
    "ffi" where a handler is registered: C++ on CPU, CUDA on GPU)."""
    return request.param


@pytest.fixture(scope="module")
def text_root(tmp_path_factory) -> Path:
    """A folder of standard-library text (tests/stdlib_text.py), one per test module."""
    import stdlib_text

    return stdlib_text.copy_to(tmp_path_factory.mktemp("corpus") / "text")

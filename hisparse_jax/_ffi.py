"""Loads the compiled extension and registers its handlers with XLA.

Importing this module registers every target for "cpu", and for "CUDA" when
the extension was built with CUDA. Nothing else in the package touches the
extension directly: the functions below say what was registered, and
_dispatch.py decides from them which implementation an op runs.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax

from . import targets

try:
    from . import _hisparse_ffi as _ext
except ImportError as err:  # the package was imported from a source tree without a build
    _ext = None
    _IMPORT_ERROR = err
    if (Path(__file__).parent.parent / "pyproject.toml").is_file():
        # A source checkout shadows the installed package (python run from the repository's root):
        # every op would quietly fall back to its pure-JAX reference.
        warnings.warn(
            f"hisparse_jax was imported from the source tree {Path(__file__).parent.parent} without its compiled "
            "extension, so only the pure-JAX references run (ffi_platforms() is empty); run Python from another "
            "folder to use the installed package, or build here with `pip install --no-build-isolation -e .`",
            UserWarning, stacklevel=2)
else:
    _IMPORT_ERROR = None

_registered: dict[str, bool] = {"cpu": False, "CUDA": False}
_registered_names: dict[str, set[str]] = {"cpu": set(), "CUDA": set()}


def _register() -> None:
    if _ext is None:
        return
    tables = {"cpu": _ext.cpu_registrations(), "CUDA": _ext.cuda_registrations()}
    for platform, capsules in tables.items():
        if not capsules:
            continue
        for target in targets.ALL:
            key = targets.CAPSULE_KEYS[target]
            if key not in capsules:  # a target without a handler on this platform (targets.CUDA_ONLY)
                continue
            jax.ffi.register_ffi_target(target, capsules[key], platform=platform)
            _registered_names[platform].add(target)
        _registered[platform] = True


_register()


def extension_error() -> ImportError | None:
    """Why the compiled extension did not load (the package imported from a source tree without
    a build), or None when it did."""
    return _IMPORT_ERROR


def ffi_registrations(platform: str) -> dict:
    """The extension's handler capsules for `platform` ("cpu" or "cuda"), keyed by
    targets.CAPSULE_KEYS values; empty without the extension or without handlers there."""
    if _ext is None:
        return {}
    platform = platform_of(platform)
    if platform not in ("cpu", "cuda"):
        raise ValueError(f"ffi_registrations: platform must be 'cpu' or 'cuda', got {platform!r}")
    return dict(_ext.cpu_registrations() if platform == "cpu" else _ext.cuda_registrations())


def built_with_cuda() -> bool:
    """True when the extension carries the CUDA handlers."""
    return _ext is not None and bool(_ext.built_with_cuda())


def ffi_platforms() -> tuple[str, ...]:
    """The XLA platforms ("cpu", "cuda") that have RESOLVE handlers registered."""
    return tuple(p.lower() for p, ok in _registered.items() if ok)


def platform_of(backend: str) -> str:
    """The XLA platform of a jax backend name: jax.default_backend() says "gpu"
    on CUDA devices, while the handlers are registered for "CUDA"."""
    backend = backend.lower()
    return "cuda" if backend == "gpu" else backend


def has_ffi(backend: str | None = None) -> bool:
    """True when a handler is registered for `backend` (default: jax.default_backend())."""
    return platform_of(backend or jax.default_backend()) in ffi_platforms()


def has_target(target: str, backend: str | None = None) -> bool:
    """True when `target` has a handler registered for `backend` (default: jax.default_backend())."""
    platform = platform_of(backend or jax.default_backend())
    return any(target in names for p, names in _registered_names.items() if p.lower() == platform)


def cuda_kernel_ready(target: str) -> bool:
    """True on a CUDA backend whose extension registered `target`: the test of a CUDA-only custom
    call (the indexer, the grouped matmul), which on other backends runs its XLA reference."""
    return platform_of(jax.default_backend()) == "cuda" and has_target(target)

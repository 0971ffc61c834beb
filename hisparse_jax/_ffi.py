"""Loads the compiled extension and registers its handlers with XLA.

Importing this module registers every target for "cpu", and for "CUDA" when
the extension was built with CUDA. Nothing else in the package touches the
extension directly.
"""

from __future__ import annotations

import jax

from . import _targets

try:
    from . import _hisparse_ffi as _ext
except ImportError as err:  # the package was imported from a source tree without a build
    _ext = None
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None

_registered: dict[str, bool] = {"cpu": False, "CUDA": False}
_registered_targets: dict[str, set[str]] = {"cpu": set(), "CUDA": set()}


def _register() -> None:
    if _ext is None:
        return
    tables = {"cpu": _ext.cpu_registrations(), "CUDA": _ext.cuda_registrations()}
    for platform, capsules in tables.items():
        if not capsules:
            continue
        for target in _targets.ALL:
            key = _targets.CAPSULE_KEYS[target]
            if key not in capsules:  # a target without a handler on this platform (_targets.CUDA_ONLY)
                continue
            jax.ffi.register_ffi_target(target, capsules[key], platform=platform)
            _registered_targets[platform].add(target)
        _registered[platform] = True


_register()


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
    return any(target in targets for p, targets in _registered_targets.items() if p.lower() == platform)


def cuda_kernel_ready(target: str) -> bool:
    """True on a CUDA backend whose extension registered `target`: the test of a CUDA-only custom
    call (the indexer, the grouped matmul), which on other backends runs its XLA reference."""
    return platform_of(jax.default_backend()) == "cuda" and has_target(target)


def require_cuda_kernel(op: str, target: str) -> None:
    """Raises a RuntimeError, prefixed with `op`, saying why implementation='ffi' cannot run the
    CUDA-only custom call `target` here and what to do instead."""
    if cuda_kernel_ready(target):
        return
    backend = jax.default_backend()
    if platform_of(backend) != "cuda":
        raise RuntimeError(f"{op}: implementation='ffi' is a CUDA kernel, but the default backend is "
                           f"{backend!r}; pass implementation='reference' (or 'auto')")
    try:
        require_ffi(backend)  # says how to build with CUDA
    except RuntimeError as err:
        raise RuntimeError(f"{op}: {err}") from None
    raise RuntimeError(f"{op}: the CUDA extension has no {target!r} handler; rebuild it with "
                       "`HISPARSE_CUDA=ON pip install --no-build-isolation .`")


def choose_cuda_kernel(implementation: str, target: str, domain_error: str) -> str:
    """The implementation of a CUDA-only custom call: `implementation` itself unless "auto"
    (validated), else "ffi" where the kernel is ready and the operands are in its domain
    (`domain_error` empty), else "reference"."""
    impl = choose_implementation(implementation)  # validates the name
    if implementation != "auto":
        return impl
    return "ffi" if cuda_kernel_ready(target) and not domain_error else "reference"


def require_ffi(platform: str) -> None:
    """Raises a RuntimeError saying how to get a handler for `platform`."""
    if _ext is None:
        raise RuntimeError(
            "hisparse_jax was imported without its compiled extension "
            f"({_IMPORT_ERROR}). Install the package (`pip install .`) instead of "
            "importing it from the source tree, or pass implementation='reference'."
        )
    if not has_ffi(platform):
        hint = (
            "rebuild with CUDA: `HISPARSE_CUDA=ON pip install --no-build-isolation .`"
            if platform_of(platform) == "cuda"
            else "use implementation='reference'"
        )
        raise RuntimeError(
            f"hisparse_jax has no FFI handler for platform {platform!r} "
            f"(built for {ffi_platforms()}); {hint}."
        )


IMPLEMENTATIONS = ("auto", "ffi", "reference")


def choose_implementation(implementation: str) -> str:
    """"ffi" or "reference" for an `implementation=` argument ("auto": the FFI
    handler when one is registered for the default backend)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be 'auto', 'ffi' or 'reference', got {implementation!r}"
        )
    if implementation != "auto":
        return implementation
    return "ffi" if has_ffi() else "reference"

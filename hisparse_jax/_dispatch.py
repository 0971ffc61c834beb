"""Which implementation runs an op: the `implementation=` names in one place, the choice "auto"
makes, and the one-line errors when implementation="ffi" cannot run here.

Every op (resolve, write_records, select_topk, index_scores, grouped_matmul, resolve_prefetch,
route_experts)
asks `choose_implementation` and, before emitting its custom call, `require_handler`. Targets
with a handler on every platform the extension was built for run the FFI under "auto" wherever
one is registered; CUDA-only targets (targets.CUDA_ONLY) run it only on a CUDA backend and only
for operands inside the kernel's domain, else their XLA reference.
"""

from __future__ import annotations

from typing import Literal

import jax

from . import _ffi, targets

IMPLEMENTATIONS = ("auto", "ffi", "reference")
# The type of every op's `implementation=` argument.
Implementation = Literal["auto", "ffi", "reference"]


def choose_implementation(op: str, implementation: str, target: str, domain_error: str = "") -> str:
    """"ffi" or "reference" for op `op`'s `implementation=` argument, whose custom call is `target`.

    "auto" picks the FFI handler where `target` can run on the default backend and the operands
    are in the kernel's domain (`domain_error` empty: the reason they are not, otherwise; ops
    whose handler takes every size pass none). An unknown name is a ValueError.
    """
    del op  # the message below predates the helper and names no op; tests match it
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be 'auto', 'ffi' or 'reference', got {implementation!r}"
        )
    if implementation != "auto":
        return implementation
    if target in targets.CUDA_ONLY:
        return "ffi" if _ffi.cuda_kernel_ready(target) and not domain_error else "reference"
    return "ffi" if _ffi.has_ffi() and not domain_error else "reference"


def require_handler(op: str, target: str, domain_error: str = "") -> None:
    """Raises a RuntimeError saying why implementation='ffi' cannot run `target` for op `op` on
    the default backend, and what to do instead, or, where the handler is there, a ValueError
    "op: domain_error" when the operands are outside its kernel's domain; returns when the call
    can run."""
    if target in targets.CUDA_ONLY:
        _require_cuda_kernel(op, target)
    else:
        require_ffi(jax.default_backend())
    if domain_error:
        raise ValueError(f"{op}: {domain_error}")


def require_ffi(platform: str) -> None:
    """Raises a RuntimeError saying how to get a handler for `platform`."""
    if _ffi.extension_error() is not None:
        raise RuntimeError(
            "hisparse_jax was imported without its compiled extension "
            f"({_ffi.extension_error()}). Install the package (`pip install .`) instead of "
            "importing it from the source tree, or pass implementation='reference'."
        )
    if not _ffi.has_ffi(platform):
        hint = (
            "rebuild with CUDA: `HISPARSE_CUDA=ON pip install --no-build-isolation .`"
            if _ffi.platform_of(platform) == "cuda"
            else "use implementation='reference'"
        )
        raise RuntimeError(
            f"hisparse_jax has no FFI handler for platform {platform!r} "
            f"(built for {_ffi.ffi_platforms()}); {hint}."
        )


def _require_cuda_kernel(op: str, target: str) -> None:
    """require_handler for a CUDA-only custom call: each message prefixed with `op`."""
    if _ffi.cuda_kernel_ready(target):
        return
    backend = jax.default_backend()
    if _ffi.platform_of(backend) != "cuda":
        raise RuntimeError(f"{op}: implementation='ffi' is a CUDA kernel, but the default backend is "
                           f"{backend!r}; pass implementation='reference' (or 'auto')")
    try:
        require_ffi(backend)  # says how to build with CUDA
    except RuntimeError as err:
        raise RuntimeError(f"{op}: {err}") from None
    raise RuntimeError(f"{op}: the CUDA extension has no {target!r} handler; rebuild it with "
                       "`HISPARSE_CUDA=ON pip install --no-build-isolation .`")

"""TOP-K selection: the k best sealed record ids of every stream, ascending, -1 padded.

The one selection rule of every model family, behind `implementation=`: the XLA reference
(lax.top_k over masked scores; on a GPU XLA lowers it to full sorts of every row) and the FFI
custom call "hisparse_topk", a radix select in C++ on CPU and in CUDA on GPU. Both give the same
ids; the contract, total order of floats included, is in ffi/topk.h.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, _dispatch, targets
from ._dispatch import Implementation

_OP = "select_topk"


def select_topk(
    scores: jax.Array, sealed: jax.Array, k: int, *, implementation: Implementation = "auto"
) -> jax.Array:
    """Top-k sealed records by score, in ascending id order, padded with -1 at the end.

    Args:
      scores: [*S, R] float, one score per record id; float32, or any float dtype, which is
        widened to float32 first (both implementations). Any number of stream dims *S, none too.
      sealed: [*S] int32; only ids < sealed are selectable (negative: none; above R: all R).
      k: Python int in [1, R].
      implementation: "ffi" (the C++/CUDA handler), "reference" (lax.top_k) or "auto" (the
        handler when one is registered for the default backend).
    Returns:
      [*S, k] int32: the ids of the k largest scores among the R ids, where unsealed ids score
      -inf and ties go to the lower id, keeping the sealed ones in ascending order, then -1.
      Scores rank in IEEE 754 totalOrder, the order of XLA's TopK comparator: -NaN < -inf <
      finite < +inf < NaN, -0.0 < +0.0 (so with fewer than k sealed ids, or sealed ids scoring
      -NaN, the tail is -1). Ascending order makes the attention order position order, so a
      selection always produces the same bits.
      One exception, in the reference only: XLA's GPU kernel for k <= 16 over [R] or [b, R]
      scores with R >= 1024 compares with IEEE `>`, so there -0.0 ties +0.0 and NaNs are
      unordered; the FFI always uses the total order.
    Works under jit and inside lax.scan; not under vmap (add stream dims instead).
    """
    impl = _dispatch.choose_implementation(_OP, implementation, targets.TOPK)
    _check_topk(scores, sealed, k)
    if impl == "reference":
        return select_topk_reference(scores, sealed, k)
    _dispatch.require_handler(_OP, targets.TOPK)
    streams, records = tuple(jax.typeof(scores).shape[:-1]), jax.typeof(scores).shape[-1]
    call = jax.ffi.ffi_call(
        targets.TOPK,
        (
            jax.ShapeDtypeStruct((*streams, k), jnp.int32),
            # The streaming CUDA kernel's scratch (two bitmaps of R bits per stream), dropped
            # here; an output rather than an allocation keeps the handler CUDA-graph compatible.
            jax.ShapeDtypeStruct((*streams, workspace_words(records)), jnp.uint32),
        ),
    )
    selected, _ = call(jnp.asarray(scores).astype(jnp.float32), sealed, k=np.int64(k))
    return selected


def select_topk_reference(scores: jax.Array, sealed: jax.Array, k: int) -> jax.Array:
    """select_topk in XLA ops: lax.top_k over the scores with unsealed ids at -inf, then the
    selected sealed ids sorted ascending and -1 padding (shapes and order as select_topk)."""
    ids = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    selectable = ids < sealed[..., None]
    masked = jnp.where(selectable, scores.astype(jnp.float32), -jnp.inf)
    _, top = jax.lax.top_k(masked, k)
    top = top.astype(jnp.int32)
    big = jnp.iinfo(jnp.int32).max
    ordered = jnp.sort(jnp.where(top < sealed[..., None], top, big), axis=-1)
    return jnp.where(ordered == big, -1, ordered)


def workspace_words(records: int) -> int:
    """uint32 words of the handler's per-stream scratch output (TopkWorkspaceWords, ffi/topk.h)."""
    return 2 * 4 * ((records + 127) // 128)


def _check_topk(scores, sealed, k) -> None:
    """Trace-time checks of select_topk's arguments, each naming the argument and the fix."""
    shape, dtype = tuple(jax.typeof(scores).shape), np.dtype(jax.typeof(scores).dtype)
    if len(shape) < 1:
        raise ValueError(f"{_OP}: scores must be [*streams, R], got a scalar; give every record a score")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{_OP}: scores must be a float array, got {dtype}; cast it with .astype(jnp.float32)")
    _checks.check_int32(_OP, "sealed", sealed)
    streams, records = shape[:-1], shape[-1]
    if tuple(jax.typeof(sealed).shape) != streams:
        raise ValueError(
            f"{_OP}: sealed has shape {tuple(jax.typeof(sealed).shape)}, expected the stream shape "
            f"{streams} of scores {shape} ([*streams, R])"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{_OP}: k must be a Python int (static), got {k!r}")
    if not 1 <= k <= records:
        raise ValueError(
            f"{_OP}: k={k} must lie in [1, R={records}] (R = scores.shape[-1]); "
            "select fewer records or score more of them"
        )

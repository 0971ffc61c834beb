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
      scores: [*S, R] float, one score per record id; float32, or float16 / bfloat16, widened to
        float32 by their bits (exactly: NaN payloads, signalling NaNs and subnormals keep their
        value on every platform), or float64, narrowed by XLA's convert. Any number of stream
        dims *S, none too.
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
      selection always produces the same bits. The reference ranks the contract's integer keys
      (never floats), so no platform's float compare, NaN quieting or flushing can change them.
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
    float32 = jax.lax.bitcast_convert_type(float32_bits(scores), jnp.float32)
    selected, _ = call(float32, sealed, k=np.int64(k))
    return selected


def float32_bits(scores) -> jax.Array:
    """The uint32 bits of `scores` as float32. float16 and bfloat16 widen by their bits, so the
    value is exact on every platform: a hardware or NumPy conversion may quiet a signalling NaN
    or canonicalize a payload (x86's F16C does), which would change the order of the keys."""
    x = jnp.asarray(scores)
    dtype = np.dtype(x.dtype)
    if dtype == np.float32:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if dtype == jnp.bfloat16:  # the high half of a float32
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    if dtype == np.float16:
        h = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
        sign, exponent, mantissa = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
        normal = ((exponent + (127 - 15)) << 23) | (mantissa << 13)
        special = (0xFF << 23) | (mantissa << 13)  # inf, and NaNs with payload and quiet bit kept
        # A subnormal m x 2^-24 is a normal float32: exact in float arithmetic (no flush applies).
        tiny = jax.lax.bitcast_convert_type(mantissa.astype(jnp.float32) * np.float32(2.0**-24), jnp.uint32)
        body = jnp.where(exponent == 0x1F, special, jnp.where(exponent == 0, tiny, normal))
        return sign | body
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def ordered_keys(bits: jax.Array) -> jax.Array:
    """TopkOrderedKey (ffi/topk.h) of float32 bits, as int32 in the same order: IEEE 754
    totalOrder on integers (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN)."""
    key = jnp.where((bits >> 31) != 0, ~bits, bits | np.uint32(0x80000000))
    return jax.lax.bitcast_convert_type(key ^ np.uint32(0x80000000), jnp.int32)


def select_topk_reference(scores: jax.Array, sealed: jax.Array, k: int) -> jax.Array:
    """select_topk in XLA ops: lax.top_k over the contract's integer keys with unsealed ids at the
    key of -inf, then the selected sealed ids sorted ascending and -1 padding (shapes and order as
    select_topk). Integer keys: lax.top_k's tie rule (the lower index first) is all that remains."""
    ids = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    selectable = ids < sealed[..., None]
    unsealed = ordered_keys(jnp.uint32(0xFF800000))  # -inf
    masked = jnp.where(selectable, ordered_keys(float32_bits(scores)), unsealed)
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

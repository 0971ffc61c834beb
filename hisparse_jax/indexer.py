"""The DSA lightning indexer's scores: one fused CUDA custom call, or its XLA reference.

  scores[b, t] = sum_h weights[b, h] * relu(q[b, h] . keys[b, t] * key_scale[b, t])   t < lengths[b]
  scores[b, t] = -inf                                                                 t >= lengths[b]

The contract, sums and rounding included, is in ffi/indexer.h. The FFI custom call
"hisparse_index_scores" runs on CUDA only (one kernel, keys read once, no [b, H, T]
intermediate); on CPU, and for operands outside the kernel's domain, the op is the XLA
reference below. Keys are bfloat16, or float8_e4m3fn with a float32 scale per token (DeepSeek's
132 B per token at d = 128); `quantize_keys_fp8` makes the latter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, _dispatch, fp8, targets
from ._dispatch import Implementation

_OP = "index_scores"

# The CUDA kernel's size limits (ffi/indexer.h).
MAX_HEADS = 128
DIM_MULTIPLE = 16
MAX_DIM = 256
MAX_F32_QUERY_ELEMENTS = 128 * 128

_QUERY_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(np.float32))
_KEY_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float8_e4m3fn), np.dtype(np.float32))


def index_scores(
    q: jax.Array,
    weights: jax.Array,
    keys: jax.Array,
    lengths: jax.Array,
    *,
    key_scale: jax.Array | None = None,
    implementation: Implementation = "auto",
) -> jax.Array:
    """Indexer scores of every token of every row, -inf from lengths[b] on.

    Args:
      q: [b, H, d] bfloat16 or float32, one query per index head.
      weights: [b, H] float32 head weights; fold 1/sqrt(H) and 1/sqrt(d) in here (or into q):
        nothing is scaled inside.
      keys: [b, T, d] bfloat16; or float8_e4m3fn with `key_scale`; or float32 (reference only).
      lengths: [b] int32; token t of row b is scored iff t < lengths[b] (<= 0: none, >= T: all).
      key_scale: [b, T] float32, exactly when keys are float8_e4m3fn (see quantize_keys_fp8).
      implementation: "ffi" (the CUDA kernel; an error on other backends), "reference" (XLA, any
        backend) or "auto": "ffi" on a CUDA backend with the handler registered and operands the
        kernel takes (bfloat16 or fp8 keys, H <= 128, d a multiple of 16 up to 256), else
        "reference".

    Returns:
      [b, T] float32 scores; -inf (the "not a candidate" sentinel, below every score) for
      t >= lengths[b]. The implementations agree within the float32 rounding bound of
      ffi/indexer.h, not bit for bit; each is deterministic. Works under jit and lax.scan.
    """
    _check_operands(q, weights, keys, lengths, key_scale)
    impl = _dispatch.choose_implementation(_OP, implementation, targets.INDEX_SCORES, _domain_error(q, keys))
    if impl == "reference":
        return index_scores_reference(q, weights, keys, lengths, key_scale=key_scale)
    _dispatch.require_handler(_OP, targets.INDEX_SCORES, _domain_error(q, keys))
    b, T = _shape(keys)[:2]
    # bfloat16 keys have no scale; the target still takes the operand, as an empty array.
    scale = key_scale if key_scale is not None else jnp.zeros((0,), jnp.float32)
    call = jax.ffi.ffi_call(targets.INDEX_SCORES, jax.ShapeDtypeStruct((b, T), jnp.float32))
    return call(q, weights, keys, scale, lengths)


def index_scores_reference(
    q: jax.Array,
    weights: jax.Array,
    keys: jax.Array,
    lengths: jax.Array,
    *,
    key_scale: jax.Array | None = None,
) -> jax.Array:
    """The contract's math in float32 XLA ops (the arguments of index_scores, any backend).

    Every operand is widened to float32 exactly (fp8 keys decode to their float32 values),
    the scale multiplies each dot product, and both contractions run at HIGHEST precision (on
    GPUs XLA's default would round float32 operands to TF32).
    """
    highest = jax.lax.Precision.HIGHEST
    f32 = jnp.float32
    dots = jnp.einsum("bhd,btd->bht", q.astype(f32), keys.astype(f32), precision=highest)
    if key_scale is not None:
        dots = dots * key_scale[:, None, :]
    scores = jnp.einsum("bht,bh->bt", jnp.maximum(dots, 0.0), weights, precision=highest)
    tokens = jnp.arange(scores.shape[1], dtype=jnp.int32)
    return jnp.where(tokens[None, :] < lengths[:, None], scores, -jnp.inf)


def quantize_keys_fp8(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token fp8 quantization, as DeepSeek stores its index keys: fp8.quantize_rows.

    Args:
      keys: [..., d] float (bfloat16 or float32).
    Returns:
      (codes [..., d] float8_e4m3fn, scale [...] float32) with scale = max(max |key| / 448,
      2**-126) per token (hisparse_jax/fp8.py has the rule). A token of zeros gets codes 0 and
      dequantizes to 0; a token holding inf or NaN gets codes 0 and scale NaN, so its scores
      are NaN in every implementation.
    """
    return fp8.quantize_rows(keys)


# --------------------------------------------------------------------------- checks


_shape, _dtype = _checks.shape_of, _checks.dtype_of


def _fail(exc, message: str):
    raise exc(f"{_OP}: {message}")


def _check_operands(q, weights, keys, lengths, key_scale) -> None:
    if _dtype(q) not in _QUERY_DTYPES:
        _fail(TypeError, f"q must be bfloat16 or float32, got {_dtype(q)}; cast it with .astype(jnp.bfloat16)")
    if len(_shape(q)) != 3:
        _fail(ValueError, f"q has shape {_shape(q)}; it must be [b, H, d] (one query per index head)")
    b, H, d = _shape(q)
    if _dtype(weights) != np.float32:
        _fail(TypeError, f"weights must be float32, got {_dtype(weights)}; cast it with .astype(jnp.float32)")
    if _shape(weights) != (b, H):
        _fail(ValueError, f"weights has shape {_shape(weights)}; it must be [b, H] = {(b, H)} to match q")
    if _dtype(keys) not in _KEY_DTYPES:
        _fail(TypeError, f"keys must be bfloat16, float8_e4m3fn or float32, got {_dtype(keys)}; "
              "cast it to bfloat16 or quantize it with quantize_keys_fp8")
    if len(_shape(keys)) != 3 or _shape(keys)[0] != b or _shape(keys)[2] != d:
        _fail(ValueError, f"keys has shape {_shape(keys)}; it must be [b, T, d] with b = {b} and d = {d} of q")
    T = _shape(keys)[1]
    fp8 = _dtype(keys) == np.dtype(jnp.float8_e4m3fn)
    if fp8 and key_scale is None:
        _fail(ValueError, "float8_e4m3fn keys need key_scale [b, T] float32; make both with quantize_keys_fp8")
    if not fp8 and key_scale is not None:
        _fail(ValueError, f"key_scale is only for float8_e4m3fn keys, but keys are {_dtype(keys)}; "
              "drop key_scale or quantize the keys with quantize_keys_fp8")
    if fp8:
        if _dtype(key_scale) != np.float32:
            _fail(TypeError, f"key_scale must be float32, got {_dtype(key_scale)}; cast it with .astype(jnp.float32)")
        if _shape(key_scale) != (b, T):
            _fail(ValueError, f"key_scale has shape {_shape(key_scale)}; it must be [b, T] = {(b, T)} of keys")
    if _dtype(lengths) != np.int32:
        _fail(TypeError, f"lengths must be int32, got {_dtype(lengths)}; cast it with .astype(jnp.int32)")
    if _shape(lengths) != (b,):
        _fail(ValueError, f"lengths has shape {_shape(lengths)}; it must be [b] = {(b,)} (one length per row)")


def _domain_error(q, keys) -> str:
    """Why the CUDA kernel cannot take these operands ("" when it can)."""
    _, H, d = _shape(q)
    if _dtype(keys) == np.float32:
        return ("float32 keys run only in the reference; cast keys to bfloat16 or quantize them with "
                "quantize_keys_fp8, or pass implementation='reference'")
    if not 1 <= H <= MAX_HEADS:
        return f"q has H = {H} heads; the CUDA kernel takes 1 to {MAX_HEADS}; pass implementation='reference'"
    if d % DIM_MULTIPLE or not DIM_MULTIPLE <= d <= MAX_DIM:
        return (f"q and keys have d = {d}; the CUDA kernel needs a multiple of {DIM_MULTIPLE} in "
                f"[{DIM_MULTIPLE}, {MAX_DIM}]; pad d with zeros or pass implementation='reference'")
    if _dtype(q) == np.float32 and H * d > MAX_F32_QUERY_ELEMENTS:
        return (f"float32 q needs H * d <= {MAX_F32_QUERY_ELEMENTS} in the CUDA kernel (got {H} * {d}); "
                "pass q in bfloat16")
    return ""

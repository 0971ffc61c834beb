"""MoE expert matmuls at decode: one CUDA custom call that reads only the experts in use, or its
XLA reference.

  y[m, n] = scale[e, n] * sum_k x[m, k] * w[e, n, k]   for row m in group e (rows sorted by group)
  y[m, n] = 0                                          for rows past the last group

The contract, sums, rounding and the meaning of malformed group sizes are in
ffi/grouped_matmul.h. The FFI custom call "hisparse_grouped_matmul" runs on CUDA only: experts
without rows are never read, each active expert's weights are read once per pass, and the result
is deterministic. (`jax.lax.ragged_dot` lowers to a dense padded dot that reads every expert on
an H200 with jaxlib 0.11.2, whatever the group sizes: what this op avoids.) On CPU, and for operands
outside the kernel's domain, the op is the XLA reference below. Weights are bfloat16, or
float8_e4m3fn with a float32 scale per expert and output channel (`quantize_weights_fp8`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, _dispatch, fp8, targets
from ._dispatch import Implementation

_OP = "grouped_matmul"

# The CUDA kernel's size limits (ffi/grouped_matmul.h).
MAX_EXPERTS = 1024
MAX_ROWS = 2**31 - 1
MAX_N = 2**24
MAX_K = 2**31 - 1
ROW_ALIGN_BYTES = 16  # K * (bytes of a w element) must be a multiple

_BF16 = np.dtype(jnp.bfloat16)
_FP8 = np.dtype(jnp.float8_e4m3fn)
_F32 = np.dtype(np.float32)
_X_DTYPES = (_BF16, _F32)
_W_DTYPES = (_BF16, _FP8, _F32)


def grouped_matmul(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    scale: jax.Array | None = None,
    *,
    implementation: Implementation = "auto",
) -> jax.Array:
    """Each row of x times the weights of its group (expert), rows sorted by group.

    Args:
      x: [M, K] bfloat16 (float32: reference only); the routed tokens, sorted by expert.
      w: [E, N, K] bfloat16, or float8_e4m3fn with `scale`, or float32 (reference only); K is
        the contiguous axis (each expert's weight is [N, K], output channels by inputs).
      group_sizes: [E] int32; expert e owns the next group_sizes[e] rows. Pass exact counts
        (e.g. a bincount of the sorted expert ids). Other values are defined, not repaired: a
        negative size counts as 0, groups past row M are cut at M, and rows past the last
        group give 0; no value makes the kernel read or write out of bounds.
      scale: [E, N] float32 per expert and output channel, required with float8_e4m3fn w (see
        quantize_weights_fp8); optional otherwise (None: no scaling).
      implementation: "ffi" (the CUDA kernel; an error on other backends or for operands
        outside its domain), "reference" (XLA, any backend) or "auto": "ffi" on a CUDA backend
        with the handler registered and operands the kernel takes (bfloat16 x, bfloat16 or fp8
        w, K * element bytes a multiple of 16, E <= 1024, N <= 2^24), else "reference".

    Returns:
      [M, N] float32. The implementations agree within the float32 rounding bound of
      ffi/grouped_matmul.h, not bit for bit; each is deterministic (the kernel gives the same
      bits on every call, whatever the other groups). Works under jit and lax.scan.
    """
    _check_operands(x, w, group_sizes, scale)
    impl = _dispatch.choose_implementation(_OP, implementation, targets.GROUPED_MATMUL, _domain_error(x, w))
    if impl == "reference":
        return grouped_matmul_reference(x, w, group_sizes, scale)
    _dispatch.require_handler(_OP, targets.GROUPED_MATMUL, _domain_error(x, w))
    M = _shape(x)[0]
    E, N, _ = _shape(w)
    factors = scale if scale is not None else jnp.ones((E, N), jnp.float32)
    call = jax.ffi.ffi_call(targets.GROUPED_MATMUL, jax.ShapeDtypeStruct((M, N), jnp.float32))
    return call(x, w, factors, group_sizes)


def grouped_matmul_reference(
    x: jax.Array,
    w: jax.Array,
    group_sizes: jax.Array,
    scale: jax.Array | None = None,
) -> jax.Array:
    """The contract in XLA ops (the arguments of grouped_matmul, any backend).

    `jax.lax.ragged_dot` of x and w, both widened exactly to a common dtype (bfloat16, or
    float32 when either is float32; fp8 w becomes its exact values), with float32 accumulation
    at HIGHEST precision (on GPUs XLA's default would round float32 operands to TF32), times
    each row's scale; rows past the last group are 0. Group sizes are clamped first as
    ffi/grouped_matmul.h defines them.
    """
    M = _shape(x)[0]
    E, N, _ = _shape(w)
    sizes = clamped_group_sizes(group_sizes, M)
    common = jnp.float32 if _F32 in (_dtype(x), _dtype(w)) else jnp.bfloat16
    y = jax.lax.ragged_dot(
        x.astype(common),
        jnp.swapaxes(w, 1, 2).astype(common),
        sizes,
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    ends = jnp.cumsum(sizes)
    rows = jnp.arange(M, dtype=jnp.int32)
    in_group = rows < ends[-1]
    if scale is not None:
        group = jnp.minimum(jnp.searchsorted(ends, rows, side="right"), E - 1)
        y = y * scale[group]
    return jnp.where(in_group[:, None], y, 0.0)


def clamped_group_sizes(group_sizes: jax.Array, rows: int) -> jax.Array:
    """The rows each group really owns (ffi/grouped_matmul.h): max(size, 0), with the groups
    laid out in order and cut at `rows`; the result sums to at most `rows`.

    The running sum saturates at `rows` (a + min(b, rows - a) never overflows int32), so sizes
    whose plain sum would overflow are still cut where the contract cuts them.
    """
    sizes = jnp.maximum(jnp.asarray(group_sizes, jnp.int32), 0)
    limit = jnp.int32(rows)
    ends = jax.lax.associative_scan(lambda a, b: a + jnp.minimum(b, limit - a), jnp.minimum(sizes, limit))
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


def quantize_weights_fp8(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-output-channel fp8 quantization of expert weights: fp8.quantize_rows.

    Args:
      w: [E, N, K] float (bfloat16 or float32).
    Returns:
      (codes [E, N, K] float8_e4m3fn, scale [E, N] float32) with scale = max(max_k |w| / 448,
      2**-126) (hisparse_jax/fp8.py has the rule). A row of zeros gets codes 0 and dequantizes
      to 0; a row holding inf or NaN gets codes 0 and scale NaN, so its outputs are NaN in
      every implementation.
    """
    return fp8.quantize_rows(w)


# --------------------------------------------------------------------------- checks


_shape, _dtype = _checks.shape_of, _checks.dtype_of


def _fail(exc, message: str):
    raise exc(f"{_OP}: {message}")


def _check_operands(x, w, group_sizes, scale) -> None:
    if _dtype(x) not in _X_DTYPES:
        _fail(TypeError, f"x must be bfloat16 or float32, got {_dtype(x)}; cast it with .astype(jnp.bfloat16)")
    if len(_shape(x)) != 2:
        _fail(ValueError, f"x has shape {_shape(x)}; it must be [M, K] (rows sorted by expert)")
    M, K = _shape(x)
    if _dtype(w) not in _W_DTYPES:
        _fail(TypeError, f"w must be bfloat16, float8_e4m3fn or float32, got {_dtype(w)}; "
              "cast it to bfloat16 or quantize it with quantize_weights_fp8")
    if len(_shape(w)) != 3 or _shape(w)[2] != K:
        _fail(ValueError, f"w has shape {_shape(w)}; it must be [E, N, K] with K = {K} of x "
              "(transpose [E, K, N] weights with jnp.swapaxes(w, 1, 2))")
    E, N, _ = _shape(w)
    if E < 1:
        _fail(ValueError, "w has no experts (E = 0); it must be [E, N, K] with E >= 1")
    if _dtype(group_sizes) != np.int32:
        _fail(TypeError, f"group_sizes must be int32, got {_dtype(group_sizes)}; cast it with .astype(jnp.int32)")
    if _shape(group_sizes) != (E,):
        _fail(ValueError, f"group_sizes has shape {_shape(group_sizes)}; it must be [E] = {(E,)} "
              "(one row count per expert of w)")
    fp8 = _dtype(w) == _FP8
    if fp8 and scale is None:
        _fail(ValueError, "float8_e4m3fn w needs scale [E, N] float32; make both with quantize_weights_fp8")
    if scale is not None:
        if _dtype(scale) != np.float32:
            _fail(TypeError, f"scale must be float32, got {_dtype(scale)}; cast it with .astype(jnp.float32)")
        if _shape(scale) != (E, N):
            _fail(ValueError, f"scale has shape {_shape(scale)}; it must be [E, N] = {(E, N)} of w")


def _domain_error(x, w) -> str:
    """Why the CUDA kernel cannot take these operands ("" when it can)."""
    M, K = _shape(x)
    E, N, _ = _shape(w)
    if _dtype(x) != _BF16:
        return (f"x is {_dtype(x)}; the CUDA kernel takes bfloat16 x; cast it with .astype(jnp.bfloat16) "
                "or pass implementation='reference'")
    if _dtype(w) not in (_BF16, _FP8):
        return (f"w is {_dtype(w)}; the CUDA kernel takes bfloat16 or float8_e4m3fn w; cast it to bfloat16, "
                "quantize it with quantize_weights_fp8, or pass implementation='reference'")
    if E > MAX_EXPERTS:
        return f"w has E = {E} experts; the CUDA kernel takes at most {MAX_EXPERTS}; pass implementation='reference'"
    if N > MAX_N:
        return f"w has N = {N}; the CUDA kernel takes at most 2^24; pass implementation='reference'"
    if M > MAX_ROWS or not 1 <= K <= MAX_K:
        return (f"x has shape {(M, K)}; the CUDA kernel needs M < 2^31 and 1 <= K < 2^31; "
                "pass implementation='reference'")
    multiple = ROW_ALIGN_BYTES // _dtype(w).itemsize
    if K % multiple:
        return (f"x and w have K = {K}; the CUDA kernel needs a multiple of {multiple} with {_dtype(w)} w "
                "(16-byte rows); pad K with zeros or pass implementation='reference'")
    return ""

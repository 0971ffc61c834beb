"""Sparse MLA decode attention: one CUDA custom call that reads each selected record once from
where it lives (no gathered copy), or its XLA reference.

  out[i, h] = softmax(scale * q[i, h] . key) @ value   over request i's k selected tokens
              (source[i, index[i, j]], index -1 = none) and its open page (tail[i], tail_valid)

Records are MLA latents: W = 576 = 512 (kv_lora: the value) + 64 (rope), bfloat16. The contract,
the fixed split into 16 chunks and the rounding (p to bfloat16 before P @ V) are in
ffi/sparse_attention.h. The FFI custom call "hisparse_sparse_attention" runs on CUDA only; the
XLA reference below runs anywhere and follows the same arithmetic (chunks, stages, online
softmax), so the two agree to float32 rounding, not bit for bit. On one device the kernel is
batch-invariant (a request's bits do not depend on the batch) and source-invariant (hot buffer by
slot == device KV by record id). The open page is part of the call (merged after the chunks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks, _dispatch, targets
from ._dispatch import Implementation

_OP = "sparse_attention"

WIDTH = 576         # key width: latent + rope
VALUE_WIDTH = 512   # the value: the first 512 of a token
HEAD_TILE = 64      # H must be a multiple
CHUNKS = 16         # fixed split of the k * P tokens, whatever the batch
STAGE = 32          # tokens per online-softmax step
MAX_PAGE = 64
MAX_TOP_K = 8192    # the checked range (ffi/sparse_attention.h)

_BF16 = np.dtype(jnp.bfloat16)


def sparse_attention(
    q: jax.Array,
    source: jax.Array,
    index: jax.Array,
    tail: jax.Array,
    tail_valid: jax.Array,
    scale: float,
    *,
    layer: jax.Array | int = 0,
    implementation: Implementation = "auto",
) -> jax.Array:
    """One decode step's MLA attention over the selected records and the open page.

    Args:
      q: [b, H, 576] bfloat16, the absorbed query (round it to bfloat16 first); H a multiple of 64.
      source: [b, N, P, 576] bfloat16, each request's rows: its hot buffer ("hisparse", N = hot
        slots) or its device KV ("device", N = records); or [L, b, N, P, 576], every layer's
        (the stacked hot buffer, passed whole so that XLA copies no layer out of it) with
        `layer` picking one.
      index: [b, k] int32 rows of `source` to attend to; -1 (or any id outside [0, N)) = none.
        k * P must be a multiple of 512 (pad with -1).
      tail: [b, P, 576] bfloat16, the open page; tail_valid: [b, P] bool, its written tokens.
      scale: the softmax scale (a Python float).
      layer: int32 scalar (may be traced) or Python int, the layer of a stacked source; a layer
        outside [0, L) reads no record (only the open page counts). Ignored for a 4-d source.
      implementation: "ffi" (the CUDA kernels; an error elsewhere), "reference" (XLA, any
        backend) or "auto" ("ffi" on a CUDA backend with the handler registered).
    Returns:
      [b, H, 512] float32; zeros for a request with no valid token at all.
    """
    _check_operands(q, source, index, tail, tail_valid)
    _checks.check_int32(_OP, "layer", layer)
    if _shape(layer) != ():
        _fail(ValueError, f"layer has shape {_shape(layer)}; it must be a scalar")
    layer = jnp.asarray(layer, jnp.int32)
    impl = _dispatch.choose_implementation(_OP, implementation, targets.SPARSE_ATTENTION)
    if impl == "reference":
        return sparse_attention_reference(q, source, index, tail, tail_valid, scale, layer=layer)
    _dispatch.require_handler(_OP, targets.SPARSE_ATTENTION)
    b, H, _ = _shape(q)
    workspace = b * H * CHUNKS * (VALUE_WIDTH + 2)
    call = jax.ffi.ffi_call(targets.SPARSE_ATTENTION,
                            (jax.ShapeDtypeStruct((b, H, VALUE_WIDTH), jnp.float32),
                             jax.ShapeDtypeStruct((workspace,), jnp.float32)))
    out, _ = call(q, source, layer, index, tail, tail_valid, scale=np.float32(scale))
    return out


def sparse_attention_reference(q, source, index, tail, tail_valid, scale: float, *, layer=0) -> jax.Array:
    """The contract in XLA ops (the arguments of sparse_attention, any backend).

    Gathers the selected tokens (a copy: fine on CPU), then per chunk an online softmax over its
    stages in order, p rounded to bfloat16 before P @ V, then the chunks and the open page merged
    as ffi/sparse_attention.h says. Operands are widened to float32 (exact: a bfloat16 product
    is exact in float32; XLA:CPU has no bfloat16 x bfloat16 -> float32 dot) and accumulate in
    float32 at HIGHEST precision.
    """
    layer_ok = jnp.bool_(True)
    if len(_shape(source)) == 5:
        layer = jnp.asarray(layer, jnp.int32)
        layer_ok = (layer >= 0) & (layer < _shape(source)[0])
        source = jax.lax.dynamic_index_in_dim(source, jnp.clip(layer, 0, _shape(source)[0] - 1), keepdims=False)
    # One request at a time, by the same loop body whatever the batch: XLA:CPU compiles a batched
    # dot of one request differently from one of several (other bits), and the reference must be
    # batch-invariant like the kernel (a request alone == inside a batch).
    def one(args):
        return _one_request(*(x[None] for x in args), scale, layer_ok)[0]

    return jax.lax.map(one, (q, source, index, tail, tail_valid))


def _one_request(q, source, index, tail, tail_valid, scale: float, layer_ok) -> jax.Array:
    """sparse_attention_reference's arithmetic for a batch of one ([1, ...] operands, source
    [1, N, P, W] of the layer)."""
    f32, hi = jnp.float32, jax.lax.Precision.HIGHEST
    b, N, P, W = _shape(source)
    k = _shape(index)[1]
    T = k * P
    stages = T // (CHUNKS * STAGE)
    ok = (index >= 0) & (index < N) & layer_ok
    rows = jnp.where(ok, index, 0)
    keys = jnp.take_along_axis(source, rows[:, :, None, None], axis=1).reshape(b, T, W)
    valid = jnp.repeat(ok, P, axis=1)
    keys = jnp.where(valid[..., None], keys, jnp.zeros((), keys.dtype))
    q = q.astype(f32)
    keys = keys.astype(f32)
    s = jnp.einsum("bhd,btd->bht", q, keys, precision=hi) * f32(scale)
    s = jnp.where(valid[:, None, :], s, -jnp.inf)
    H = s.shape[1]
    s = s.reshape(b, H, CHUNKS, stages, STAGE)
    v = keys[..., :VALUE_WIDTH].reshape(b, CHUNKS, stages, STAGE, VALUE_WIDTH)

    def stage(carry, xs):
        m, l, o = carry  # [b, H, C], [b, H, C], [b, H, C, Dv]
        sj, vj = xs      # [b, H, C, St], [b, C, St, Dv]
        nxt = jnp.maximum(m, jnp.max(sj, axis=-1))
        alpha = jnp.where(m == -jnp.inf, 0.0, jnp.exp(m - nxt))
        p = jnp.where(sj == -jnp.inf, 0.0, jnp.exp(sj - nxt[..., None])).astype(jnp.bfloat16)
        l = alpha * l + jnp.sum(p.astype(f32), axis=-1)
        o = alpha[..., None] * o + jnp.einsum("bhct,bctv->bhcv", p.astype(f32), vj, precision=hi)
        return (nxt, l, o), None

    init = (jnp.full((b, H, CHUNKS), -jnp.inf, f32), jnp.zeros((b, H, CHUNKS), f32),
            jnp.zeros((b, H, CHUNKS, VALUE_WIDTH), f32))
    (m, l, o), _ = jax.lax.scan(stage, init, (jnp.moveaxis(s, 3, 0), jnp.moveaxis(v, 2, 0)))

    ts = jnp.einsum("bhd,bpd->bhp", q, tail.astype(f32), precision=hi) * f32(scale)
    ts = jnp.where(tail_valid[:, None, :], ts, -jnp.inf)
    big = jnp.maximum(jnp.max(m, axis=-1), jnp.max(ts, axis=-1))  # [b, H]
    w = jnp.where(m == -jnp.inf, 0.0, jnp.exp(m - big[..., None]))
    pt = jnp.where(ts == -jnp.inf, 0.0, jnp.exp(ts - big[..., None]))
    total = jnp.sum(w * l, axis=-1) + jnp.sum(pt, axis=-1)
    num = jnp.einsum("bhc,bhcv->bhv", w, o, precision=hi) + jnp.einsum(
        "bhp,bpv->bhv", pt, tail[..., :VALUE_WIDTH].astype(f32), precision=hi)
    return jnp.where(total[..., None] > 0, num / jnp.where(total > 0, total, 1.0)[..., None], 0.0)


# --------------------------------------------------------------------------- checks


_shape, _dtype = _checks.shape_of, _checks.dtype_of


def _fail(exc, message: str):
    raise exc(f"{_OP}: {message}")


def _check_operands(q, source, index, tail, tail_valid) -> None:
    for name, x in (("q", q), ("source", source), ("tail", tail)):
        if _dtype(x) != _BF16:
            _fail(TypeError, f"{name} must be bfloat16, got {_dtype(x)}; cast it with .astype(jnp.bfloat16)")
    _checks.check_int32(_OP, "index", index)
    if _dtype(tail_valid) != np.bool_:
        _fail(TypeError, f"tail_valid must be bool, got {_dtype(tail_valid)}; compare it (e.g. positions < n)")
    if len(_shape(q)) != 3 or _shape(q)[2] != WIDTH:
        _fail(ValueError, f"q has shape {_shape(q)}; it must be [b, H, 576] (the absorbed MLA query)")
    b, H, _ = _shape(q)
    if H % HEAD_TILE:
        _fail(ValueError, f"q has H = {H} heads; the op takes a multiple of {HEAD_TILE} (pad the heads with zeros)")
    src = _shape(source)[1:] if len(_shape(source)) == 5 else _shape(source)
    if len(src) != 4 or src[0] != b or src[3] != WIDTH:
        _fail(ValueError, f"source has shape {_shape(source)}; it must be [b, N, P, 576] or [L, b, N, P, 576] "
              f"with b = {b} of q")
    _, N, P, _ = src
    if not 1 <= P <= MAX_PAGE:
        _fail(ValueError, f"source has P = {P} tokens per record; the op takes 1 to {MAX_PAGE}")
    if N < 1 or N * P > 2**31:
        _fail(ValueError, f"source has N = {N} rows; the op takes 1 <= N <= 2^31 / P")
    if len(_shape(index)) != 2 or _shape(index)[0] != b:
        _fail(ValueError, f"index has shape {_shape(index)}; it must be [b, k] with b = {b} of q")
    k = _shape(index)[1]
    if k > MAX_TOP_K:
        _fail(ValueError, f"index has k = {k}; the op takes at most {MAX_TOP_K} selected records per request")
    if k < 1 or (k * P) % (CHUNKS * STAGE):
        _fail(ValueError, f"index has k = {k} (k * P = {k * P}); k * P must be a positive multiple of "
              f"{CHUNKS * STAGE}; pad the selection with -1")
    if _shape(tail) != (b, P, WIDTH):
        _fail(ValueError, f"tail has shape {_shape(tail)}; it must be [b, P, 576] = {(b, P, WIDTH)}")
    if _shape(tail_valid) != (b, P):
        _fail(ValueError, f"tail_valid has shape {_shape(tail_valid)}; it must be [b, P] = {(b, P)}")

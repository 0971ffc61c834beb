"""Batch invariance: a request's bits alone == its bits inside a batch, for the three kernels a
decode step runs per request (the indexer's scores, the top-k ids, sparse attention), in every
implementation this backend has. A split batch (overlapping one group's miss IO with another
group's compute) must decode bit for bit like the whole batch, so none of them may let the
batch size or the other requests change a request's arithmetic. Zero tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hisparse_jax as hs
from hisparse_jax.sparse_attention import WIDTH

from helpers import IMPLEMENTATIONS

BF16 = np.dtype(ml_dtypes.bfloat16)
ON_GPU = jax.default_backend() == "gpu"
# the XLA reference everywhere; the kernel where this backend has one
INDEXER_IMPLS = [
    # XLA's GPU dots pick their algorithm by shape: there the kernel is the batch-invariant path
    pytest.param("reference", marks=pytest.mark.skipif(ON_GPU, reason="the CUDA kernel is the GPU's path")),
    pytest.param("ffi", marks=pytest.mark.gpu),
]
ATTENTION_IMPLS = [
    # on the H200 XLA compiled the one-request loop of the reference to other bits than the
    # batch's: there the kernel is the batch-invariant path
    pytest.param("reference", marks=pytest.mark.skipif(ON_GPU, reason="the CUDA kernel is the GPU's path")),
    pytest.param("ffi", marks=pytest.mark.gpu),
]
ROWS = (0, 2, 4)  # first, middle, last request of a batch of 5


def _alone_equals_batched(fn, args, what):
    batched = np.asarray(fn(*args))
    for r in ROWS:
        alone = np.asarray(fn(*(a[r : r + 1] for a in args)))
        assert alone.shape[1:] == batched.shape[1:]
        assert np.array_equal(alone[0].view(np.uint8), batched[r].view(np.uint8)), f"{what}: request {r} alone != in the batch"


@pytest.mark.parametrize("impl", INDEXER_IMPLS)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-keys", "fp8-keys"])
def test_indexer_scores(impl, fp8):
    rng = np.random.default_rng(1)
    b, H, T, d = 5, 32, 700, 128
    q = rng.standard_normal((b, H, d)).astype(BF16)
    w = (rng.standard_normal((b, H)) / np.sqrt(H * d)).astype(np.float32)
    keys = jnp.asarray(rng.standard_normal((b, T, d)), jnp.bfloat16)
    scale = None
    if fp8:
        keys, scale = hs.quantize_keys_fp8(keys)
    lengths = np.asarray([700, 1, 350, 0, 699], np.int32)
    fn = jax.jit(lambda q, w, k, n, *s: hs.index_scores(q, w, k, n, key_scale=s[0] if s else None, implementation=impl))
    args = (q, w, np.asarray(keys), lengths) + ((np.asarray(scale),) if fp8 else ())
    _alone_equals_batched(fn, args, f"index_scores[{impl}]")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_topk_ids(impl, kind):
    rng = np.random.default_rng(2)
    b, R, k = 5, 4096, 256
    scores = rng.standard_normal((b, R)).astype(np.float32)
    if kind == "ties":  # the indexer's ReLU'd sums: many zeros and few distinct values
        scores = np.maximum(np.round(scores * 2) / 2, 0).astype(np.float32)
    sealed = np.asarray([R, 300, 4000, 0, 257], np.int32)
    fn = jax.jit(lambda s, n: hs.select_topk(s, n, k, implementation=impl))
    _alone_equals_batched(fn, (scores, sealed), f"select_topk[{impl}]")


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_sparse_attention_output(impl):
    rng = np.random.default_rng(3)
    b, H, k, N, W = 5, 64, 512, 800, WIDTH
    q = rng.uniform(-1, 1, (b, H, W)).astype(BF16)
    source = rng.uniform(-1, 1, (b, N, 1, W)).astype(BF16)
    tail = rng.uniform(-1, 1, (b, 1, W)).astype(BF16)
    index = np.stack([rng.permutation(N)[:k] for _ in range(b)]).astype(np.int32)
    index[rng.uniform(size=index.shape) < 0.1] = -1
    tail_valid = np.ones((b, 1), bool)
    fn = jax.jit(lambda *a: hs.sparse_attention(*a, 0.07, implementation=impl))
    _alone_equals_batched(fn, (q, source, index, tail, tail_valid), f"sparse_attention[{impl}]")

// The DSA lightning indexer's scoring step, framework-free: what every
// implementation of "hisparse_index_scores" computes.
//
// For each row b (a decode stream) and token t < T:
//
//   scores[b, t] = sum_{h < H} w[b, h] * relu(dot(q[b, h, :], key[b, t, :]) * key_scale[b, t])
//                                                        for t <  lengths[b]
//   scores[b, t] = -inf                                  for t >= lengths[b]
//
// read literally: lengths[b] <= 0 scores no token (the whole row is -inf), and
// lengths[b] >= T scores all T; nothing is clamped. -inf is the "not a
// candidate" sentinel: it sorts below every score, so a top-k over the row
// picks scored tokens first.
//
// Operands (row-major, dense):
//   q          [b, H, d]  bfloat16 or float32; one query per index head
//   w          [b, H]     float32; per-head weights. The caller folds the
//                         softmax-style constants (1/sqrt(H), 1/sqrt(d)) into
//                         w or q; nothing is scaled here.
//   key        [b, T, d]  bfloat16, or float8_e4m3fn with key_scale
//   key_scale  [b, T]     float32, fp8 keys only (DeepSeek's layout: d fp8
//                         values + one f32 scale = 132 B per token at d = 128).
//                         With bfloat16 keys there is no scale (factor 1).
//   lengths    [b]        int32
//   scores     [b, T]     float32
// Sizes: 1 <= H <= kIndexerMaxHeads; d a multiple of kIndexerDimMultiple, at
// most kIndexerMaxDim; float32 q also needs H * d <= kIndexerMaxF32QueryElements.
//
// Arithmetic. Every product and sum is float32 (bf16 and fp8 values convert to
// float32 exactly); relu(x) = max(x, 0) with NaN propagated. The orders of the
// two sums are fixed by each implementation but are not the same across them,
// so implementations agree within a rounding bound, not bit for bit:
//   - dot over d: the CUDA kernel accumulates on tensor cores (mma m16n8k16,
//     products exact, float32 accumulation) in chunks of 16 along d, chunks in
//     increasing order; float32 q is split exactly into three bfloat16 parts
//     (hi + mid + lo) whose products are accumulated into the same sum. The
//     XLA reference uses XLA's dot order.
//   - the head sum: the CUDA kernel runs four fused multiply-add chains, chain
//     j (j = 0..3) over the heads h with (h mod 8) / 2 == j in increasing h,
//     then adds the chains as (c0 + c1) + (c2 + c3).
// "The CUDA kernel" is either of two (indexer_cuda.h: register-q for bfloat16
// q with H <= 64 and d <= 128, in any of its launch shapes, general
// otherwise); both follow these orders step for step, so for the same
// operands they write the same bits. sm_90a builds add a third for fp8 keys
// with 32 < H <= 64, on wgmma m64nNk16 (one per chunk of 16 along d, in
// increasing order; the same head chains): held to the bound below, not to
// the others' bits. Which one runs depends on the operands' dtypes, H, d and
// the build, never on the batch alone in a way that changes bits: a row's
// scores are the same bits whatever batch it is in.
// Bound: |computed - exact| <= (n + H + 4) * 2^-23 * sum_h |w_h| * sum_i
// |q_hi| |key_i| |key_scale|, with n = d (bfloat16 q) or 3d (float32 q); 2^-23
// rather than 2^-24 because tensor cores may truncate when they accumulate.
// Each implementation is deterministic: the same inputs give the same bits on
// every run (the CUDA kernel uses no atomics and assigns work to threads by
// position only).
//
// Non-finite inputs give non-finite scores at the tokens they touch; whether a
// given one comes out as NaN or +-inf may differ between implementations. The
// fp8 NaN code (0x7f / 0xff) is not decoded by the CUDA kernel (it would read
// as +-480): fp8.quantize_rows (hisparse_jax/fp8.py) never writes one
// next to a finite scale; a row it cannot quantize gets a NaN scale instead,
// which makes that token's score NaN everywhere.
#ifndef HISPARSE_FFI_INDEXER_H_
#define HISPARSE_FFI_INDEXER_H_

#include <cstdint>

namespace hisparse {

enum class IndexQueryType : int32_t {
  kBf16 = 0,
  kF32 = 1,
};

enum class IndexKeyType : int32_t {
  kBf16 = 0,     // no scale
  kFp8E4m3 = 1,  // float8_e4m3fn with a float32 scale per token
};

inline constexpr int64_t kIndexerMaxHeads = 128;
inline constexpr int64_t kIndexerDimMultiple = 16;  // one tensor-core k-step
inline constexpr int64_t kIndexerMaxDim = 256;
// float32 q is staged as three bfloat16 copies; this keeps them in shared memory.
inline constexpr int64_t kIndexerMaxF32QueryElements = 128 * 128;

struct IndexerDims {
  int64_t rows = 0;    // b
  int64_t tokens = 0;  // T
  int64_t heads = 0;   // H
  int64_t dim = 0;     // d
  IndexQueryType query_type = IndexQueryType::kBf16;
  IndexKeyType key_type = IndexKeyType::kBf16;
};

struct IndexerBuffers {
  const void* query = nullptr;        // [b, H, d] bf16 or f32
  const float* weights = nullptr;     // [b, H]
  const void* keys = nullptr;         // [b, T, d] bf16 or fp8 e4m3fn
  const float* key_scale = nullptr;   // [b, T], fp8 keys only (else null)
  const int32_t* lengths = nullptr;   // [b]
  float* scores = nullptr;            // [b, T]
};

// The size limits above, as one message naming the operand ("" when they hold).
inline const char* IndexerSizeError(const IndexerDims& d) {
  if (d.heads < 1 || d.heads > kIndexerMaxHeads) return "q: H must be in [1, 128]";
  if (d.dim < kIndexerDimMultiple || d.dim % kIndexerDimMultiple != 0 || d.dim > kIndexerMaxDim)
    return "q: d must be a multiple of 16 in [16, 256]";
  if (d.query_type == IndexQueryType::kF32 && d.heads * d.dim > kIndexerMaxF32QueryElements)
    return "q: float32 q needs H * d <= 16384; pass q in bfloat16";
  return "";
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_INDEXER_H_

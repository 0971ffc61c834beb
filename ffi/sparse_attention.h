// Sparse MLA decode attention: the contract (framework-free; no XLA, no CUDA types).
//
// One decode step of one layer for b requests (streams). Request i attends, with every one of its
// H heads, to
//   - the k selected records of its stream, read IN PLACE from `source[layer][i]` by index (the hot
//     buffer by slot in "hisparse", the device KV by record id in full-KV): no gathered copy.
//     A record is P tokens x W = 576 values (512 latent = the value, then 64 rope), in the
//     record dtype (bfloat16 here). An index < 0 or >= N (padding, -1) contributes nothing.
//   - the open page `tail[i]`: P tokens, those with tail_valid[i][t] != 0.
// q is the absorbed query [b, H, 576] in the record dtype (the caller rounds it); the output is
// the latent [b, H, 512] float32:  out = softmax(scale * q . key) @ value over both blocks.
//
// Arithmetic (what every implementation reproduces; the CPU oracle in ffi/tests follows it):
//   The k*P selected tokens are cut into kSparseAttentionChunks FIXED chunks of k*P / chunks
//   tokens, whatever the batch, and each chunk into stages of kSparseAttentionStage tokens.
//   Per chunk, an online softmax over its stages (running max m, sum l, unnormalized o):
//     s_j   = float32(sum_d q[d] * key_j[d]) * scale     (bf16 products, float32 accumulation;
//                                                         -inf where token j is invalid)
//     m'    = max(m, max_j s_j);  alpha = exp(m - m') (0 while m = -inf)
//     p_j   = bfloat16(exp(s_j - m'))                    (0 where s_j = -inf)
//     l     = alpha * l + sum_j p_j;  o = alpha * o + sum_j p_j * value_j   (float32)
//   Then the chunks 0..C-1 (in that order, never arrival order) and the open page merge:
//     M = max(m_c, tail scores);  w_c = exp(m_c - M);  p_t = exp(s_t - M) (float32, not rounded)
//     out = (sum_c w_c o_c + sum_t p_t value_t) / (sum_c w_c l_c + sum_t p_t);  0 if nothing valid.
//   The order of the products inside one score (the tensor core's) is the device's own, so a CPU
//   and a GPU agree to rounding, not bit for bit. What IS exact on one device:
//     batch invariance: request i's output bits do not depend on b or on the other requests
//       (the split is fixed, each request's work is the same instructions on the same values);
//     source invariance: the same records read from the hot buffer by slot or from the device KV
//       by record id give the same bits (hisparse == full-KV).
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_H_
#define HISPARSE_FFI_SPARSE_ATTENTION_H_

#include <cstdint>

namespace hisparse {

inline constexpr int64_t kSparseAttentionWidth = 576;       // W: key width (latent + rope)
inline constexpr int64_t kSparseAttentionValueWidth = 512;  // the value: the first 512 of a token
inline constexpr int64_t kSparseAttentionHeadTile = 64;     // H must be a multiple
inline constexpr int64_t kSparseAttentionChunks = 16;       // fixed split of the k*P tokens
inline constexpr int64_t kSparseAttentionStage = 32;        // tokens per online-softmax step
inline constexpr int64_t kSparseAttentionMaxPage = 64;      // P <= this (the open page's scores)
inline constexpr int64_t kSparseAttentionMaxTopK = 8192;    // k <= this (the checked range: k * P tokens index as int)

struct SparseAttentionShape {
  int64_t batch = 0;   // b
  int64_t heads = 0;   // H
  int64_t top_k = 0;   // k selected records per request
  int64_t page = 1;    // P tokens per record (and in the open page)
  int64_t records = 0; // N: rows of one request's source (hot slots, or record ids)
  int64_t layers = 1;  // L: stacked sources [L, b, N, P, W] (the hot buffer of every layer); a
                       // device int32 `layer` picks one; outside [0, L) no record is read
};

// Empty when the shape is supported, else a one-line reason naming the argument and the fix.
inline const char* SparseAttentionShapeError(const SparseAttentionShape& s) {
  if (s.batch < 1) return "batch: must be >= 1";
  if (s.heads < 1 || s.heads % kSparseAttentionHeadTile != 0)
    return "heads: H must be a positive multiple of 64 (pad the heads)";
  if (s.page < 1 || s.page > kSparseAttentionMaxPage) return "page: P must be in [1, 64]";
  if (s.top_k > kSparseAttentionMaxTopK) return "top_k: k must be <= 8192";
  if (s.top_k < 1 || (s.top_k * s.page) % (kSparseAttentionChunks * kSparseAttentionStage) != 0)
    return "top_k: k * P must be a positive multiple of 512 (16 chunks x 32-token stages; pad the "
           "selection with -1)";
  if (s.layers < 1) return "source: L stacked layers must be >= 1";
  if (s.records < 1 || s.records > (int64_t{1} << 31) / s.page)
    return "source: N records per request must be in [1, 2^31 / P)";
  return nullptr;
}

// The contract's arithmetic on the CPU (sparse_attention_cpu.cc), float32 with the same chunks,
// stages, bf16 rounding of p and merge order as the CUDA kernels; a score's dot product is summed
// in double and rounded once (the tensor core's own order is not reproducible). Same tensors and
// layouts as LaunchSparseAttention (sparse_attention_cuda.h); bf16 as raw uint16 bits. The shape
// must pass SparseAttentionShapeError.
void SparseAttentionCpu(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                        const uint16_t* source, int32_t layer, const int32_t* index, const uint16_t* tail,
                        const uint8_t* tail_valid, float* out);

}  // namespace hisparse

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_H_

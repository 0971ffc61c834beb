// A grouped matmul for MoE experts at decode, framework-free: what every
// implementation of "hisparse_grouped_matmul" computes.
//
// Rows of x are sorted by group (expert): group e owns rows
// [offset_e, offset_e + size_e) with size_e = max(group_sizes[e], 0) and
// offset_e = size_0 + ... + size_{e-1}. For every row m < M and column n < N:
//
//   y[m, n] = scale[e, n] * sum_{k < K} x[m, k] * w[e, n, k]   if row m lies in group e
//   y[m, n] = +0                                               if it lies in no group
//                                                              (m >= size_0 + ... + size_{E-1})
//
// Operands (row-major, dense):
//   x            [M, K]     bfloat16; the routed tokens, sorted by expert
//   w            [E, N, K]  bfloat16 or float8_e4m3fn; K is contiguous, so a
//                           weight row streams along K
//   scale        [E, N]     float32, one factor per expert and output channel
//                           (fp8 dequantization; pass ones with bfloat16 w)
//   group_sizes  [E]        int32, rows of each expert; read on the device only
//   y            [M, N]     float32; every element is written
// Sizes: 1 <= E <= kGroupedMatmulMaxExperts; M, K <= INT32_MAX; N <= 2^24 (so
// the launch grid stays within CUDA's limit); K >= 1 and
// K * (bytes of a w element) a multiple of 16 (weight and x rows are read in
// 16-byte pieces): K % 8 == 0 for bfloat16 w, K % 16 == 0 for fp8 w. M = 0 or
// N = 0 is an empty y (nothing runs).
//
// Group sizes are data the host never reads (the call only enqueues work), so
// the contract defines every value, including malformed ones: a negative size
// counts as 0, the groups are laid out by the formula above in 64-bit
// integers, and a group reaching past row M is cut at M. Rows at or past M are
// never read or written, whatever the sizes. The MoE layer passes exact
// bincounts (sizes >= 0 summing to M); the clamping is the definition of the
// other cases, not a repair of valid ones.
//
// Reads. Only experts that own at least one row below M have their weights
// read: a decode step with few routed tokens reads only the experts it uses.
// An active expert's weights are read once per pass of up to a few dozen of
// its rows (grouped_matmul_cuda.h); decode batches fit one pass.
//
// Arithmetic. Products of bfloat16 (and fp8, widened exactly to bfloat16)
// values are exact in float32. Each weight row's K is cut into S slices of
// consecutive 64-byte pieces of the row (32 bf16 or 64 fp8 values of k; slice
// s holds pieces [s c, (s + 1) c) with c = ceil(pieces / S), the last slices
// possibly short or empty), where S depends on E, N, K and the weight type
// only (GroupedMatmulKSlices in grouped_matmul_cuda.h: S > 1 only when the
// weight has too few rows to keep the GPU busy, e.g. the shared expert, E = 1).
// Each slice's sum over its k is accumulated from +0 in float32 on tensor cores
// (mma m16n8k16) in 16-wide k-steps in increasing k order by one warp; the S
// partial sums are then added in float32 in slice order, ((p_0 + p_1) + p_2)
// + ..., by one warp (no atomics), the same order in every call and every
// launch variant: the CUDA kernel is deterministic and its bits depend on
// neither the batch (M, the group sizes), the other groups, nor the tuning.
// The sum is then multiplied by scale[e, n] (one float32 rounding). The XLA
// reference sums in XLA's order, so the two agree within a rounding bound,
// not bit for bit (any order of K float32 additions stays within it):
//   |y - exact| <= (K + 4) * 2^-23 * |scale[e, n]| * sum_k |x[m, k] * w[e, n, k]|
// (2^-23 rather than 2^-24 because tensor cores may truncate when they add).
//
// Non-finite x or w propagate as in float32 arithmetic. The fp8 NaN codes
// (0x7f, 0xff) are not decoded: the CUDA kernel reads them as +-480.
// fp8.quantize_rows (hisparse_jax/fp8.py) never writes one; a
// weight row it cannot quantize gets a NaN scale and zero codes instead.
#ifndef HISPARSE_FFI_GROUPED_MATMUL_H_
#define HISPARSE_FFI_GROUPED_MATMUL_H_

#include <cstdint>

namespace hisparse {

enum class GroupedWeightType : int32_t {
  kBf16 = 0,
  kFp8E4m3 = 1,  // float8_e4m3fn, dequantized by scale
};

inline constexpr int64_t kGroupedMatmulMaxExperts = 1024;
inline constexpr int64_t kGroupedMatmulMaxDim = INT32_MAX;  // M and K each
inline constexpr int64_t kGroupedMatmulMaxN = int64_t{1} << 24;
inline constexpr int64_t kGroupedMatmulRowAlignBytes = 16;  // K * element bytes is a multiple

struct GroupedMatmulDims {
  int64_t rows = 0;     // M
  int64_t experts = 0;  // E
  int64_t n = 0;        // N
  int64_t k = 0;        // K
  GroupedWeightType weight_type = GroupedWeightType::kBf16;
};

struct GroupedMatmulBuffers {
  const void* x = nullptr;              // [M, K] bf16
  const void* w = nullptr;              // [E, N, K] bf16 or fp8 e4m3fn
  const float* scale = nullptr;         // [E, N]
  const int32_t* group_sizes = nullptr;  // [E]
  float* y = nullptr;                   // [M, N]
};

inline int64_t GroupedWeightBytes(GroupedWeightType type) { return type == GroupedWeightType::kBf16 ? 2 : 1; }

// The size limits above, as one message naming the operand ("" when they hold).
inline const char* GroupedMatmulSizeError(const GroupedMatmulDims& d) {
  if (d.experts < 1 || d.experts > kGroupedMatmulMaxExperts) return "w: E must be in [1, 1024]";
  if (d.rows < 0 || d.rows > kGroupedMatmulMaxDim) return "x: M must be in [0, 2^31 - 1]";
  if (d.n < 0 || d.n > kGroupedMatmulMaxN) return "w: N must be in [0, 2^24]";
  if (d.k < 1 || d.k > kGroupedMatmulMaxDim) return "x: K must be in [1, 2^31 - 1]";
  if (d.k * GroupedWeightBytes(d.weight_type) % kGroupedMatmulRowAlignBytes != 0)
    return d.weight_type == GroupedWeightType::kBf16 ? "w: K must be a multiple of 8 with bfloat16 w"
                                                     : "w: K must be a multiple of 16 with float8_e4m3fn w";
  return "";
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_GROUPED_MATMUL_H_

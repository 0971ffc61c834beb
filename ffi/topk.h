// The TOP-K selection contract on raw pointers: no XLA, no nanobind, no CUDA.
//
// Layouts (row-major; "S" is the product of all stream dims, "R" the records
// of a stream, "k" the ids selected per stream):
//   scores   [S, R] float32  one score per record id
//   sealed   [S]    int32    records sealed per stream; selectable ids lie in
//                            [0, n) with n = min(max(sealed, 0), R)
//   selected [S, k] int32    output: selected ids ascending, then -1 padding
//
// Semantics (every implementation is bit-identical; the pure-JAX reference is
// hisparse_jax.topk.select_topk_reference, lax.top_k over masked scores):
//  1. Keys. Every id i of a row gets the 32-bit key
//       key(i) = TopkOrderedKey(bits of scores[s, i])   for i < n
//       key(i) = TopkOrderedKey(bits of -inf)            for n <= i < R
//     TopkOrderedKey maps a float's bits onto uint32 in IEEE 754 totalOrder,
//     the order of the comparator XLA builds for TopK (bitcast, flip the
//     magnitude of negatives, compare as signed):
//       -NaN (larger payload lower) < -inf < negative finite < -0.0 < +0.0
//         < positive finite < +inf < +NaN (larger payload higher).
//     -0.0 ranks strictly below +0.0; NaNs keep their sign and payload, so a
//     sealed -NaN ranks below every unsealed id's -inf.
//  2. Selection. The k ids with the largest keys, ties broken toward the lower
//     id: the first k of a stable descending sort of the R keys (what
//     lax.top_k(masked, k) returns as indices). Requires 0 <= k <= R.
//  3. Output. Of those k ids, the ones below n, in ascending id order, then -1
//     up to k. Fewer than k appear when n < k, or when unsealed ids (key of
//     -inf) outrank sealed ones (scores ranking below -inf: -NaN).
//  k = 0 selects nothing: the output is empty and nothing is read. Rows are
//  independent. sealed is clamped, never rejected: negative selects nothing,
//  above R selects among all R ids.
//
// Equivalently, with T the k-th largest key and t = k - #{i : key(i) > T}
// (1 <= t <= #{i : key(i) == T}): id i < n is selected iff key(i) > T, or
// key(i) == T and fewer than t ids below i have key T. Every implementation
// computes T by radix selection over the keys' digits (TopkDigit), then
// compacts in id order.
#ifndef HISPARSE_FFI_TOPK_H_
#define HISPARSE_FFI_TOPK_H_

#include <cstdint>

#ifdef __CUDACC__
#define HISPARSE_TOPK_HD __host__ __device__
#else
#define HISPARSE_TOPK_HD
#endif

namespace hisparse {

// Sizes of one TOP-K call; every field is checked by the FFI handler.
struct TopkDims {
  int64_t rows;     // S, the product of the stream dims
  int64_t records;  // R <= INT32_MAX
  int64_t top_k;    // k, 0 <= k <= R
};

struct TopkBuffers {
  const float* scores;  // [S, R]
  const int32_t* sealed;  // [S]
  int32_t* selected;    // [S, k]
};

// The key of rule 1: order-preserving for IEEE 754 totalOrder.
HISPARSE_TOPK_HD inline uint32_t TopkOrderedKey(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// TopkOrderedKey(bits of -inf): the key of every unsealed id.
inline constexpr uint32_t kTopkUnsealedKey = 0x007fffffu;

// Radix digits of a key, most significant first: 11 + 11 + 10 bits, so a
// histogram of any digit has at most kTopkBins bins.
inline constexpr int kTopkDigits = 3;
inline constexpr int kTopkBins = 2048;
HISPARSE_TOPK_HD inline int TopkDigitShift(int level) {
  return level == 0 ? 21 : (level == 1 ? 10 : 0);
}
HISPARSE_TOPK_HD inline uint32_t TopkDigit(uint32_t key, int level) {
  return (key >> TopkDigitShift(level)) & (level == 2 ? 0x3ffu : 0x7ffu);
}
// True when `key` agrees with `prefix` on every digit above `level` (the
// digits fixed so far); level 0 matches every key.
HISPARSE_TOPK_HD inline bool TopkPrefixMatches(uint32_t key, uint32_t prefix, int level) {
  if (level == 0) return true;
  const int shift = TopkDigitShift(level - 1);
  return (key >> shift) == (prefix >> shift);
}

// Selects every row on the calling thread (rules 1-3).
void TopkCpu(const TopkDims& dims, const TopkBuffers& io);

// uint32 words of the streaming CUDA kernel's per-row workspace: two bitmaps
// of R bits, each rounded up to whole 128-id tiles. The FFI call carries it as
// a second output [*S, TopkWorkspaceWords(R)] uint32 (XLA allocates it,
// nothing reads it afterwards) so that the handler never allocates; the CPU
// and the resident CUDA kernel ignore it.
inline constexpr int64_t TopkWorkspaceWords(int64_t records) {
  return 2 * 4 * ((records + 127) / 128);
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_H_

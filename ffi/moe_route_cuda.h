// MoE ROUTE on a CUDA device: the launcher on raw pointers, no XLA types. The
// kernel (moe_route_kernels.cu) is bit-identical to moe_route_cpu.cc for every
// input moe_route.h allows within the limits below.
//
// The op exists to replace a decode step's chain of ~8 tiny XLA kernels (each
// 1-4 us plus a launch gap) by one, so the whole routing is ONE launch of ONE
// 1024-thread block: no second launch, no workspace, no grid-wide sync. The
// grouping needs every token's choice, and a block is the largest set of
// threads that can meet at a barrier without a cooperative launch.
//  1. Choice and weights, a warp per token (tokens t = warp, warp + 32, ...;
//     the next token's scores are loaded while the current one is ranked).
//     Keys are TopkOrderedKey's, so the order (key descending, id ascending)
//     is a pair of unsigned compares. Two paths, picked on the host:
//     - registers (N <= 256, k <= 32; the decode shapes): lane l holds ids
//       [8l, 8l + 8) and sorts its 8 keys once (Batcher's 19 comparators on
//       32-bit keys, no ids carried). Each of the k rounds is one warp max
//       of the lanes' head keys (redux), a ballot of the lanes holding it
//       (the lowest lane holds the lowest ids, which is the tie rule across
//       lanes) and a pop from that lane's list; lane j keeps round j's key
//       and lane, and each lane a bit per round it won. Afterwards each
//       lane j < k finds its id in parallel: round j took position q of the
//       winning lane's keys in the order (key descending, slot ascending), q
//       = that lane's wins before round j, i.e. the (q - g)-th slot holding
//       the key after the g slots with larger keys - the tie rule inside a
//       lane. Carrying 64-bit (key, id) pairs through the sort and the pops
//       would cost ~1.4x the instructions, and a warp per token runs 8
//       tokens per SM sub-partition at T = 32, so issue slots are the budget
//       there. No __match_any_sync anywhere: its cost grows with the number
//       of distinct values, and the block's 32 warps queue for it.
//     - streaming (any N <= kMoeRouteMaxScores, any k): k stateless rounds,
//       each lane scanning its strided share of the row (read-only loads,
//       L1-cached) for the best (key, id) strictly after the previous winner,
//       then two warp maxima (key, then the lowest id among that key).
//       O(k N / 32) loads per lane: meant for shapes off the decode path.
//     Every lane sums the winners' scores left to right as the rounds produce
//     them (the same uniform value in every lane), so the k weights are then
//     computed in parallel, one lane each: MoeRouteReciprocal (div.full.f32,
//     as XLA:GPU divides), __fmul_rn, __fadd_rn (round to nearest, never
//     contracted into an FMA, subnormals kept); a NaN weight is stored as
//     kMoeRouteNanBits. A winner's score is rebuilt exactly from its key (the
//     key is a bijection of the bits), so the scores are read once.
//  2. Grouping, after a __syncthreads (the block's global writes of `chosen`
//     are visible to the block; the first 1024 pairs' local experts also go
//     to shared memory, so the decode shapes never re-read `chosen`). Pairs
//     are taken in chunks of 1024 in pair order, thread i pair c x 1024 + i:
//     - counts: the lanes of a warp sharing a local expert, from one
//       ballot per bit of E - 1 (a multisplit: 5 ballots at E = 32); each
//       group's lowest lane adds its size to the expert's counter (shared
//       integer atomics: the sums do not depend on timing) and, for the
//       first chunk, records it in counts[e][warp] (bytes, <= 32).
//     - starts: an exclusive scan of the counters, a warp per 32 experts,
//       the 32 warp totals scanned again by every warp (fetched by shuffle).
//     - places: a pair's place is its expert's start + the pairs of its
//       expert in earlier chunks + in earlier warps of its chunk (the bytes
//       counts[e][0..warp) summed with two 16-byte loads and __dp4a) + the
//       earlier lanes of its group. No order of atomics ever decides
//       a place, so every output is deterministic.
//     A chunk after the first re-reads `chosen` and meets at two barriers;
//     at most 1024 pairs (decode) take 3 barriers in all. Shared memory:
//     ~39 KB static (counts 32 KB for E = 1024 x 32 warps), no opt-in, so
//     nothing is queried or set per device and the launch is graph-capture
//     safe.
#ifndef HISPARSE_FFI_MOE_ROUTE_CUDA_H_
#define HISPARSE_FFI_MOE_ROUTE_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moe_route.h"

namespace hisparse {

// Largest sizes the CUDA kernel takes (the handler refuses others; Python's "auto" runs the XLA reference there).
inline constexpr int64_t kMoeRouteMaxPairs = int64_t{1} << 16;    // T x k
inline constexpr int64_t kMoeRouteMaxScores = int64_t{1} << 16;   // N
inline constexpr int64_t kMoeRouteMaxExperts = 1024;              // E

// Enqueues the whole routing of moe_route.h (rules 1-3) as ONE kernel launch
// on `stream` (also when T == 0: group_sizes is always written, with zeros
// then); no allocation, no host synchronization, no read of device data on
// the host; bit-identical to MoeRouteCpu. Requires dims checked by the
// handler and inside the limits above (cudaErrorInvalidValue otherwise,
// nothing enqueued).
cudaError_t LaunchMoeRoute(const MoeRouteDims& dims, const MoeRouteBuffers& io, cudaStream_t stream);

#ifdef __CUDACC__
// Rule 2's 1 / sum on a GPU: PTX div.full.f32, the instruction XLA:GPU compiles a float32 divide
// to (it passes LLVM -nvptx-prec-divf32=1). Within 2 ulp of the IEEE quotient, not always it; the
// same instruction keeps this kernel's weights the bits of the XLA reference on the same GPU.
__device__ __forceinline__ float MoeRouteReciprocal(float sum) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(1.0f), "f"(sum));
  return r;
}
#endif

}  // namespace hisparse

#endif  // HISPARSE_FFI_MOE_ROUTE_CUDA_H_

// The MoE ROUTE contract on raw pointers: no XLA, no nanobind, no CUDA.
//
// One call does a decode step's whole routing bookkeeping of a MoE layer: a
// token's k best experts, their weights, and the grouping of the (token,
// choice) pairs by local expert that the grouped matmul consumes. In XLA the
// same work is a chain of about eight small fusions or sorts a layer (each
// 1-4 us on an H200 and a launch apart: BENCHMARKS.md, the step's short
// kernels); here it is one launch.
//
// Layouts (row-major; T tokens, N router scores a token, k choices a token,
// E local experts, P = T x k pairs, pair p = token p / k, its choice p % k):
//   scores      [T, N] float32  router scores (the sigmoid, computed by XLA)
//   chosen      [T, k] int32    output: the k best expert ids, best first
//   weights     [T, k] float32  output: routing weights
//   order       [P]    int32    output: the pairs listed by local expert
//   inverse     [P]    int32    output: pair p's place in `order`
//   group_sizes [E]    int32    output: pairs of each local expert
//
// Semantics (every implementation is bit-identical; the pure-JAX reference is
// hisparse_jax.moe_route.route_experts_reference):
//  1. Choice. Expert i of token t has the key TopkOrderedKey(bits of
//     scores[t, i]) (ffi/topk.h: IEEE 754 totalOrder, -NaN < -inf < ... <
//     -0.0 < +0.0 < ... < +inf < +NaN). Experts rank by key descending, equal
//     keys by id ascending (a strict order: ids differ); chosen[t, j] is the
//     expert of rank j, j < k. This is jax.lax.top_k(scores, k)'s indices.
//  2. Weights. With top_j = scores[t, chosen[t, j]] (its bits, NaN included),
//     sum = (...((top_0 + top_1) + top_2) ... + top_{k-1}) and
//     weights[t, j] = (top_j * (1 / sum)) * scaling, every operation an IEEE 754
//     float32 operation rounded to nearest even (no fused multiply-add, no
//     reassociation) in the platform's subnormal mode: the CUDA kernel keeps
//     subnormals, as XLA:GPU does; the CPU handler runs on XLA:CPU's threads,
//     which flush subnormal inputs and results to signed zero (DAZ and FTZ),
//     as XLA's own CPU ops do, so the XLA reference matches it on each
//     platform (a CPU caller outside XLA keeps subnormals, like the GPU).
//     One exception, on a GPU: 1 / sum is PTX div.full.f32 (within 2 ulp of
//     the IEEE quotient, not always it), because XLA:GPU compiles a float32
//     divide to that instruction; so on each platform the weights are the
//     bits of the XLA reference compiled there.
//     A weight that comes out NaN is
//     stored as the quiet NaN 0x7FC00000, whatever NaN the arithmetic made
//     (CPUs propagate an operand's payload, GPUs make their own).
//  3. Grouping. Pair p's local expert is local_p = chosen[p / k, p % k] mod E.
//     inverse[p] = #{q : local_q < local_p, or local_q == local_p and q < p}
//     (its place in the stable sort of the pairs by local expert),
//     order[inverse[p]] = p, group_sizes[e] = #{p : local_p == e}.
//  T = 0 writes only group_sizes (zeros). Tokens are independent in 1 and 2;
//  the grouping depends on every token of the call.
#ifndef HISPARSE_FFI_MOE_ROUTE_H_
#define HISPARSE_FFI_MOE_ROUTE_H_

#include <cstdint>

namespace hisparse {

// Sizes of one ROUTE call; every field is checked by the FFI handler.
// The one NaN a weight is stored as (rule 2).
inline constexpr uint32_t kMoeRouteNanBits = 0x7FC00000u;

struct MoeRouteDims {
  int64_t tokens;   // T >= 0
  int64_t scores;   // N >= 1, N <= INT32_MAX
  int64_t top_k;    // k, 1 <= k <= N; T x k <= INT32_MAX
  int64_t experts;  // E >= 1, E <= INT32_MAX
  float scaling;    // the weights' factor (rule 2)
};

struct MoeRouteBuffers {
  const float* scores;   // [T, N]
  int32_t* chosen;       // [T, k]
  float* weights;        // [T, k]
  int32_t* order;        // [T x k]
  int32_t* inverse;      // [T x k]
  int32_t* group_sizes;  // [E]
};

// Routes every token on the calling thread (rules 1-3).
void MoeRouteCpu(const MoeRouteDims& dims, const MoeRouteBuffers& io);

}  // namespace hisparse

#endif  // HISPARSE_FFI_MOE_ROUTE_H_

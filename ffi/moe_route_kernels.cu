// MoE ROUTE on CUDA: the contract of moe_route.h in one launch of one
// 1024-thread block, bit-identical to moe_route_cpu.cc. The design, and why,
// is in moe_route_cuda.h; the comments here say how.
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_route.h"
#include "moe_route_cuda.h"
#include "topk.h"  // TopkOrderedKey

namespace hisparse {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
// Register path: scores per lane, so at most 256 scores a token, and at most
// one choice per lane.
constexpr int kLaneScores = 8;
constexpr int kRegisterMaxScores = kWarp * kLaneScores;
constexpr int kRegisterMaxTopK = kWarp;
// Pairs ranked per chunk of the grouping: one per thread.
constexpr int kChunk = kThreads;
// A lane's local expert when it holds no pair (never a real expert).
constexpr uint32_t kNoExpert = 0xffffu;

static_assert(kMoeRouteMaxExperts <= kThreads, "the scan gives each expert one thread");
static_assert(kMoeRouteMaxExperts < kNoExpert, "kNoExpert is no expert");
static_assert(kMoeRouteMaxScores <= 0x10000, "ids fit the 17-bit low half of a Composite");
static_assert(kMoeRouteMaxPairs <= INT32_MAX / 2, "pairs and places stay in int32");

struct Args {
  const float* scores;  // read-only for the whole launch: __ldg
  int32_t* chosen;                   // written, then read back by other warps: plain loads
  float* weights;
  int32_t* order;
  int32_t* inverse;
  int32_t* group_sizes;
  int32_t tokens, n, k, experts;
  // ceil(2^32 / E): id mod E = id - E * ((id * magic) >> 32) for id < 2^16,
  // E <= 2^10 (the error of the quotient stays below 2^-16 < 1 / E).
  uint64_t expert_magic;
  int32_t expert_bits;  // bits of E - 1: local experts differ in these
  float scaling;
  bool vec4;  // scores 16-byte aligned and N % 4 == 0: every row's float4 loads are aligned
};

__device__ __forceinline__ uint32_t KeyOf(float x) { return TopkOrderedKey(__float_as_uint(x)); }

// The score whose key is `key` (TopkOrderedKey inverted: its exact bits).
__device__ __forceinline__ float ValueOf(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

__device__ __forceinline__ uint32_t LocalExpert(uint32_t id, const Args& a) {
  const uint32_t quotient = static_cast<uint32_t>((id * a.expert_magic) >> 32);
  return id - quotient * static_cast<uint32_t>(a.experts);
}

// Rule 2's weight from the choice's score and the token's sum.
__device__ __forceinline__ float Weight(float top, float sum, float scaling) {
  const float w = __fmul_rn(__fmul_rn(top, MoeRouteReciprocal(sum)), scaling);
  return isnan(w) ? __uint_as_float(kMoeRouteNanBits) : w;
}

// Records the expert of pair p; its local expert goes to shared memory too
// when p is in the first chunk (the grouping then reads no global memory).
__device__ __forceinline__ void WriteChoice(const Args& a, uint16_t* first_local, int p, uint32_t id) {
  a.chosen[p] = static_cast<int32_t>(id);
  if (p < kChunk) first_local[p] = static_cast<uint16_t>(LocalExpert(id, a));
}

// ---------------------------------------------------------------------------
// Choice, register path (N <= 256, k <= 32).

// Larger first.
__device__ __forceinline__ void Exchange(uint32_t& x, uint32_t& y) {
  const uint32_t hi = max(x, y);
  y = min(x, y);
  x = hi;
}

// Batcher's odd-even merge sort of 8 keys, descending: 19 comparators, depth 6.
__device__ __forceinline__ void SortDescending(uint32_t (&s)[kLaneScores]) {
  Exchange(s[0], s[1]); Exchange(s[2], s[3]); Exchange(s[4], s[5]); Exchange(s[6], s[7]);
  Exchange(s[0], s[2]); Exchange(s[1], s[3]); Exchange(s[4], s[6]); Exchange(s[5], s[7]);
  Exchange(s[1], s[2]); Exchange(s[5], s[6]);
  Exchange(s[0], s[4]); Exchange(s[1], s[5]); Exchange(s[2], s[6]); Exchange(s[3], s[7]);
  Exchange(s[2], s[4]); Exchange(s[3], s[5]);
  Exchange(s[1], s[2]); Exchange(s[3], s[4]); Exchange(s[5], s[6]);
}

// Lane `lane`'s scores of token t: ids [8 lane, 8 lane + 8), 0 past N.
__device__ __forceinline__ void LoadLane(const Args& a, int t, int lane, float (&x)[kLaneScores]) {
  const float* row = a.scores + static_cast<int64_t>(t) * a.n;
  const int first = lane * kLaneScores;
  if (a.vec4 && first + kLaneScores <= a.n) {
    const float4 u = __ldg(reinterpret_cast<const float4*>(row + first));
    const float4 v = __ldg(reinterpret_cast<const float4*>(row + first + 4));
    x[0] = u.x; x[1] = u.y; x[2] = u.z; x[3] = u.w;
    x[4] = v.x; x[5] = v.y; x[6] = v.z; x[7] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < kLaneScores; ++i) x[i] = first + i < a.n ? __ldg(row + first + i) : 0.0f;
  }
}

// Token t's k choices and weights, from the scores `x` its lanes loaded.
__device__ __forceinline__ void ChooseToken(const Args& a, int t, int lane, const float (&x)[kLaneScores],
                                            uint16_t* first_local) {
  // Slots past N get key 0, below or equal to every real key; `avail` (the
  // lane's real keys not yet taken) keeps them out of every ballot.
  const int real = min(max(a.n - lane * kLaneScores, 0), kLaneScores);
  uint32_t key[kLaneScores], s[kLaneScores];
#pragma unroll
  for (int i = 0; i < kLaneScores; ++i) {
    key[i] = i < real ? KeyOf(x[i]) : 0u;
    s[i] = key[i];
  }
  SortDescending(s);
  int avail = real;
  unsigned won = 0;     // bit j: this lane won round j
  uint32_t my_key = 0;  // lane j < k: round j's key and winning lane
  int my_lane = 0;
  float sum = 0.0f;
  for (int j = 0; j < a.k; ++j) {
    // Every lane's head is its largest remaining key (0 once exhausted); a
    // real key remains somewhere (k <= N), so the max is the largest
    // remaining real key and some lane with avail > 0 holds it.
    const uint32_t top = __reduce_max_sync(kFullMask, s[0]);
    const unsigned holders = __ballot_sync(kFullMask, avail > 0 && s[0] == top);
    const int winner = __ffs(holders) - 1;
    const float value = ValueOf(top);
    sum = j == 0 ? value : __fadd_rn(sum, value);
    if (lane == j) {
      my_key = top;
      my_lane = winner;
    }
    if (lane == winner) {
#pragma unroll
      for (int i = 0; i + 1 < kLaneScores; ++i) s[i] = s[i + 1];
      s[kLaneScores - 1] = 0;
      --avail;
      won |= 1u << j;
    }
  }
  // Lane j < k: the id of round j. The winning lane w had popped q keys
  // before round j (its `won` bits below j), so round j took position q of
  // w's keys in the order (key descending, slot ascending): after the g slots
  // with a larger key, the (q - g)-th slot holding the key (slots past N hold
  // key 0, but after every real slot, and q - g stays below the real ones).
  // Nothing here costs more with ties (a __match_any_sync over 32 distinct
  // values would: its cost grows with the distinct values).
  const bool mine = lane < a.k;
  const unsigned their_won = __shfl_sync(kFullMask, won, my_lane);
  int m = __popc(their_won & ((1u << lane) - 1u));
  uint32_t theirs[kLaneScores];
#pragma unroll
  for (int i = 0; i < kLaneScores; ++i) {
    theirs[i] = __shfl_sync(kFullMask, key[i], my_lane);
    m -= theirs[i] > my_key;
  }
  int slot = 0, seen = 0;
#pragma unroll
  for (int i = 0; i < kLaneScores; ++i) {
    const bool match = theirs[i] == my_key;
    if (match && seen == m) slot = i;
    seen += match;
  }
  if (mine) {
    const int p = t * a.k + lane;
    WriteChoice(a, first_local, p, static_cast<uint32_t>(my_lane * kLaneScores + slot));
    a.weights[p] = Weight(ValueOf(my_key), sum, a.scaling);
  }
}

__device__ __forceinline__ void ChooseInRegisters(const Args& a, int lane, int warp, uint16_t* first_local) {
  if (warp >= a.tokens) return;
  float x[kLaneScores];
  LoadLane(a, warp, lane, x);
  for (int t = warp; t < a.tokens; t += kWarps) {
    // The next token's loads are in flight while this one is ranked.
    const bool more = t + kWarps < a.tokens;
    float next[kLaneScores];
    if (more) LoadLane(a, t + kWarps, lane, next);
    ChooseToken(a, t, lane, x, first_local);
    if (more) {
#pragma unroll
      for (int i = 0; i < kLaneScores; ++i) x[i] = next[i];
    }
  }
}

// ---------------------------------------------------------------------------
// Choice, streaming path (any N, any k).

// The strict order (key descending, id ascending) as one unsigned compare:
// larger is better. The low half is never 0 (0 means "no candidate") and the
// whole never ~0 (the first round's bound).
__device__ __forceinline__ uint64_t Composite(uint32_t key, uint32_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0x1ffffu - id);
}

__device__ __forceinline__ void ChooseStreaming(const Args& a, int lane, int warp, uint16_t* first_local) {
  for (int t = warp; t < a.tokens; t += kWarps) {
    const float* row = a.scores + static_cast<int64_t>(t) * a.n;
    const int base = t * a.k;
    uint64_t previous = ~0ull;  // the last winner: this round takes the best below it
    float sum = 0.0f, held = 0.0f;
    for (int j = 0; j < a.k; ++j) {
      uint64_t best = 0;
      for (int i = lane; i < a.n; i += kWarp) {
        const uint64_t c = Composite(KeyOf(__ldg(row + i)), static_cast<uint32_t>(i));
        if (c < previous && c > best) best = c;
      }
      // Lanes without a candidate offer 0, below or equal to any key; the
      // lowest id among the lanes holding the largest key wins.
      const uint32_t high = static_cast<uint32_t>(best >> 32);
      const uint32_t top = __reduce_max_sync(kFullMask, high);
      const uint32_t low = __reduce_max_sync(kFullMask, best != 0 && high == top ? static_cast<uint32_t>(best) : 0u);
      previous = (static_cast<uint64_t>(top) << 32) | low;
      const float value = ValueOf(top);
      sum = j == 0 ? value : __fadd_rn(sum, value);
      if (lane == (j & (kWarp - 1))) {
        WriteChoice(a, first_local, base + j, 0x1ffffu - low);
        // Lane j % 32 weighs choice j: it keeps the score (in weights, past 32).
        if (j < kWarp) {
          held = value;
        } else {
          a.weights[base + j] = value;
        }
      }
    }
    for (int j = lane; j < a.k; j += kWarp) {
      const float value = j < kWarp ? held : a.weights[base + j];  // this lane's own write
      a.weights[base + j] = Weight(value, sum, a.scaling);
    }
  }
}

// ---------------------------------------------------------------------------
// Grouping.

// The bytes of `counts` row (32 bytes: one per warp) summed: those of warps
// below `warp` into `ahead`, all into `total`.
__device__ __forceinline__ void SumRow(const uint8_t* counts_row, int warp, int& ahead, int& total) {
  const uint4 lo = reinterpret_cast<const uint4*>(counts_row)[0];
  const uint4 hi = reinterpret_cast<const uint4*>(counts_row)[1];
  const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  uint32_t below = 0, all = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int keep = min(max(warp - 4 * i, 0), 4);  // bytes of word i below `warp`
    const uint32_t mask = keep == 4 ? 0xffffffffu : (1u << (8 * keep)) - 1u;
    below = __dp4a(words[i] & mask, 0x01010101u, below);
    all = __dp4a(words[i], 0x01010101u, all);
  }
  ahead = static_cast<int>(below);
  total = static_cast<int>(all);
}

// The lanes of this warp whose valid pair has local expert e (meaningful in
// valid lanes only): one ballot per bit of the expert ids. __match_any_sync
// would do it in one instruction, but its cost grows with the distinct values
// (up to 32 here), and the block's warps queue for it.
__device__ __forceinline__ unsigned SameExpert(uint32_t e, bool valid, int expert_bits) {
  unsigned same = __ballot_sync(kFullMask, valid);
  for (int b = 0; b < expert_bits; ++b) {
    const bool one = (e >> b) & 1u;
    const unsigned ones = __ballot_sync(kFullMask, one);
    same &= one ? ones : ~ones;
  }
  return same;
}

template <bool kRegisters>
__global__ void __launch_bounds__(kThreads, 1) MoeRouteKernel(Args a) {
  // counts[e * 32 + w]: pairs of local expert e in warp w of the current chunk.
  __shared__ __align__(16) uint8_t counts[kMoeRouteMaxExperts * kWarps];
  // The group sizes, then each expert's place among the 32 experts of its
  // scan warp, advanced past each chunk's pairs.
  __shared__ int32_t start[kMoeRouteMaxExperts];
  __shared__ uint16_t first_local[kChunk];  // the first chunk's local experts
  __shared__ int32_t warp_totals[kWarps];

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const unsigned lower_lanes = (1u << lane) - 1u;
  if (tid < a.experts) {
    uint4* row = reinterpret_cast<uint4*>(counts + tid * kWarps);
    row[0] = make_uint4(0, 0, 0, 0);
    row[1] = make_uint4(0, 0, 0, 0);
    start[tid] = 0;
  }

  if constexpr (kRegisters) {
    ChooseInRegisters(a, lane, warp, first_local);
  } else {
    ChooseStreaming(a, lane, warp, first_local);
  }
  __syncthreads();  // chosen (global), first_local, the zeroed counts and starts

  // Counts. Thread i takes pair c x 1024 + i of chunk c.
  const int pairs = a.tokens * a.k;
  const int chunks = (pairs + kChunk - 1) / kChunk;
  uint32_t first_expert = kNoExpert;
  unsigned first_same = 0;
  for (int c = 0; c < chunks; ++c) {
    const int p = c * kChunk + tid;
    const bool valid = p < pairs;
    const uint32_t e = !valid ? kNoExpert
                              : (c == 0 ? first_local[tid] : LocalExpert(static_cast<uint32_t>(a.chosen[p]), a));
    const unsigned same = SameExpert(e, valid, a.expert_bits);
    if (valid && (same & lower_lanes) == 0) {  // the lowest lane of its group
      const int n = __popc(same);
      atomicAdd(&start[e], n);
      if (c == 0) counts[e * kWarps + warp] = static_cast<uint8_t>(n);
    }
    if (c == 0) {
      first_expert = e;
      first_same = same;
    }
  }
  __syncthreads();

  // Starts: warp w scans experts [32 w, 32 w + 32).
  {
    const int e = tid;
    const int size = e < a.experts ? start[e] : 0;
    int inclusive = size;
#pragma unroll
    for (int d = 1; d < kWarp; d *= 2) {
      const int up = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (e < a.experts) {
      start[e] = inclusive - size;
      a.group_sizes[e] = size;
    }
    if (lane == kWarp - 1) warp_totals[warp] = inclusive;
  }
  __syncthreads();
  // Lane l: the pairs of the experts below 32 l (every warp scans the totals).
  int below_range;
  {
    const int total = warp_totals[lane];
    int inclusive = total;
#pragma unroll
    for (int d = 1; d < kWarp; d *= 2) {
      const int up = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    below_range = inclusive - total;
  }

  // Places.
  for (int c = 0; c < chunks; ++c) {
    const int p = c * kChunk + tid;
    const bool valid = p < pairs;
    uint32_t e;
    unsigned same;
    if (c == 0) {
      e = first_expert;
      same = first_same;
    } else {
      e = !valid ? kNoExpert : LocalExpert(static_cast<uint32_t>(a.chosen[p]), a);
      same = SameExpert(e, valid, a.expert_bits);
      if (valid && (same & lower_lanes) == 0) counts[e * kWarps + warp] = static_cast<uint8_t>(__popc(same));
      __syncthreads();  // this chunk's counts; the previous chunk's starts
    }
    const int rank = __popc(same & lower_lanes);
    const int range_base = __shfl_sync(kFullMask, below_range, valid ? static_cast<int>(e / kWarp) : 0);
    int ahead = 0, total = 0;
    if (valid) {
      SumRow(counts + e * kWarps, warp, ahead, total);
      const int place = range_base + start[e] + ahead + rank;
      a.inverse[p] = place;
      a.order[place] = p;
    }
    if (c + 1 < chunks) {
      __syncthreads();  // every read of this chunk's counts and starts
      if (valid && (same & lower_lanes) == 0) counts[e * kWarps + warp] = 0;
      if (valid && ahead + rank + 1 == total) start[e] += total;  // the expert's last pair of the chunk
      __syncwarp();  // a warp's counts entries: zeroed before its next chunk writes them
    }
  }
}

}  // namespace

cudaError_t LaunchMoeRoute(const MoeRouteDims& d, const MoeRouteBuffers& io, cudaStream_t stream) {
  if (d.tokens < 0 || d.scores < 1 || d.scores > kMoeRouteMaxScores || d.top_k < 1 || d.top_k > d.scores ||
      d.experts < 1 || d.experts > kMoeRouteMaxExperts || d.tokens > kMoeRouteMaxPairs ||
      d.tokens * d.top_k > kMoeRouteMaxPairs)
    return cudaErrorInvalidValue;
  Args a;
  a.scores = io.scores;
  a.chosen = io.chosen;
  a.weights = io.weights;
  a.order = io.order;
  a.inverse = io.inverse;
  a.group_sizes = io.group_sizes;
  a.tokens = static_cast<int32_t>(d.tokens);
  a.n = static_cast<int32_t>(d.scores);
  a.k = static_cast<int32_t>(d.top_k);
  a.experts = static_cast<int32_t>(d.experts);
  a.expert_magic = ((uint64_t{1} << 32) + static_cast<uint64_t>(d.experts) - 1) / static_cast<uint64_t>(d.experts);
  a.expert_bits = 0;
  while ((int64_t{1} << a.expert_bits) < d.experts) ++a.expert_bits;
  a.scaling = d.scaling;
  a.vec4 = reinterpret_cast<uintptr_t>(io.scores) % 16 == 0 && d.scores % 4 == 0;
  if (d.scores <= kRegisterMaxScores && d.top_k <= kRegisterMaxTopK) {
    MoeRouteKernel<true><<<1, kThreads, 0, stream>>>(a);
  } else {
    MoeRouteKernel<false><<<1, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace hisparse

// TOP-K on CUDA: the contract of topk.h, bit-identical to topk_cpu.cc. Two
// kernels (see topk_cuda.h for when each runs), both finding the k-th largest
// key T by radix selection over the 11/11/10-bit digits of topk.h, with the
// blocks of a row (a thread block cluster) exchanging counts through
// distributed shared memory, the unsealed ids (R - n ids of key
// kTopkUnsealedKey) entering every count as one number, never as data, and
// every block of a row choosing the same bucket from the same counts. Only
// counts go through atomics, so every result is independent of thread timing.
//
// The resident kernel (few rows: the latency of a decode step): one
// 1024-thread block per SM, a cluster of C blocks per row, block r owning the
// ids [r x slice, (r + 1) x slice) with slice <= kTopkResidentMaxSlice.
//   1. Every block starts an asynchronous copy of its slice's scores into
//      shared memory (the only read of the scores), and meanwhile loads the
//      same sample of the row (4 ids per thread, spread evenly), histograms
//      its top digit and finds the bucket e where the sample's estimate of
//      the ids at or above a bucket reaches k (and the one where it reaches
//      4k): the same e in every block, with no exchange.
//   2. One pass over the slice counts the ids at or above five boundaries of
//      the top digit: e + 1, e, e - 1, e - 2 and the 4k estimate. A cluster
//      barrier sums the counts: the first boundary with >= k ids at or above
//      it brackets T's top-digit bucket; adjacent boundaries (the usual case)
//      fix it without any histogram.
//   3. Each block gathers its ids at or above that boundary (every id the
//      selection can take: the candidates) into a list in id order, when
//      they fit; otherwise its later passes visit the whole slice, filtered.
//   4. Usually the row's candidates (a few thousand) fit in one block: after
//      one more barrier every block copies all the candidates' keys (a few KB
//      through distributed shared memory) and resolves the remaining digits
//      alone, learning from the merged list, block after block, how many
//      selected ids the lower-ranked blocks hold.
//      Otherwise (ties, quantized or adversarial scores) each digit is a
//      histogram merged by reduce-scatter: each block sums 1/C of the bins
//      over the cluster, so a block moves ~8 KB per digit rather than every
//      peer's 8 KB histogram, two barriers per digit, and one more barrier
//      exchanges the blocks' output counts.
//   5. Output: each warp counts its ids above T and equal to T, and writes
//      them at G-before + min(ties, E-before) in ascending id order (ties in
//      id order, the lowest ids first). The last block writes the -1 padding.
// A typical row thus reads its scores once and meets at 2 cluster barriers
// and a split one at the exit.
//
// The streaming kernel (rows too long for the resident one), described in
// its own section below, reads the scores from global memory at every pass.
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "topk_cuda.h"

namespace hisparse {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxDevices = 64;

// Cluster primitives; a cluster of one is a plain block (no cluster launch).
template <int kCluster>
struct Cluster {
  static __device__ __forceinline__ unsigned Rank() {
    if constexpr (kCluster == 1) {
      return 0;
    } else {
      return cg::this_cluster().block_rank();
    }
  }
  // Barrier over the cluster's threads; shared-memory writes before it are
  // visible to every block of the cluster after it.
  static __device__ __forceinline__ void Sync() {
    if constexpr (kCluster == 1) {
      __syncthreads();
    } else {
      cg::this_cluster().sync();
    }
  }
  // Sync split in two: Arrive once this block reads no peer's shared memory
  // any more, Wait before it exits (a block's shared memory must outlive its
  // peers' reads of it). Work between the two overlaps the barrier.
  static __device__ __forceinline__ void Arrive() {
    if constexpr (kCluster > 1) (void)cg::this_cluster().barrier_arrive();
  }
  static __device__ __forceinline__ void Wait() {
    if constexpr (kCluster > 1) cg::this_cluster().barrier_wait();
  }
  // `p` in the shared memory of block `rank` of the cluster.
  template <typename T>
  static __device__ __forceinline__ T* Map(T* p, unsigned rank) {
    if constexpr (kCluster == 1) {
      return p;
    } else {
      return cg::this_cluster().map_shared_rank(p, rank);
    }
  }
};

__device__ __forceinline__ uint32_t KeyOf(float score) {
  return TopkOrderedKey(__float_as_uint(score));
}

// Adds 1 to hist[bin] for every active lane; warp-collective. Shared-memory
// atomics on one address serialize, so a warp whose active lanes share one
// bin (ties, quantized scores, a narrow bucket) adds its count once.
__device__ __forceinline__ void HistogramAdd(uint32_t* hist, uint32_t bin, bool active, int lane) {
  const unsigned lanes = __ballot_sync(kFullMask, active);
  if (lanes == 0) return;
  const int leader = __ffs(lanes) - 1;
  const uint32_t leader_bin = __shfl_sync(kFullMask, bin, leader);
  if (__all_sync(kFullMask, !active || bin == leader_bin)) {
    if (lane == leader) atomicAdd(&hist[leader_bin], static_cast<uint32_t>(__popc(lanes)));
  } else if (active) {
    atomicAdd(&hist[bin], 1u);
  }
}

// A lane's 4 consecutive ids: their keys and which lie in the range.
struct Quad {
  uint32_t key[4];
  unsigned valid;  // bit j: id first + j lies below `end`
};

__device__ __forceinline__ Quad LoadQuad(const float* row, int first, int end, bool vec4) {
  Quad q;
  if (vec4 && first + 3 < end) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(row + first));
    q.key[0] = KeyOf(v.x);
    q.key[1] = KeyOf(v.y);
    q.key[2] = KeyOf(v.z);
    q.key[3] = KeyOf(v.w);
    q.valid = 0xfu;
    return q;
  }
  q.valid = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool in = first + j < end;
    q.key[j] = in ? KeyOf(__ldg(row + first + j)) : 0u;
    q.valid |= in ? 1u << j : 0u;
  }
  return q;
}

// ===========================================================================
// The streaming kernel: a cluster of C blocks per row (C = 1 for many rows).
// Block r of a row owns the ids [r x slice, (r + 1) x slice), slice a
// multiple of 128, and two bitmaps of them in the workspace: G (key > T,
// always selected) and E (key == T, selected in id order while ties remain).
// One digit per level:
//   level 0: histogram of the top digit over the block's sealed ids (scores
//            read with 16-byte loads, 4 tiles of 128 ids per warp in flight);
//   levels 1, 2: histogram of the next digit over the ids whose higher
//            digits match the chosen bucket. While the chosen bucket holds
//            more than `capacity` ids in some block, the scores are read
//            again; once it fits (the early exit), that read also gathers the
//            bucket's ids (key, id) into shared memory and marks G for every
//            id above the bucket, and the later levels read only shared
//            memory. A row then reads its scores twice (level 0, gather) for
//            typical scores, at most four times (tied or quantized scores).
// After each level the blocks of a cluster meet (cluster barrier) and every
// block sums the C histograms with one block scan. Histograms alternate
// between two buffers so a block can clear the next one while its peers
// still read the last.
// Output: each block counts its G and E bits (block scan), the cluster
// exchanges the counts, and each thread emits the ids of its bitmap words in
// ascending order at position G-before + min(ties, E-before): the ascending
// output needs no sort. Block 0 of the row writes the -1 padding. (The
// candidate list's order varies with thread timing; nothing depends on it.)

constexpr int kWarps = kTopkThreads / kWarp;
// Ids of one tile: a warp's 32 lanes x one 16-byte load of 4 scores.
constexpr int kTileIds = 4 * kWarp;
// Tiles a warp loads before it processes them (loads in flight per lane).
constexpr int kTileUnroll = 4;
constexpr int kBinsPerThread = kTopkBins / kTopkThreads;
static_assert(kBinsPerThread == 4, "a thread reads its 4 bins of a histogram as one uint4");
static_assert(kTopkThreads % kWarp == 0 && kWarps <= kWarp, "block scans combine warp sums");
// Dynamic shared memory: two histograms, then keys and ids of the candidates.
constexpr int64_t kHistogramBytes = 2 * kTopkBins * sizeof(uint32_t);

struct TopkArgs {
  const float* scores;    // [S, R]
  const int32_t* sealed;  // [S]
  int32_t* selected;      // [S, k]
  uint32_t* workspace;    // [S, 2 x bitmap_words]: bitmap G, then bitmap E, of a row
  int32_t records;        // R <= kTopkMaxRecords
  int32_t top_k;          // k, 1 <= k <= R
  int32_t slice;          // ids per block, a multiple of kTileIds
  int32_t bitmap_words;   // words of one bitmap: R rounded up to kTileIds, / 32
  int32_t capacity;       // candidates a block may gather, <= kTopkCandidates
  bool vec4;              // every row of scores starts 16-byte aligned
};

// What a block's threads share; the output phase also reads a peer's totals.
struct BlockShared {
  unsigned long long scan[kWarps];  // warp sums of a block scan
  uint32_t bin;                     // bucket chosen at this level
  uint32_t above;                   // ids in buckets above it
  uint32_t max_local;               // most ids of that bucket in one block of the cluster
  uint32_t candidates;              // ids gathered by this block
  uint32_t g_total;                 // G bits of this block
  uint32_t e_total;                 // E bits of this block
};

// The digits fixed so far and what is left to select below them.
struct Selection {
  uint32_t prefix;     // the chosen buckets' digits, lower digits 0
  uint32_t remaining;  // ids still to take from the current bucket, >= 1
  uint32_t max_local;  // most ids of the current bucket in one block
};

// Cluster primitives; a cluster of one is a plain block (no cluster launch).

// Visits the ids [lo, end) of a row (lo a multiple of kTileIds) in tiles of
// kTileIds: warp w takes tiles w, w + kWarps, ..., loading kTileUnroll tiles
// before it processes them; lane l holds ids tile + 4l .. tile + 4l + 3.
// visit(tile_first_id, quad) is called by whole warps.
template <typename Visit>
__device__ __forceinline__ void ForEachTile(const float* row, int lo, int end, bool vec4, int warp,
                                            int lane, Visit&& visit) {
  const int tiles = (end - lo + kTileIds - 1) / kTileIds;
  for (int t0 = warp; t0 < tiles; t0 += kWarps * kTileUnroll) {
    Quad quads[kTileUnroll];
#pragma unroll
    for (int u = 0; u < kTileUnroll; ++u)  // a tile past the end loads nothing
      quads[u] = LoadQuad(row, lo + (t0 + u * kWarps) * kTileIds + 4 * lane, end, vec4);
#pragma unroll
    for (int u = 0; u < kTileUnroll; ++u) {
      const int t = t0 + u * kWarps;
      if (t < tiles) visit(lo + t * kTileIds, quads[u]);
    }
  }
}

// Stores a tile's 128 flags as its 4 bitmap words (lane l holds flags of ids
// 4l..4l+3 as a nibble; 8 lanes make a word). A tile's words belong to the
// warp visiting it, so plain stores suffice. Warp-collective.
__device__ __forceinline__ void StoreTileBits(uint32_t* bitmap, int tile_first_id, unsigned nibble,
                                              int lane) {
  uint32_t word = nibble << (4 * (lane & 7));
  word |= __shfl_xor_sync(kFullMask, word, 1);
  word |= __shfl_xor_sync(kFullMask, word, 2);
  word |= __shfl_xor_sync(kFullMask, word, 4);
  if ((lane & 7) == 0) bitmap[tile_first_id / 32 + lane / 8] = word;
}

// Exclusive prefix sum of v over the block's threads in thread order, and the
// block's total. Block-collective (two barriers; `scratch` is free again on
// return).
__device__ __forceinline__ unsigned long long BlockExclusiveSum(unsigned long long v,
                                                                unsigned long long* scratch,
                                                                unsigned long long* total,
                                                                int warp, int lane) {
  unsigned long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const unsigned long long x = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += x;
  }
  if (lane == kWarp - 1) scratch[warp] = inclusive;
  __syncthreads();
  unsigned long long before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const unsigned long long s = scratch[w];
    before += w < warp ? s : 0ull;
    sum += s;
  }
  __syncthreads();
  *total = sum;
  return before + inclusive - v;
}

// Ends a level: sums the cluster's histograms of this level's digit (hist,
// plus the unsealed ids when they match the prefix), picks the bucket holding
// the remaining-th largest key and updates `sel` identically in every block.
// Cluster-collective.
template <int kCluster>
__device__ void ChooseBucket(uint32_t* hist, int level, uint32_t unsealed, Selection& sel,
                             BlockShared& sh, int tid, int warp, int lane) {
  Cluster<kCluster>::Sync();  // every block's histogram of this level is complete
  // Thread t owns the bins first_bin + 3 (highest) down to first_bin.
  const int first_bin = kTopkBins - kBinsPerThread * (tid + 1);
  uint32_t count[kBinsPerThread] = {0, 0, 0, 0};
#pragma unroll
  for (int r = 0; r < kCluster; ++r) {
    const uint4 v = *reinterpret_cast<const uint4*>(Cluster<kCluster>::Map(hist + first_bin, r));
    count[0] += v.w;
    count[1] += v.z;
    count[2] += v.y;
    count[3] += v.x;
  }
  if (TopkPrefixMatches(kTopkUnsealedKey, sel.prefix, level)) {
    const int unsealed_bin = static_cast<int>(TopkDigit(kTopkUnsealedKey, level));
#pragma unroll
    for (int i = 0; i < kBinsPerThread; ++i)
      if (first_bin + kBinsPerThread - 1 - i == unsealed_bin) count[i] += unsealed;
  }
  unsigned long long block_total;
  uint32_t before = static_cast<uint32_t>(
      BlockExclusiveSum(count[0] + count[1] + count[2] + count[3], sh.scan, &block_total, warp, lane));
  // Exactly one bin holds the remaining-th largest key: the level's ids
  // number >= remaining >= 1.
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    if (before < sel.remaining && before + count[i] >= sel.remaining) {
      const int bin = first_bin + kBinsPerThread - 1 - i;
      uint32_t most = 0;
      for (int r = 0; r < kCluster; ++r) most = max(most, *Cluster<kCluster>::Map(hist + bin, r));
      sh.bin = static_cast<uint32_t>(bin);
      sh.above = before;
      sh.max_local = most;
    }
    before += count[i];
  }
  __syncthreads();
  sel.prefix |= sh.bin << TopkDigitShift(level);
  sel.remaining -= sh.above;
  sel.max_local = sh.max_local;
  // sh is written again only after the next level's cluster barrier.
}

template <int kCluster>
__global__ void __launch_bounds__(kTopkThreads, 2) TopkStreamingKernel(const TopkArgs a) {
  extern __shared__ __align__(16) uint32_t topk_dynamic_shared[];
  __shared__ BlockShared sh;
  uint32_t* const histograms = topk_dynamic_shared;                // [2][kTopkBins]
  uint32_t* const cand_key = topk_dynamic_shared + 2 * kTopkBins;  // [capacity]
  int32_t* const cand_id = reinterpret_cast<int32_t*>(cand_key + a.capacity);  // [capacity]

  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = Cluster<kCluster>::Rank();
  const int64_t row = blockIdx.x / kCluster;
  const int R = a.records, k = a.top_k;
  const int n = min(max(a.sealed[row], 0), R);
  const uint32_t unsealed = static_cast<uint32_t>(R - n);
  // This block's ids [lo, hi), its sealed ids [lo, end), its bitmap words
  // [word_lo, word_hi). Blocks past R (tiny rows under a forced cluster) own
  // nothing.
  const int padded = a.bitmap_words * 32;
  const int lo = static_cast<int>(min(static_cast<int64_t>(rank) * a.slice, static_cast<int64_t>(padded)));
  const int hi = max(lo, min(lo + a.slice, R));
  const int end = max(lo, min(hi, n));
  const int word_lo = lo / 32, word_hi = min(lo + a.slice, padded) / 32;

  const float* scores = a.scores + row * R;
  uint32_t* const bits_g = a.workspace + row * 2 * a.bitmap_words;
  uint32_t* const bits_e = bits_g + a.bitmap_words;
  for (int w = word_lo + tid; w < word_hi; w += kTopkThreads) {
    bits_g[w] = 0;
    bits_e[w] = 0;
  }

  const int capacity = a.capacity;
  Selection sel{0u, static_cast<uint32_t>(k), 0u};
  bool gathered = false;
  for (int level = 0; level < kTopkDigits; ++level) {
    uint32_t* const hist = histograms + (level & 1) * kTopkBins;
    for (int i = tid; i < kTopkBins; i += kTopkThreads) hist[i] = 0;
    const bool gather = level > 0 && !gathered && sel.max_local <= static_cast<uint32_t>(capacity);
    if (gather && tid == 0) sh.candidates = 0;
    __syncthreads();
    const uint32_t prefix = sel.prefix;
    if (gathered) {
      // The bucket's ids are in shared memory: histogram the next digit there.
      const int count = min(static_cast<int>(sh.candidates), capacity);
      for (int base = warp * kWarp; base < count; base += kTopkThreads) {
        const int i = base + lane;
        const uint32_t key = i < count ? cand_key[i] : 0u;
        HistogramAdd(hist, TopkDigit(key, level), i < count && TopkPrefixMatches(key, prefix, level),
                     lane);
      }
    } else if (gather) {
      // The early exit: gather the bucket, mark everything above it in G.
      const int shift = TopkDigitShift(level - 1);
      const uint32_t bucket = prefix >> shift;
      ForEachTile(scores, lo, end, a.vec4, warp, lane, [&](int first, const Quad& q) {
        unsigned above = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool valid = (q.valid >> j) & 1u;
          const uint32_t high = q.key[j] >> shift;
          above |= (valid && high > bucket) ? 1u << j : 0u;
          const bool candidate = valid && high == bucket;
          const unsigned lanes = __ballot_sync(kFullMask, candidate);
          if (lanes != 0) {
            const int leader = __ffs(lanes) - 1;
            uint32_t at = 0;
            if (lane == leader) at = atomicAdd(&sh.candidates, static_cast<uint32_t>(__popc(lanes)));
            at = __shfl_sync(kFullMask, at, leader) + __popc(lanes & ((1u << lane) - 1u));
            if (candidate && at < static_cast<uint32_t>(capacity)) {
              cand_key[at] = q.key[j];
              cand_id[at] = first + 4 * lane + j;
            }
          }
          HistogramAdd(hist, TopkDigit(q.key[j], level), candidate, lane);
        }
        StoreTileBits(bits_g, first, above, lane);
      });
      gathered = true;
    } else {
      ForEachTile(scores, lo, end, a.vec4, warp, lane, [&](int, const Quad& q) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool active = ((q.valid >> j) & 1u) && TopkPrefixMatches(q.key[j], prefix, level);
          HistogramAdd(hist, TopkDigit(q.key[j], level), active, lane);
        }
      });
    }
    ChooseBucket<kCluster>(hist, level, unsealed, sel, sh, tid, warp, lane);
  }

  // T and the ties to take are known: mark G (key > T) and E (key == T).
  const uint32_t threshold = sel.prefix, ties = sel.remaining;
  if (gathered) {
    const int count = min(static_cast<int>(sh.candidates), capacity);
    for (int i = tid; i < count; i += kTopkThreads) {
      const uint32_t key = cand_key[i];
      const int id = cand_id[i];
      if (key > threshold) atomicOr(&bits_g[id / 32], 1u << (id % 32));
      if (key == threshold) atomicOr(&bits_e[id / 32], 1u << (id % 32));
    }
  } else {
    ForEachTile(scores, lo, end, a.vec4, warp, lane, [&](int first, const Quad& q) {
      unsigned greater = 0, equal = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool valid = (q.valid >> j) & 1u;
        greater |= (valid && q.key[j] > threshold) ? 1u << j : 0u;
        equal |= (valid && q.key[j] == threshold) ? 1u << j : 0u;
      }
      StoreTileBits(bits_g, first, greater, lane);
      StoreTileBits(bits_e, first, equal, lane);
    });
  }
  __syncthreads();

  // Output: thread t emits the ids of its contiguous run of bitmap words.
  const int words = word_hi - word_lo;
  const int per_thread = (words + kTopkThreads - 1) / kTopkThreads;
  const int w_begin = word_lo + min(tid * per_thread, words);
  const int w_end = word_lo + min((tid + 1) * per_thread, words);
  uint32_t g = 0, e = 0;
  for (int w = w_begin; w < w_end; ++w) {
    g += __popc(bits_g[w]);
    e += __popc(bits_e[w]);
  }
  unsigned long long block_total;
  const unsigned long long before = BlockExclusiveSum(
      (static_cast<unsigned long long>(g) << 32) | e, sh.scan, &block_total, warp, lane);
  if (tid == 0) {
    sh.g_total = static_cast<uint32_t>(block_total >> 32);
    sh.e_total = static_cast<uint32_t>(block_total);
  }
  Cluster<kCluster>::Sync();
  uint32_t g_before = static_cast<uint32_t>(before >> 32);
  uint32_t e_before = static_cast<uint32_t>(before);
  uint32_t g_all = 0, e_all = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) {
    const BlockShared* peer = Cluster<kCluster>::Map(&sh, static_cast<unsigned>(r));
    const uint32_t peer_g = peer->g_total, peer_e = peer->e_total;
    if (static_cast<unsigned>(r) < rank) {
      g_before += peer_g;
      e_before += peer_e;
    }
    g_all += peer_g;
    e_all += peer_e;
  }
  int32_t* const out = a.selected + row * k;
  // Selected ids before this thread's words: every G bit, the first `ties` E bits.
  uint32_t pos = g_before + min(ties, e_before);
  uint32_t e_seen = e_before;
  for (int w = w_begin; w < w_end; ++w) {
    const uint32_t word_g = bits_g[w], word_e = bits_e[w];
    uint32_t take = 0;  // the E bits of this word among the first `ties` E bits of the row
    if (e_seen < ties) {
      const uint32_t allowed = ties - e_seen;
      take = word_e;
      if (static_cast<uint32_t>(__popc(word_e)) > allowed) {
        take = 0;
        uint32_t rest = word_e;
        for (uint32_t i = 0; i < allowed; ++i) {
          const uint32_t lowest = rest & (0u - rest);
          take |= lowest;
          rest ^= lowest;
        }
      }
    }
    e_seen += __popc(word_e);
    for (uint32_t m = word_g | take; m != 0; m &= m - 1) {
      if (pos < static_cast<uint32_t>(k)) out[pos] = w * 32 + (__ffs(m) - 1);
      ++pos;
    }
  }
  if (rank == 0) {
    const uint32_t total = g_all + min(ties, e_all);
    for (uint32_t i = total + tid; i < static_cast<uint32_t>(k); i += kTopkThreads) out[i] = -1;
  }
  if constexpr (kCluster > 1) Cluster<kCluster>::Sync();  // peers may still read sh
}

// ===========================================================================
// The resident kernel (the plan is in the comment at the top of this file).

constexpr int kResidentWarps = kTopkResidentThreads / kWarp;
static_assert(kResidentWarps == kWarp, "a warp reads every warp's count in one load");
static_assert(kTopkResidentMaxCluster <= kWarp && kResidentWarps % kTopkResidentMaxCluster == 0,
              "a warp reads every block's counts in one load; warps split evenly over the blocks");
constexpr int kResidentBinsPerThread = kTopkBins / kTopkResidentThreads;
static_assert(kResidentBinsPerThread == 2, "a thread reads its 2 bins of a histogram as one uint2");
// Ids a warp visits per step: 4 consecutive ids per lane, one 16-byte load.
constexpr int kStepIds = 4 * kWarp;
static_assert(kTopkResidentMaxSlice % kStepIds == 0 && kTopkResidentCandidates % kStepIds == 0,
              "a step never reads past the slice or the candidate list");
// The top-digit bucket of an unsealed id's key: TopkDigit(kTopkUnsealedKey, 0).
constexpr int kUnsealedBin = static_cast<int>(kTopkUnsealedKey >> 21);
// Top-digit boundaries whose counts are taken exactly: e + 1, e, e - 1, e - 2
// around the sample's estimate e of T's bucket, then the estimate of the
// kSafetyFactor x k-th key's bucket (at most e - 3): a bracket of the bucket
// that holds few ids even where the sample misjudges e.
constexpr int kBoundaries = 5;
constexpr int kNearBoundaries = 4;
constexpr int64_t kSafetyFactor = 4;
// Candidate keys of a whole row one block holds after the exchange.
constexpr int kMergedCapacity = 8192;
static_assert(kMergedCapacity >= kTopkBins, "the merged list's space also holds a share of a histogram");
// Dynamic shared memory, at fixed offsets (one block per SM): histograms of
// digits 0 (over a bracket of buckets), 1 and 2 (the sample's goes in the
// third first), the slice's score bits, the candidates' keys and positions,
// and the merged candidate keys of the row (or, in rows that do not
// exchange candidates, this block's share of a merged histogram).
constexpr int64_t kResidentSharedBytes =
    sizeof(uint32_t) * (3 * kTopkBins + kTopkResidentMaxSlice + 2 * int64_t{kTopkResidentCandidates} +
                        kMergedCapacity);
static_assert(kResidentSharedBytes + 4096 <= 227 * 1024, "fits the opt-in shared memory of sm_90");

struct ResidentArgs {
  const float* scores;    // [S, R]
  const int32_t* sealed;  // [S]
  int32_t* selected;      // [S, k]
  int32_t records;        // R <= kTopkMaxRecords
  int32_t top_k;          // k, 1 <= k <= R
  int32_t slice;          // ids per block: a multiple of kStepIds, <= kTopkResidentMaxSlice
  int32_t capacity;       // candidates a block may gather: a multiple of 4, <= kTopkResidentCandidates
  bool vec4;              // every row of scores starts 16-byte aligned (16-byte copies)
};

// What a block's threads share. Peers read `counts`, `share_total`, `totals`.
struct ResidentShared {
  unsigned long long scan[kResidentWarps];            // warp sums of a block scan
  unsigned long long warp_out[kResidentWarps];        // per warp: ids above T (high), equal (low)
  uint32_t warp_counts[kResidentWarps][kBoundaries];  // per warp: ids at or above each boundary
  uint32_t counts[kBoundaries];                       // their sums over the block
  uint32_t share_total[kTopkDigits];                  // per digit: this block's share of the merged histogram
  unsigned long long totals;                          // ids above T (high), equal (low), no exchange
  int32_t estimate[2];  // top-digit buckets where the sample's estimate reaches k, kSafetyFactor x k
  // The decision after the counts' exchange, the same in every block of the row.
  int32_t range_lo, range_hi;  // the bracket of T's top-digit bucket: [range_lo, range_hi)
  uint32_t above;              // ids with top digit >= range_hi
  int32_t gather;              // boundary at range_lo (candidates: top digit >= range_lo), -1: none
  bool exchange;               // every block's candidates fit and are merged in every block
  uint32_t merged_size;
  uint32_t rank_count[kTopkResidentMaxCluster];   // candidates of each block
  uint32_t rank_offset[kTopkResidentMaxCluster];  // their place in the merged list
  // Results of a choice, broadcast to the block.
  uint32_t share, share_above;  // the block whose share of bins holds the key, ids above that share
  uint32_t bin, bin_above;      // the bin holding the key, ids in the bins above it
  unsigned long long before;    // ids above T (high), equal (low) in lower-ranked blocks
};

// Starts copying 16 (4) bytes of global memory into shared memory.
__device__ __forceinline__ void CopyToShared16(uint32_t* dst, const float* src) {
  __pipeline_memcpy_async(dst, src, 16);
}
__device__ __forceinline__ void CopyToShared4(uint32_t* dst, const float* src) {
  __pipeline_memcpy_async(dst, src, 4);
}
// Waits for this thread's copies; a block barrier then shows every thread's.
__device__ __forceinline__ void CopiesWait() {
  __pipeline_commit();
  __pipeline_wait_prior(0);
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Exclusive prefix sum of v over the lanes, and the warp's total.
__device__ __forceinline__ uint32_t WarpExclusiveSum(uint32_t v, int lane, uint32_t* total) {
  uint32_t inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const uint32_t x = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += x;
  }
  *total = __shfl_sync(kFullMask, inclusive, kWarp - 1);
  return inclusive - v;
}

// Exclusive prefix sum of v over the block's threads in thread order, and the
// block's total. Block-collective (two barriers; `scratch` is free again on
// return).
__device__ __forceinline__ unsigned long long ResidentBlockSum(unsigned long long v,
                                                               unsigned long long* scratch,
                                                               unsigned long long* total, int warp,
                                                               int lane) {
  unsigned long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const unsigned long long x = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += x;
  }
  if (lane == kWarp - 1) scratch[warp] = inclusive;
  __syncthreads();
  // Lane w holds warp w's sum; scan those across the lanes.
  const unsigned long long warp_sum = scratch[lane];
  unsigned long long warps_inclusive = warp_sum;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const unsigned long long x = __shfl_up_sync(kFullMask, warps_inclusive, offset);
    if (lane >= offset) warps_inclusive += x;
  }
  const unsigned long long warps_before = __shfl_sync(kFullMask, warps_inclusive - warp_sum, warp);
  *total = __shfl_sync(kFullMask, warps_inclusive, kWarp - 1);
  __syncthreads();
  return warps_before + inclusive - v;
}

// The ids a pass visits, in ascending id order: the slice's sealed ids (keys
// made from the score bits) or the candidates.
struct Source {
  const uint32_t* bits;      // [slice] score bits, when !candidates
  const uint32_t* cand_key;  // [kTopkResidentCandidates] keys, when candidates
  const uint32_t* cand_pos;  // [kTopkResidentCandidates] positions in the slice (id - first id)
  int size;                  // entries
  bool candidates;
};

// A lane's 4 consecutive entries of a step.
struct Entries {
  uint32_t key[4];
  int pos[4];      // position in the slice
  unsigned valid;  // bit j: entry j exists
};

// Visits the entries [0, src.size): warp w owns the w-th of 32 contiguous
// ranges of whole steps (so a warp's entries follow those of lower warps)
// and visits them step by step, lane l holding entries base + 4l .. + 3.
// visit(entries) is called by whole warps; every pass over the same source
// gives a warp the same range.
template <typename Visit>
__device__ __forceinline__ void ForEachStep(const Source& src, int warp, int lane, Visit&& visit) {
  const int per_warp = (src.size + kResidentWarps * kStepIds - 1) / (kResidentWarps * kStepIds) * kStepIds;
  const int begin = min(warp * per_warp, src.size);
  const int end = min(begin + per_warp, src.size);
  for (int base = begin; base < end; base += kStepIds) {
    const int first = base + 4 * lane;
    Entries e;
    if (src.candidates) {
      const uint4 keys = *reinterpret_cast<const uint4*>(src.cand_key + first);
      const uint4 pos = *reinterpret_cast<const uint4*>(src.cand_pos + first);
      e.key[0] = keys.x;
      e.key[1] = keys.y;
      e.key[2] = keys.z;
      e.key[3] = keys.w;
      e.pos[0] = static_cast<int>(pos.x);
      e.pos[1] = static_cast<int>(pos.y);
      e.pos[2] = static_cast<int>(pos.z);
      e.pos[3] = static_cast<int>(pos.w);
    } else {
      const uint4 bits = *reinterpret_cast<const uint4*>(src.bits + first);
      e.key[0] = TopkOrderedKey(bits.x);
      e.key[1] = TopkOrderedKey(bits.y);
      e.key[2] = TopkOrderedKey(bits.z);
      e.key[3] = TopkOrderedKey(bits.w);
#pragma unroll
      for (int j = 0; j < 4; ++j) e.pos[j] = first + j;
    }
    e.valid = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) e.valid |= first + j < end ? 1u << j : 0u;
    visit(e);
  }
}

__device__ __forceinline__ bool Valid(const Entries& e, int j) { return (e.valid >> j) & 1u; }
__device__ __forceinline__ int TopBin(uint32_t key) { return static_cast<int>(TopkDigit(key, 0)); }

// Adds every source entry that `match`es to hist[TopkDigit(key, level)].
// Block-collective (no barrier).
template <typename Match>
__device__ __forceinline__ void HistogramPass(const Source& src, uint32_t* hist, int level, int warp,
                                              int lane, Match&& match) {
  ForEachStep(src, warp, lane, [&](const Entries& e) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      HistogramAdd(hist, TopkDigit(e.key[j], level), Valid(e, j) && match(e.key[j]), lane);
  });
}

// From the sample's top-digit histogram: sh.estimate[t] = the highest bucket
// b where the estimate of the ids at or above b, sampled x n / samples plus
// the unsealed ids when b <= kUnsealedBin, reaches k (t = 0) and
// min(kSafetyFactor x k, R) (t = 1). Left alone when nothing was sampled.
// Block-collective; every block of a row computes the same buckets.
__device__ void EstimateBuckets(const uint32_t* hist, int n, uint32_t unsealed, int k,
                                ResidentShared& sh, int tid, int warp, int lane) {
  const int high = kTopkBins - 1 - kResidentBinsPerThread * tid;  // bins high, high - 1
  const uint2 c = *reinterpret_cast<const uint2*>(hist + high - 1);  // x: high - 1, y: high
  unsigned long long total;
  const uint32_t before = static_cast<uint32_t>(ResidentBlockSum(c.x + c.y, sh.scan, &total, warp, lane));
  const int64_t samples = static_cast<int64_t>(total);
  if (samples == 0) return;
  auto reaches = [&](int bin, uint32_t sampled, int64_t target) {
    const int64_t need = target - (bin <= kUnsealedBin ? int64_t{unsealed} : 0);
    return need <= 0 || int64_t{sampled} * n >= need * samples;
  };
  const int64_t R = int64_t{n} + unsealed;
  const int64_t targets[2] = {k, min(kSafetyFactor * k, R)};
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    // reaches() holds at bin 0 (target <= R), fails above bin 2047, and
    // holds from one bin down: exactly one thread sees the step.
    const bool at_high = reaches(high, before + c.y, targets[t]);
    if (at_high && !reaches(high + 1, before, targets[t])) sh.estimate[t] = high;
    if (!at_high && reaches(high - 1, before + c.y + c.x, targets[t])) sh.estimate[t] = high - 1;
  }
}

// After the barrier that completed every block's counts: warp 0 sums them
// (lane r reads block r's) into the bracket of T's bucket and the
// candidates' places, the same in every block. Warp-collective (warp 0).
template <int kCluster>
__device__ void DecideBracket(ResidentShared& sh, const int (&bound)[kBoundaries], uint32_t unsealed,
                              int k, int capacity, int lane) {
  uint32_t mine[kBoundaries];
#pragma unroll
  for (int b = 0; b < kBoundaries; ++b)
    mine[b] = lane < kCluster ? *Cluster<kCluster>::Map(&sh.counts[b], static_cast<unsigned>(lane)) : 0u;
  int range_lo = 0, range_hi = kTopkBins, gather = -1;
  uint32_t above = 0, count = 0;
#pragma unroll
  for (int b = 0; b < kBoundaries; ++b) {
    const uint32_t at_or_above = WarpSum(mine[b]) + (kUnsealedBin >= bound[b] ? unsealed : 0u);
    if (gather < 0) {
      if (at_or_above >= static_cast<uint32_t>(k)) {
        gather = b;
        range_lo = max(bound[b], 0);
        count = mine[b];
      } else {
        range_hi = bound[b];
        above = at_or_above;
      }
    }
  }
  uint32_t total;
  const uint32_t offset = WarpExclusiveSum(count, lane, &total);
  const bool fits = __all_sync(kFullMask, count <= static_cast<uint32_t>(capacity));
  if (lane < kCluster) {
    sh.rank_count[lane] = count;
    sh.rank_offset[lane] = offset;
  }
  if (lane == 0) {
    sh.range_lo = range_lo;
    sh.range_hi = range_hi;
    sh.above = above;
    sh.gather = gather;
    sh.merged_size = total;
    sh.exchange = gather >= 0 && fits && total <= kMergedCapacity;
  }
}

// Copies every block's candidate keys into `merged`, block after block.
// Block-collective (no barrier); reads the peers' shared memory.
template <int kCluster>
__device__ void MergeCandidates(uint32_t* merged, uint32_t* cand_key, const ResidentShared& sh, int warp,
                                int lane) {
  constexpr int kWarpsPerRank = kResidentWarps / kCluster;
  constexpr int kStride = kWarpsPerRank * kWarp;
  const unsigned r = static_cast<unsigned>(warp / kWarpsPerRank);
  const int count = static_cast<int>(sh.rank_count[r]);
  uint32_t* const to = merged + sh.rank_offset[r];
  const uint32_t* const from = Cluster<kCluster>::Map(cand_key, r);
  for (int j0 = (warp % kWarpsPerRank) * kWarp + lane; j0 < count; j0 += 4 * kStride) {
    uint32_t v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = j0 + u * kStride < count ? from[j0 + u * kStride] : 0u;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (j0 + u * kStride < count) to[j0 + u * kStride] = v[u];
  }
}

// The bin of a complete local histogram (plus `extra` ids in `extra_bin`)
// holding the remaining-th largest key, and the ids in the bins above it.
// Block-collective; call after a block barrier.
__device__ uint2 LocalChooseBucket(const uint32_t* hist, int extra_bin, uint32_t extra, uint32_t remaining,
                                   ResidentShared& sh, int tid, int warp, int lane) {
  const int high = kTopkBins - 1 - kResidentBinsPerThread * tid;  // bins high, high - 1
  const uint2 v = *reinterpret_cast<const uint2*>(hist + high - 1);
  const uint32_t count_high = v.y + (extra_bin == high ? extra : 0u);
  const uint32_t count_low = v.x + (extra_bin == high - 1 ? extra : 0u);
  unsigned long long total;
  const uint32_t before =
      static_cast<uint32_t>(ResidentBlockSum(count_high + count_low, sh.scan, &total, warp, lane));
  // Exactly one bin holds the remaining-th largest key: the level's ids
  // number >= remaining >= 1.
  if (before < remaining && before + count_high >= remaining) {
    sh.bin = static_cast<uint32_t>(high);
    sh.bin_above = before;
  } else if (before + count_high < remaining && before + count_high + count_low >= remaining) {
    sh.bin = static_cast<uint32_t>(high - 1);
    sh.bin_above = before + count_high;
  }
  __syncthreads();
  return make_uint2(sh.bin, sh.bin_above);  // written again only after a later barrier
}

// The same over the cluster's histograms (hist, complete in every block: call
// after the cluster barrier that ends their passes), by reduce-scatter: block
// r sums bins [r x share, (r + 1) x share) over the cluster into `share_bins`
// (and `extra` into extra_bin), one more cluster barrier publishes the share
// totals, and every block reads the bins of the one share that holds the key.
// Each block moves about 8 KB across the cluster instead of the C x 8 KB of
// every peer's whole histogram. Cluster-collective. `share_bins` and
// sh.share_total[level] are read by peers until their next cluster barrier.
template <int kCluster>
__device__ uint2 ClusterChooseBucket(const uint32_t* hist, int level, int extra_bin, uint32_t extra,
                                     uint32_t remaining, uint32_t* share_bins, ResidentShared& sh,
                                     unsigned rank, int tid, int warp, int lane) {
  constexpr int kShare = kTopkBins / kCluster;
  constexpr int kPerThread = kShare > kTopkResidentThreads ? kShare / kTopkResidentThreads : 1;
  const int first = static_cast<int>(rank) * kShare;
  uint32_t local = 0;
  for (int i = tid; i < kShare; i += kTopkResidentThreads) {
    uint32_t sum = first + i == extra_bin ? extra : 0u;
#pragma unroll 4
    for (int r = 0; r < kCluster; ++r)
      sum += Cluster<kCluster>::Map(hist, static_cast<unsigned>(r))[first + i];
    share_bins[i] = sum;
    local += sum;
  }
  local = WarpSum(local);
  if (lane == 0 && local > 0) atomicAdd(&sh.share_total[level], local);
  Cluster<kCluster>::Sync();
  if (warp == 0) {
    // Lane r: block r's share; shares ascend with r, so the ids above share
    // r are those of shares r + 1 ...
    const uint32_t total =
        lane < kCluster ? *Cluster<kCluster>::Map(&sh.share_total[level], static_cast<unsigned>(lane)) : 0u;
    uint32_t at_or_above = total;
#pragma unroll
    for (int offset = 1; offset < kWarp; offset <<= 1) {
      const uint32_t x = __shfl_down_sync(kFullMask, at_or_above, offset);
      if (lane + offset < kWarp) at_or_above += x;
    }
    const uint32_t above = at_or_above - total;
    if (lane < kCluster && above < remaining && at_or_above >= remaining) {
      sh.share = static_cast<uint32_t>(lane);
      sh.share_above = above;
    }
  }
  __syncthreads();
  const unsigned share = sh.share;
  const uint32_t share_above = sh.share_above;
  const uint32_t* const bins = Cluster<kCluster>::Map(share_bins, share);
  // Thread t holds the share's bins top - kPerThread t down to top - kPerThread t - kPerThread + 1.
  const int top = kShare - 1 - kPerThread * tid;
  uint32_t count[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) count[i] = top - i >= 0 ? bins[top - i] : 0u;
  uint32_t sum = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) sum += count[i];
  unsigned long long block_total;
  uint32_t before =
      share_above + static_cast<uint32_t>(ResidentBlockSum(sum, sh.scan, &block_total, warp, lane));
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (top - i >= 0 && before < remaining && before + count[i] >= remaining) {
      sh.bin = share * kShare + static_cast<uint32_t>(top - i);
      sh.bin_above = before;
    }
    before += count[i];
  }
  __syncthreads();
  return make_uint2(sh.bin, sh.bin_above);  // written again only after a later barrier
}

template <int kCluster>
__global__ void __launch_bounds__(kTopkResidentThreads, 1) TopkResidentKernel(const ResidentArgs a) {
  extern __shared__ __align__(16) uint32_t topk_dynamic_shared[];
  __shared__ ResidentShared sh;
  uint32_t* const hist0 = topk_dynamic_shared;                    // [kTopkBins] each
  uint32_t* const hist1 = hist0 + kTopkBins;
  uint32_t* const hist2 = hist1 + kTopkBins;
  uint32_t* const bits = hist2 + kTopkBins;                       // [kTopkResidentMaxSlice]
  uint32_t* const cand_key = bits + kTopkResidentMaxSlice;        // [kTopkResidentCandidates]
  uint32_t* const cand_pos = cand_key + kTopkResidentCandidates;  // [kTopkResidentCandidates]
  uint32_t* const merged = cand_pos + kTopkResidentCandidates;    // [kMergedCapacity]

  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = Cluster<kCluster>::Rank();
  const int64_t row = blockIdx.x / kCluster;
  const int R = a.records, k = a.top_k;
  // This block's ids [lo, hi); blocks past R (tiny rows) own nothing.
  const int lo = min(static_cast<int>(rank) * a.slice, R);
  const int hi = min(lo + a.slice, R);
  const float* const scores = a.scores + row * R;

  // 1. The slice's scores into shared memory (all of [lo, hi): the copies need
  // not wait for `sealed`), and the sample: quad q of the row's R / 4 quads
  // spread evenly over the threads, the same in every block.
  if (a.vec4) {
    for (int i = 4 * tid; i < hi - lo; i += 4 * kTopkResidentThreads)
      CopyToShared16(bits + i, scores + lo + i);
  } else {
    for (int i = tid; i < hi - lo; i += kTopkResidentThreads) CopyToShared4(bits + i, scores + lo + i);
  }
  const int quads = (R + 3) / 4;
  const int sample_first =
      4 * (quads <= kTopkResidentThreads ? tid
                                         : static_cast<int>(int64_t{tid} * quads / kTopkResidentThreads));
  const Quad sample = LoadQuad(scores, sample_first, R, a.vec4);
  const int n = min(max(a.sealed[row], 0), R);
  const uint32_t unsealed = static_cast<uint32_t>(R - n);
  const int sealed_in_slice = max(0, min(hi, n) - lo);  // bits[0, sealed_in_slice)

  for (int i = tid; i < 3 * kTopkBins; i += kTopkResidentThreads) hist0[i] = 0;  // hist0, 1, 2
  if (tid < kBoundaries) sh.counts[tid] = 0;
  if (tid < kTopkDigits) sh.share_total[tid] = 0;
  if (tid == 0) {
    // Without samples (nothing sealed) the unsealed ids' bucket is the guess.
    sh.estimate[0] = kUnsealedBin;
    sh.estimate[1] = 0;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j)
    HistogramAdd(hist2, TopkDigit(sample.key[j], 0), sample_first + j < n, lane);
  __syncthreads();
  EstimateBuckets(hist2, n, unsealed, k, sh, tid, warp, lane);
  __syncthreads();
  const int estimate = sh.estimate[0];
  int bound[kBoundaries];
#pragma unroll
  for (int b = 0; b < kNearBoundaries; ++b) bound[b] = estimate + 1 - b;
  bound[kBoundaries - 1] = min(estimate - kNearBoundaries + 1, sh.estimate[1]);
  for (int i = tid; i < kTopkBins; i += kTopkResidentThreads) hist2[i] = 0;  // for digit 2
  CopiesWait();
  __syncthreads();

  // 2. Exact counts at the boundaries; the cluster's sums bracket T's bucket.
  const Source slice{bits, cand_key, cand_pos, sealed_in_slice, false};
  {
    uint32_t count[kBoundaries] = {};
    ForEachStep(slice, warp, lane, [&](const Entries& e) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int bin = TopBin(e.key[j]);
#pragma unroll
        for (int b = 0; b < kBoundaries; ++b) count[b] += (Valid(e, j) && bin >= bound[b]) ? 1u : 0u;
      }
    });
#pragma unroll
    for (int b = 0; b < kBoundaries; ++b) {
      count[b] = WarpSum(count[b]);
      if (lane == 0) {
        sh.warp_counts[warp][b] = count[b];
        atomicAdd(&sh.counts[b], count[b]);
      }
    }
  }
  Cluster<kCluster>::Sync();
  if (warp == 0) DecideBracket<kCluster>(sh, bound, unsealed, k, a.capacity, lane);
  __syncthreads();
  const int range_lo = sh.range_lo, range_hi = sh.range_hi, gather = sh.gather;
  const bool exchange = sh.exchange;
  uint32_t remaining = static_cast<uint32_t>(k) - sh.above;
  uint32_t prefix = static_cast<uint32_t>(range_lo) << TopkDigitShift(0);

  // 3. Candidates: the ids with top digit >= range_lo (every id the selection
  // can take), in id order, when this block's fit.
  const uint32_t gathered = gather >= 0 ? sh.rank_count[rank] : 0u;
  const bool use_candidates = gather >= 0 && gathered <= static_cast<uint32_t>(a.capacity);
  if (use_candidates) {
    const uint32_t per_warp = sh.warp_counts[lane][gather];  // lane w: warp w's count
    uint32_t at = WarpSum(lane < warp ? per_warp : 0u);
    if (__shfl_sync(kFullMask, per_warp, warp) > 0) {
      ForEachStep(slice, warp, lane, [&](const Entries& e) {
        unsigned take = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) take |= (Valid(e, j) && TopBin(e.key[j]) >= range_lo) ? 1u << j : 0u;
        uint32_t step_total;
        uint32_t slot = at + WarpExclusiveSum(static_cast<uint32_t>(__popc(take)), lane, &step_total);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if ((take >> j) & 1u) {
            cand_key[slot] = e.key[j];
            cand_pos[slot] = static_cast<uint32_t>(e.pos[j]);
            ++slot;
          }
        }
        at += step_total;
      });
    }
  }
  const Source src = use_candidates ? Source{bits, cand_key, cand_pos, static_cast<int>(gathered), true}
                                    : slice;
  if (use_candidates && !exchange) __syncthreads();  // passes read other warps' candidates

  // 4. The digits.
  uint32_t threshold, ties;
  unsigned long long before = 0;  // ids above T (high) and equal (low) in lower-ranked blocks
  if (exchange) {
    // Typical rows: the row's candidates fit in one block. Every block merges
    // them and finishes alone.
    Cluster<kCluster>::Sync();  // every block's candidates are in place
    MergeCandidates<kCluster>(merged, cand_key, sh, warp, lane);
    Cluster<kCluster>::Arrive();  // no peer's shared memory is read after this
    __syncthreads();
    const int size = static_cast<int>(sh.merged_size);
    // Digit 0 needs a histogram only when the bracket spans several buckets.
    for (int level = range_hi - range_lo > 1 ? 0 : 1; level < kTopkDigits; ++level) {
      uint32_t* const hist = level == 0 ? hist0 : (level == 1 ? hist1 : hist2);
      auto match = [&](uint32_t key) {
        return level == 0 ? TopBin(key) >= range_lo && TopBin(key) < range_hi
                          : TopkPrefixMatches(key, prefix, level);
      };
      for (int base = warp * kWarp; base < size; base += kTopkResidentThreads) {
        const int i = base + lane;
        const uint32_t key = i < size ? merged[i] : 0u;
        HistogramAdd(hist, TopkDigit(key, level), i < size && match(key), lane);
      }
      __syncthreads();
      const uint2 chosen = LocalChooseBucket(hist, static_cast<int>(TopkDigit(kTopkUnsealedKey, level)),
                                             match(kTopkUnsealedKey) ? unsealed : 0u, remaining, sh, tid,
                                             warp, lane);
      prefix = (level == 0 ? 0u : prefix) | chosen.x << TopkDigitShift(level);
      remaining -= chosen.y;
    }
    threshold = prefix;
    ties = remaining;
    // The lower-ranked blocks' candidates lead the merged list.
    uint32_t g = 0, e = 0;
    for (int i = tid; i < static_cast<int>(sh.rank_offset[rank]); i += kTopkResidentThreads) {
      g += merged[i] > threshold ? 1u : 0u;
      e += merged[i] == threshold ? 1u : 0u;
    }
    ResidentBlockSum((static_cast<unsigned long long>(g) << 32) | e, sh.scan, &before, warp, lane);
  } else {
    // Otherwise histograms of the digits, merged by reduce-scatter. Digit 0
    // needs one only when the bracket spans several buckets.
    if (range_hi - range_lo > 1) {
      HistogramPass(src, hist0, 0, warp, lane,
                    [&](uint32_t key) { return TopBin(key) >= range_lo && TopBin(key) < range_hi; });
      Cluster<kCluster>::Sync();
      const bool unsealed_in = kUnsealedBin >= range_lo && kUnsealedBin < range_hi;
      const uint2 chosen = ClusterChooseBucket<kCluster>(hist0, 0, kUnsealedBin, unsealed_in ? unsealed : 0u,
                                                         remaining, merged, sh, rank, tid, warp, lane);
      prefix = chosen.x << TopkDigitShift(0);
      remaining -= chosen.y;
    }
    for (int level = 1; level < kTopkDigits; ++level) {
      uint32_t* const hist = level == 1 ? hist1 : hist2;
      HistogramPass(src, hist, level, warp, lane,
                    [&](uint32_t key) { return TopkPrefixMatches(key, prefix, level); });
      Cluster<kCluster>::Sync();
      const bool unsealed_in = TopkPrefixMatches(kTopkUnsealedKey, prefix, level);
      const uint2 chosen =
          ClusterChooseBucket<kCluster>(hist, level, static_cast<int>(TopkDigit(kTopkUnsealedKey, level)),
                                        unsealed_in ? unsealed : 0u, remaining, merged, sh, rank, tid,
                                        warp, lane);
      prefix |= chosen.x << TopkDigitShift(level);
      remaining -= chosen.y;
    }
    threshold = prefix;
    ties = remaining;
  }

  // 5. Output: every id above T, and the first `ties` equal to T, at its
  // place in ascending id order.
  uint32_t g_warp = 0, e_warp = 0;
  ForEachStep(src, warp, lane, [&](const Entries& e) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      g_warp += (Valid(e, j) && e.key[j] > threshold) ? 1u : 0u;
      e_warp += (Valid(e, j) && e.key[j] == threshold) ? 1u : 0u;
    }
  });
  g_warp = WarpSum(g_warp);
  e_warp = WarpSum(e_warp);
  if (lane == 0) sh.warp_out[warp] = (static_cast<unsigned long long>(g_warp) << 32) | e_warp;
  __syncthreads();
  const unsigned long long per_warp = sh.warp_out[lane];  // lane w: warp w's counts
  const unsigned long long warps_before = WarpSum(lane < warp ? per_warp : 0ull);
  const unsigned long long block_total = WarpSum(per_warp);
  if (!exchange) {
    if (tid == 0) sh.totals = block_total;
    Cluster<kCluster>::Sync();  // every block's totals are in place
    if (warp == 0) {
      const unsigned long long lower =
          lane < static_cast<int>(rank)
              ? *Cluster<kCluster>::Map(&sh.totals, static_cast<unsigned>(lane))
              : 0ull;
      const unsigned long long sum = WarpSum(lower);
      if (lane == 0) sh.before = sum;
    }
    Cluster<kCluster>::Arrive();  // no peer's shared memory is read after this
    __syncthreads();
    before = sh.before;
  }
  const uint32_t g_before = static_cast<uint32_t>(before >> 32), e_before = static_cast<uint32_t>(before);
  int32_t* const out = a.selected + row * k;
  if (g_warp + e_warp > 0) {
    // Selected ids before an id: every id above T, the first `ties` equal to T.
    uint32_t g_seen = g_before + static_cast<uint32_t>(warps_before >> 32);
    uint32_t e_seen = e_before + static_cast<uint32_t>(warps_before);
    ForEachStep(src, warp, lane, [&](const Entries& e) {
      unsigned greater = 0, equal = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        greater |= (Valid(e, j) && e.key[j] > threshold) ? 1u << j : 0u;
        equal |= (Valid(e, j) && e.key[j] == threshold) ? 1u << j : 0u;
      }
      uint32_t step_total;  // ids above T in the high half, equal to T in the low half
      const uint32_t lane_before = WarpExclusiveSum(
          (static_cast<uint32_t>(__popc(greater)) << 16) | static_cast<uint32_t>(__popc(equal)), lane,
          &step_total);
      uint32_t g_at = g_seen + (lane_before >> 16), e_at = e_seen + (lane_before & 0xffffu);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if ((greater >> j) & 1u) {
          const uint32_t pos = g_at + min(ties, e_at);
          if (pos < static_cast<uint32_t>(k)) out[pos] = lo + e.pos[j];
          ++g_at;
        } else if ((equal >> j) & 1u) {
          if (e_at < ties && g_at + e_at < static_cast<uint32_t>(k)) out[g_at + e_at] = lo + e.pos[j];
          ++e_at;
        }
      }
      g_seen += step_total >> 16;
      e_seen += step_total & 0xffffu;
    });
  }
  if (rank == kCluster - 1) {
    const uint32_t g_all = g_before + static_cast<uint32_t>(block_total >> 32);
    const uint32_t e_all = e_before + static_cast<uint32_t>(block_total);
    const uint32_t total = g_all + min(ties, e_all);
    for (uint32_t i = total + tid; i < static_cast<uint32_t>(k); i += kTopkResidentThreads) out[i] = -1;
  }
  Cluster<kCluster>::Wait();
}

// ---------------------------------------------------------------------------
// Host side.

using StreamingKernelFn = void (*)(TopkArgs);
constexpr int kStreamingClusters[] = {1, 2, 4, 8};
constexpr StreamingKernelFn kStreamingKernels[] = {TopkStreamingKernel<1>, TopkStreamingKernel<2>,
                                                   TopkStreamingKernel<4>, TopkStreamingKernel<8>};
static_assert(kTopkMaxCluster == 8, "kStreamingKernels instantiates clusters up to 8 blocks");
static_assert(kTopkMaxRecords + int64_t{kTopkMaxCluster} * kTileIds < INT32_MAX,
              "ids, slices and bitmap bits stay in int32");

using ResidentKernelFn = void (*)(ResidentArgs);
constexpr int kResidentClusters[] = {1, 2, 4, 8, 16};
constexpr int kResidentSizes = 5;
constexpr ResidentKernelFn kResidentKernels[] = {TopkResidentKernel<1>, TopkResidentKernel<2>,
                                                 TopkResidentKernel<4>, TopkResidentKernel<8>,
                                                 TopkResidentKernel<16>};
static_assert(kTopkResidentMaxCluster == 16, "kResidentKernels instantiates clusters up to 16 blocks");
static_assert(kTopkMaxRecords + kTopkResidentMaxSlice < INT32_MAX, "ids stay in int32");

template <size_t N>
int IndexOf(const int (&sizes)[N], int cluster) {
  for (size_t i = 0; i < N; ++i)
    if (sizes[i] == cluster) return static_cast<int>(i);
  return -1;
}

int64_t SharedBytes(int capacity) { return kHistogramBytes + int64_t{capacity} * 8; }

// What the launcher learns about a device once: the kernels' shared-memory
// opt-in, the SM count, and how many clusters of each resident size run at
// once (0: that size cannot run there).
struct DeviceSetup {
  cudaError_t error = cudaSuccess;
  int sms = 132;
  int resident_clusters[kResidentSizes] = {};
};

// How many resident clusters of `cluster` blocks the device runs at once; 0
// when it cannot run them (its failure is cleared, not reported).
int ResidentActiveClusters(int index, int sms) {
  const ResidentKernelFn fn = kResidentKernels[index];
  const int cluster = kResidentClusters[index];
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kResidentSharedBytes)) != cudaSuccess ||
      (cluster > 8 &&
       cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    (void)cudaGetLastError();
    return 0;
  }
  int active = 0;
  cudaError_t err;
  if (cluster == 1) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&active, fn, kTopkResidentThreads,
                                                        static_cast<size_t>(kResidentSharedBytes));
    active *= sms;
  } else {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
    config.blockDim = dim3(kTopkResidentThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(kResidentSharedBytes);
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&active, fn, &config);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return active;
}

// Host-side setup of `device`, once per device (the first launch may be under
// CUDA-graph capture: no stream work here).
const DeviceSetup* SetUp(int device) {
  static std::once_flag once[kMaxDevices];
  static DeviceSetup setups[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::call_once(once[device], [device] {
    DeviceSetup& s = setups[device];
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0)
      s.sms = sms;
    for (StreamingKernelFn fn : kStreamingKernels) {
      const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(SharedBytes(kTopkCandidates)));
      if (s.error == cudaSuccess) s.error = e;
    }
    for (int i = 0; i < kResidentSizes; ++i) s.resident_clusters[i] = ResidentActiveClusters(i, s.sms);
  });
  return &setups[device];
}

bool ValidDims(const TopkDims& d) {
  return d.rows >= 0 && d.records >= 0 && d.records <= kTopkMaxRecords && d.top_k >= 0 &&
         d.top_k <= d.records;
}

bool ValidOptions(const TopkLaunchOptions& o) {
  switch (o.kernel) {
    case TopkKernelKind::kAuto:
      return o.cluster == 0 && o.candidates == -1;
    case TopkKernelKind::kStreaming:
      return (o.cluster == 0 || IndexOf(kStreamingClusters, o.cluster) >= 0) && o.candidates >= -1 &&
             o.candidates <= kTopkCandidates;
    case TopkKernelKind::kResident:
      return (o.cluster == 0 || IndexOf(kResidentClusters, o.cluster) >= 0) &&
             (o.candidates == -1 ||
              (o.candidates >= 0 && o.candidates <= kTopkResidentCandidates && o.candidates % 4 == 0));
  }
  return false;
}

int StreamingCluster(const TopkDims& d, int sms) {
  for (int cluster = kTopkMaxCluster; cluster > 1; cluster /= 2) {
    if (d.rows * cluster <= sms && d.records >= cluster * kTopkMinSliceRecords) return cluster;
  }
  return 1;
}

int64_t ResidentSlice(int64_t records, int cluster) {
  const int64_t per_block = (records + cluster - 1) / cluster;
  return std::max<int64_t>(kStepIds, (per_block + kStepIds - 1) / kStepIds * kStepIds);
}

bool ResidentRuns(const TopkDims& d, int index, const DeviceSetup& s) {
  return index >= 0 && ResidentSlice(d.records, kResidentClusters[index]) <= kTopkResidentMaxSlice &&
         s.resident_clusters[index] >= 1;
}

// The most blocks per row that run in one wave with at least
// kTopkResidentMinSlice ids each, else the fewest whose slice fits; 0 when
// no size fits.
int ResidentCluster(const TopkDims& d, const DeviceSetup& s) {
  int one_wave = 0, fewest = 0;
  for (int i = kResidentSizes - 1; i >= 0; --i) {
    if (!ResidentRuns(d, i, s)) continue;
    const int cluster = kResidentClusters[i];
    fewest = cluster;
    if (one_wave == 0 && d.rows <= s.resident_clusters[i] &&
        (cluster == 1 || ResidentSlice(d.records, cluster) >= kTopkResidentMinSlice))
      one_wave = cluster;
  }
  return one_wave != 0 ? one_wave : fewest;
}

TopkLaunchPlan PlanFor(const TopkDims& d, const TopkLaunchOptions& o, const DeviceSetup& s) {
  if (!ValidDims(d) || !ValidOptions(o)) return {};
  if (o.kernel != TopkKernelKind::kStreaming) {
    int cluster = 0;
    if (o.cluster == 0) {
      cluster = ResidentCluster(d, s);
    } else if (ResidentRuns(d, IndexOf(kResidentClusters, o.cluster), s)) {
      cluster = o.cluster;
    }
    if (cluster != 0 || o.kernel == TopkKernelKind::kResident) return {TopkKernelKind::kResident, cluster};
  }
  return {TopkKernelKind::kStreaming, o.cluster != 0 ? o.cluster : StreamingCluster(d, s.sms)};
}

cudaError_t Fail(cudaError_t err, const char* kernel, const char** failed_kernel) {
  if (err != cudaSuccess && failed_kernel != nullptr) *failed_kernel = kernel;
  return err;
}

// Launches `fn` on rows x cluster blocks in clusters of `cluster`.
template <typename Args>
cudaError_t LaunchClusters(void (*fn)(Args), const Args& args, int64_t rows, int cluster, int threads,
                           size_t shared_bytes, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(rows * cluster);
  if (cluster == 1) {
    fn<<<grid, threads, shared_bytes, stream>>>(args);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid, 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&config, fn, args);
  if (err == cudaSuccess) err = cudaGetLastError();
  return err;
}

}  // namespace

TopkLaunchPlan TopkPlan(const TopkDims& dims, const TopkLaunchOptions& options) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  const DeviceSetup* setup = SetUp(device);
  if (setup == nullptr || setup->error != cudaSuccess) return {};
  return PlanFor(dims, options, *setup);
}

cudaError_t LaunchTopk(const TopkDims& d, const TopkBuffers& io, uint32_t* workspace,
                       cudaStream_t stream, const TopkLaunchOptions& options,
                       const char** failed_kernel) {
  constexpr const char* kName = "hisparse topk kernel";
  constexpr const char* kStreamingName = "hisparse topk streaming kernel";
  constexpr const char* kResidentName = "hisparse topk resident kernel";
  if (!ValidDims(d) || !ValidOptions(options)) return Fail(cudaErrorInvalidValue, kName, failed_kernel);
  if (d.rows == 0 || d.top_k == 0) return cudaSuccess;

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return Fail(err, kName, failed_kernel);
  const DeviceSetup* setup = SetUp(device);
  if (setup == nullptr) return Fail(cudaErrorInvalidDevice, kName, failed_kernel);
  if (setup->error != cudaSuccess) return Fail(setup->error, kName, failed_kernel);
  const TopkLaunchPlan plan = PlanFor(d, options, *setup);
  const int index = plan.kernel == TopkKernelKind::kResident ? IndexOf(kResidentClusters, plan.cluster)
                                                             : IndexOf(kStreamingClusters, plan.cluster);
  if (plan.cluster == 0 || index < 0) return Fail(cudaErrorInvalidConfiguration, kName, failed_kernel);
  if (d.rows > INT32_MAX / plan.cluster) return Fail(cudaErrorInvalidValue, kName, failed_kernel);
  const bool vec4 = reinterpret_cast<uintptr_t>(io.scores) % 16 == 0 && d.records % 4 == 0;

  if (plan.kernel == TopkKernelKind::kResident) {
    ResidentArgs a;
    a.scores = io.scores;
    a.sealed = io.sealed;
    a.selected = io.selected;
    a.records = static_cast<int32_t>(d.records);
    a.top_k = static_cast<int32_t>(d.top_k);
    a.slice = static_cast<int32_t>(ResidentSlice(d.records, plan.cluster));
    a.capacity = options.candidates < 0 ? kTopkResidentCandidates : options.candidates;
    a.vec4 = vec4;
    return Fail(LaunchClusters(kResidentKernels[index], a, d.rows, plan.cluster, kTopkResidentThreads,
                               static_cast<size_t>(kResidentSharedBytes), stream),
                kResidentName, failed_kernel);
  }

  TopkArgs a;
  a.scores = io.scores;
  a.sealed = io.sealed;
  a.selected = io.selected;
  a.workspace = workspace;
  a.records = static_cast<int32_t>(d.records);
  a.top_k = static_cast<int32_t>(d.top_k);
  const int64_t per_block = (d.records + plan.cluster - 1) / plan.cluster;
  a.slice = static_cast<int32_t>((per_block + kTileIds - 1) / kTileIds * kTileIds);
  a.bitmap_words = static_cast<int32_t>(TopkWorkspaceWords(d.records) / 2);
  a.capacity = options.candidates < 0 ? kTopkCandidates : options.candidates;
  a.vec4 = vec4;
  return Fail(LaunchClusters(kStreamingKernels[index], a, d.rows, plan.cluster, kTopkThreads,
                             static_cast<size_t>(SharedBytes(a.capacity)), stream),
              kStreamingName, failed_kernel);
}

}  // namespace hisparse

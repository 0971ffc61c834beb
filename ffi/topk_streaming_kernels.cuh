// TOP-K's streaming kernel: a cluster of blocks per row reads the scores
// again at each radix level until the candidates fit in shared memory.
// Included by topk_kernels.cu after topk_device.cuh.
#ifndef HISPARSE_FFI_TOPK_STREAMING_KERNELS_CUH_
#define HISPARSE_FFI_TOPK_STREAMING_KERNELS_CUH_

namespace hisparse {
namespace {

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
  const unsigned long long inclusive = WarpInclusiveSum(v, lane);
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
  // Cleared once, before the first level's barrier (a block gathers at most
  // once). Not at the gathering level: the compiled load of sh.max_local at
  // the end of ChooseBucket also reads the adjacent sh.candidates (racecheck
  // shows reads of its bytes there), and no barrier orders those reads of the
  // previous level before thread 0's reset (a WAR hazard, though the value
  // read is unused).
  if (tid == 0) sh.candidates = 0;
  Selection sel{0u, static_cast<uint32_t>(k), 0u};
  bool gathered = false;
  for (int level = 0; level < kTopkDigits; ++level) {
    uint32_t* const hist = histograms + (level & 1) * kTopkBins;
    for (int i = tid; i < kTopkBins; i += kTopkThreads) hist[i] = 0;
    const bool gather = level > 0 && !gathered && sel.max_local <= static_cast<uint32_t>(capacity);
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

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_STREAMING_KERNELS_CUH_

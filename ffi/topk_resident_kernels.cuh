// TOP-K's resident kernel: a cluster holds its row's scores in shared memory
// for every radix level. Included by topk_kernels.cu after topk_device.cuh.
#ifndef HISPARSE_FFI_TOPK_RESIDENT_KERNELS_CUH_
#define HISPARSE_FFI_TOPK_RESIDENT_KERNELS_CUH_

namespace hisparse {
namespace {

// ===========================================================================
// The resident kernel (the plan is in the comment at the top of this file).

// Aligned slices (A/B, off until measured: BENCHMARKS.md's twentieth pass): every block's slice
// starts on the 16-byte grid of global memory, block 0's first one to three positions before the
// row's first id left empty, so that rows of any length (the slices' R = context + decoded
// tokens + 1 is odd) copy 16 bytes at a time. Off, a row whose length is not a multiple of 4
// copies 4 bytes at a time. The launch leaves room for the lead (ResidentSlice).
#ifndef HISPARSE_TOPK_ALIGNED_SLICES
#define HISPARSE_TOPK_ALIGNED_SLICES 0
#endif
constexpr bool kAlignedSlices = HISPARSE_TOPK_ALIGNED_SLICES != 0;
constexpr int kResidentWarps = kTopkResidentThreads / kWarp;
static_assert(kResidentWarps == kWarp, "a warp reads every warp's count in one load");
static_assert(kTopkResidentMaxCluster <= kWarp && kTopkResidentMaxCluster <= kResidentWarps,
              "a warp reads every block's counts in one load; every block's candidates get a warp");
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
// The counting pass notes, per warp, the positions of its ids at or above e (the sample's estimate
// of T's bucket) in the merged list's space, which nothing else uses before the candidates are in
// place: whenever the bracket comes out at e or e + 1 (the usual case) those are the candidates or
// a superset of them, and no second pass over the slice gathers them. A warp with more such ids
// than its share (ties, a bucket holding much of the row) leaves it to that pass.
constexpr int kNotedPerWarp = kMergedCapacity / kResidentWarps;
// A lane visits 4 ids a step of its warp's range (WarpRange: whole steps, rounded up), at most 32
// at the largest slice: its class counts fit 6 bits.
static_assert((kTopkResidentMaxSlice + kResidentWarps * kStepIds - 1) / (kResidentWarps * kStepIds) * 4 <= 63,
              "a lane's count of a class fits 6 bits");
// Dynamic shared memory (one block per SM): histograms of digits 0 (over a
// bracket of buckets), 1 and 2 (the sample's goes in the third first), the
// slice's score bits [slice], the candidates' keys and positions
// [region] each, and the merged candidate keys of the row (or, in rows that
// do not exchange candidates, this block's share of a merged histogram).
// A slice below kTopkResidentMaxSlice leaves its room to the candidates: up
// to kResidentMaxRegion each (many ties in T's bucket, e.g. one exponent,
// then still pass over a list rather than the slice).
constexpr int kResidentMaxRegion = 8192;
constexpr int64_t kResidentSharedBytes =
    sizeof(uint32_t) * (3 * kTopkBins + kTopkResidentMaxSlice + 2 * int64_t{kTopkResidentCandidates} +
                        kMergedCapacity);
static_assert(kResidentSharedBytes + 4096 <= 227 * 1024, "fits the opt-in shared memory of sm_90");
static_assert(kResidentMaxRegion % kStepIds == 0 && kResidentMaxRegion >= kTopkResidentCandidates,
              "a step never reads past the candidate list");

// Entries of each candidate array for a slice of `slice` ids: what the slice
// leaves of kTopkResidentMaxSlice + 2 x kTopkResidentCandidates, halved, in
// whole steps, at most kResidentMaxRegion (kTopkResidentCandidates at the
// largest slice).
__host__ __device__ constexpr int ResidentRegion(int64_t slice) {
  const int64_t free_words = kTopkResidentMaxSlice + 2 * int64_t{kTopkResidentCandidates} - slice;
  const int64_t region = free_words / 2 / kStepIds * kStepIds;
  return static_cast<int>(region < kResidentMaxRegion ? region : kResidentMaxRegion);
}
static_assert(ResidentRegion(kTopkResidentMaxSlice) == kTopkResidentCandidates, "the largest slice");

struct ResidentArgs {
  const float* scores;    // [S, R]
  const int32_t* sealed;  // [S]
  int32_t* selected;      // [S, k]
  int32_t records;        // R <= kTopkMaxRecords
  int32_t top_k;          // k, 1 <= k <= R
  int32_t slice;          // ids per block: a multiple of kStepIds, <= kTopkResidentMaxSlice
  int32_t region;         // entries of each candidate array: ResidentRegion(slice)
  int32_t capacity;       // candidates a block may gather: a multiple of 4, <= region
  bool vec4;              // every row of scores starts 16-byte aligned (16-byte copies)
};

// What a block's threads share. Peers read `counts`, `share_total`, `totals`.
struct ResidentShared {
  unsigned long long scan[kResidentWarps];            // warp sums of a block scan
  unsigned long long warp_out[kResidentWarps];        // per warp: ids above T (high), equal (low)
  uint32_t warp_counts[kResidentWarps][kBoundaries];  // per warp: ids at or above each boundary
  uint32_t counts[kBoundaries];                       // their sums over the block
  uint32_t probe;     // the sample's largest key in T's estimated bucket (0: none sampled)
  uint32_t probe_count;                               // ids of the block whose key is `probe`
  uint32_t noted_overflow;                            // a warp had more ids at or above e than kNotedPerWarp
  uint32_t share_total[kTopkDigits];                  // per digit: this block's share of the merged histogram
  unsigned long long totals;                          // ids above T (high), equal (low), no exchange
  int32_t estimate[2];  // top-digit buckets where the sample's estimate reaches k, kSafetyFactor x k
  // The decision after the counts' exchange, the same in every block of the row.
  int32_t range_lo, range_hi;  // the bracket of T's top-digit bucket: [range_lo, range_hi)
  uint32_t above;              // ids with top digit >= range_hi
  int32_t gather;              // boundary at range_lo (candidates: top digit >= range_lo), -1: none
  bool exchange;               // every block's candidates fit and are merged in every block
  bool single;                 // T's bucket holds one key, `probe`: T is known, no digit passes
  unsigned long long single_before;  // when single: ids above T (high), equal (low) in lower blocks
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
  const unsigned long long inclusive = WarpInclusiveSum(v, lane);
  if (lane == kWarp - 1) scratch[warp] = inclusive;
  __syncthreads();
  // Lane w holds warp w's sum; scan those across the lanes.
  const unsigned long long warp_sum = scratch[lane];
  const unsigned long long warps_inclusive = WarpInclusiveSum(warp_sum, lane);
  const unsigned long long warps_before = __shfl_sync(kFullMask, warps_inclusive - warp_sum, warp);
  *total = __shfl_sync(kFullMask, warps_inclusive, kWarp - 1);
  __syncthreads();
  return warps_before + inclusive - v;
}

// The ids a pass visits, in ascending id order: the slice's sealed ids (keys
// made from the score bits, or the keys themselves once step 2 has stored
// them in place) or the candidates.
struct Source {
  const uint32_t* bits;      // [slice] score bits (keys when `keys`), when !candidates
  const uint32_t* cand_key;  // [region] keys, when candidates
  const uint32_t* cand_pos;  // [region] positions in the slice (id - first id)
  int size;                  // entries: they set each warp's range
  int limit;                 // entries at or past it are not visited (the slice: its sealed ids)
  bool candidates;
  bool keys;                 // `bits` holds keys already
  int skip = 0;              // entries before it hold no id (aligned slices: block 0's lead)
};

// A lane's 4 consecutive entries of a step.
struct Entries {
  uint32_t key[4];
  int pos[4];      // position in the slice
  unsigned valid;  // bit j: entry j exists
};

// Warp w's range of entries [0, size) (its w-th of 32 contiguous ranges of
// whole steps, so a warp's entries follow those of lower warps).
__device__ __forceinline__ int2 WarpRange(int size, int warp) {
  const int per_warp = (size + kResidentWarps * kStepIds - 1) / (kResidentWarps * kStepIds) * kStepIds;
  const int begin = min(warp * per_warp, size);
  return make_int2(begin, min(begin + per_warp, size));
}

// Visits the entries [0, src.limit) of warp w's range of [0, src.size) step
// by step, lane l holding entries base + 4l .. + 3. visit(entries) is called
// by whole warps; every pass over the same source gives a warp the same
// range, and a lane the entries it copied into shared memory (the slice).
template <typename Visit>
__device__ __forceinline__ void ForEachStep(const Source& src, int warp, int lane, Visit&& visit) {
  const int2 range = WarpRange(src.size, warp);
  const int begin = range.x;
  const int end = min(range.y, src.limit);
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
      e.key[0] = src.keys ? bits.x : TopkOrderedKey(bits.x);
      e.key[1] = src.keys ? bits.y : TopkOrderedKey(bits.y);
      e.key[2] = src.keys ? bits.z : TopkOrderedKey(bits.z);
      e.key[3] = src.keys ? bits.w : TopkOrderedKey(bits.w);
#pragma unroll
      for (int j = 0; j < 4; ++j) e.pos[j] = first + j;
    }
    e.valid = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) e.valid |= first + j < end ? 1u << j : 0u;
    if (kAlignedSlices && base < src.skip) {  // the first step of block 0's first warp
#pragma unroll
      for (int j = 0; j < 4; ++j) e.valid &= first + j < src.skip ? ~(1u << j) : ~0u;
    }
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
// candidates' places, the same in every block. When the bracket is the
// estimated bucket alone (bound[1] = e) and every id in it has the key
// `probe` (ties: quantized scores, a run of zeros), T is that key: sh.single,
// with the counts the output needs (the ids above the bucket and in it, in
// the lower-ranked blocks) taken from the same sums. Warp-collective (warp 0).
template <int kCluster>
__device__ void DecideBracket(ResidentShared& sh, const int (&bound)[kBoundaries], uint32_t unsealed,
                              int k, int capacity, uint32_t probe, unsigned rank, int lane) {
  uint32_t mine[kBoundaries];
#pragma unroll
  for (int b = 0; b < kBoundaries; ++b)
    mine[b] = lane < kCluster ? *Cluster<kCluster>::Map(&sh.counts[b], static_cast<unsigned>(lane)) : 0u;
  const uint32_t mine_probe =
      lane < kCluster ? *Cluster<kCluster>::Map(&sh.probe_count, static_cast<unsigned>(lane)) : 0u;
  int range_lo = 0, range_hi = kTopkBins, gather = -1;
  uint32_t above = 0, count = 0, at_or_above_e = 0;
#pragma unroll
  for (int b = 0; b < kBoundaries; ++b) {
    const uint32_t at_or_above = WarpSum(mine[b]) + (kUnsealedBin >= bound[b] ? unsealed : 0u);
    if (b == 1) at_or_above_e = at_or_above;
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
  // Ids with key `probe` (all in bucket bound[1] when TopBin(probe) is that
  // bucket), against the ids in that bucket.
  const uint32_t probe_ids = WarpSum(mine_probe) + (probe == kTopkUnsealedKey ? unsealed : 0u);
  const bool single =
      gather == 1 && TopBin(probe) == bound[1] && probe_ids == at_or_above_e - above;
  uint32_t total;
  const uint32_t offset = WarpExclusiveSum(count, lane, &total);
  const bool fits = __all_sync(kFullMask, count <= static_cast<uint32_t>(capacity));
  // This block's lower-ranked peers: sealed ids above the bucket, and in it.
  const uint32_t g_lower = WarpSum(lane < static_cast<int>(rank) ? mine[0] : 0u);
  const uint32_t e_lower = WarpSum(lane < static_cast<int>(rank) ? mine[1] - mine[0] : 0u);
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
    sh.single = single;
    sh.single_before = (static_cast<unsigned long long>(g_lower) << 32) | e_lower;
    sh.exchange = !single && gather >= 0 && fits && total <= kMergedCapacity;
  }
}

// Copies every block's candidate keys into `merged`, block after block.
// Block-collective (no barrier); reads the peers' shared memory.
template <int kCluster>
__device__ void MergeCandidates(uint32_t* merged, uint32_t* cand_key, const ResidentShared& sh, int warp,
                                int lane) {
  // Cluster sizes that do not divide the warps leave the last few idle.
  constexpr int kWarpsPerRank = kResidentWarps / kCluster;
  constexpr int kStride = kWarpsPerRank * kWarp;
  const unsigned r = static_cast<unsigned>(warp / kWarpsPerRank);
  if (r >= static_cast<unsigned>(kCluster)) return;
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
  // Shares round up (cluster sizes that do not divide the bins): the last
  // share's bins past kTopkBins hold 0.
  constexpr int kShare = (kTopkBins + kCluster - 1) / kCluster;
  static_assert(kShare <= kTopkResidentThreads || kShare % kTopkResidentThreads == 0,
                "a thread holds a whole number of a share's bins");
  constexpr int kPerThread = kShare > kTopkResidentThreads ? kShare / kTopkResidentThreads : 1;
  const int first = static_cast<int>(rank) * kShare;
  uint32_t local = 0;
  for (int i = tid; i < kShare; i += kTopkResidentThreads) {
    uint32_t sum = first + i == extra_bin ? extra : 0u;
    if (first + i < kTopkBins) {
#pragma unroll 4
      for (int r = 0; r < kCluster; ++r)
        sum += Cluster<kCluster>::Map(hist, static_cast<unsigned>(r))[first + i];
    }
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
  uint32_t* const bits = hist2 + kTopkBins;         // [slice]
  uint32_t* const cand_key = bits + a.slice;        // [region]
  uint32_t* const cand_pos = cand_key + a.region;   // [region]
  uint32_t* const merged = cand_pos + a.region;     // [kMergedCapacity]

  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarp, lane = tid % kWarp;
  const unsigned rank = Cluster<kCluster>::Rank();
  TopkStamp(0);  // entry
  const int64_t row = blockIdx.x / kCluster;
  const int R = a.records, k = a.top_k;
  // Position p of this block's slice holds id lo + p; its ids are [max(lo, 0), hi), and blocks
  // past R (tiny rows) own nothing. With aligned slices lo steps back `lead` ids from the slice's
  // start, to the 16-byte boundary at or before the row's first id: in block 0 the positions
  // [0, skip) hold no id.
  const int lead =
      kAlignedSlices ? static_cast<int>((reinterpret_cast<uintptr_t>(a.scores + row * R) >> 2) & 3u) : 0;
  const int lo = min(static_cast<int>(rank) * a.slice - lead, R);
  const int hi = min(lo + a.slice, R);
  const int skip = kAlignedSlices ? max(-lo, 0) : 0;
  const float* const scores = a.scores + row * R;

  // 1. The sample: quad q of the row's R / 4 quads spread evenly over the
  // threads, the same in every block; its loads go first, so that the
  // estimate below overlaps the copy. Then the slice's scores into shared
  // memory (all of [lo, hi): the copies need not wait for `sealed`).
  const int quads = (R + 3) / 4;
  const int sample_first =
      4 * (quads <= kTopkResidentThreads ? tid
                                         : static_cast<int>(int64_t{tid} * quads / kTopkResidentThreads));
  // Raw loads only: their first use comes after the copies are issued.
  float4 sample_raw = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (a.vec4 && sample_first + 3 < R) {
    sample_raw = __ldg(reinterpret_cast<const float4*>(scores + sample_first));
  } else {
    if (sample_first < R) sample_raw.x = __ldg(scores + sample_first);
    if (sample_first + 1 < R) sample_raw.y = __ldg(scores + sample_first + 1);
    if (sample_first + 2 < R) sample_raw.z = __ldg(scores + sample_first + 2);
    if (sample_first + 3 < R) sample_raw.w = __ldg(scores + sample_first + 3);
  }
  const int sealed_raw = a.sealed[row];
  {
    // Each lane copies exactly the ids it visits in every pass over the slice
    // (ForEachStep's mapping): it waits for its own copies only, no barrier.
    const int2 range = WarpRange(hi - lo, warp);
    for (int first = range.x + 4 * lane; first < range.y; first += kStepIds) {
      // vec4: hi - lo is a multiple of 4; aligned slices: whole chunks of ids, on the 16-byte grid.
      if (kAlignedSlices ? first >= skip && first + 4 <= range.y : a.vec4) {
        CopyToShared16(bits + first, scores + lo + first);
      } else {
        for (int j = 0; j < 4 && first + j < range.y; ++j) {
          if (!kAlignedSlices || first + j >= skip) {
            CopyToShared4(bits + first + j, scores + lo + first + j);
          } else {
            bits[first + j] = 0u;  // no id: defined bits, never visited
          }
        }
      }
    }
  }
  // Ids past R are never sampled (their keys are never read: `sample_first +
  // j < n` below).
  const uint32_t sample_key[4] = {KeyOf(sample_raw.x), KeyOf(sample_raw.y), KeyOf(sample_raw.z),
                                  KeyOf(sample_raw.w)};
  const int n = min(max(sealed_raw, 0), R);
  const uint32_t unsealed = static_cast<uint32_t>(R - n);
  const int sealed_in_slice = max(0, min(hi, n) - lo);  // bits[0, sealed_in_slice)

  for (int i = tid; i < 3 * kTopkBins; i += kTopkResidentThreads) hist0[i] = 0;  // hist0, 1, 2
  if (tid < kBoundaries) sh.counts[tid] = 0;
  if (tid < kTopkDigits) sh.share_total[tid] = 0;
  if (tid == 0) {
    // Without samples (nothing sealed) the unsealed ids' bucket is the guess.
    sh.estimate[0] = kUnsealedBin;
    sh.estimate[1] = 0;
    sh.probe = 0;
    sh.probe_count = 0;
    sh.noted_overflow = 0;
  }
  __syncthreads();
  TopkStamp(1);  // the sample loaded (its keys), histograms cleared
#pragma unroll
  for (int j = 0; j < 4; ++j)
    HistogramAdd(hist2, TopkDigit(sample_key[j], 0), sample_first + j < n, lane);
  __syncthreads();
  TopkStamp(2);  // the sample's histogram
  EstimateBuckets(hist2, n, unsealed, k, sh, tid, warp, lane);
  __syncthreads();
  TopkStamp(3);  // the sample's estimate
  const int estimate = sh.estimate[0];
  int bound[kBoundaries];
#pragma unroll
  for (int b = 0; b < kNearBoundaries; ++b) bound[b] = estimate + 1 - b;
  bound[kBoundaries - 1] = min(estimate - kNearBoundaries + 1, sh.estimate[1]);
  {
    // The probe: the largest sampled key in the estimated bucket, the same in
    // every block (the same sample). If every id of that bucket has this key
    // and T lies there, T is known after the counts (DecideBracket).
    uint32_t probe = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (sample_first + j < n && TopBin(sample_key[j]) == estimate) probe = max(probe, sample_key[j]);
    probe = __reduce_max_sync(kFullMask, probe);
    if (lane == 0 && probe != 0) atomicMax(&sh.probe, probe);
  }
  for (int i = tid; i < kTopkBins; i += kTopkResidentThreads) hist2[i] = 0;  // for digit 2
  __syncthreads();
  const uint32_t probe = sh.probe;
  CopiesWait();  // this lane's ids of the slice (no other lane reads them)
  TopkStamp(4);  // thread 0's copies landed

  // 2. Exact counts at the boundaries; the cluster's sums bracket T's bucket.
  // The slice's keys replace its score bits as this pass goes (each lane its
  // own ids, a whole step in bounds): later passes read keys.
  const Source slice{bits, cand_key, cand_pos, hi - lo, sealed_in_slice, false, true, skip};
  uint32_t* const noted_positions = merged + warp * kNotedPerWarp;  // this warp's ids at or above e
  {
    // An id's class c is the number of boundaries it reaches, 0 to 5 (bound[0..3] = e + 1 .. e - 2
    // descend by one and bound[4] <= e - 3), so the ids at or above bound[b] are those of class
    // >= 5 - b. A lane adds 1 << 6 (c - 1) for each of its ids of class c >= 1 into one word of
    // 6-bit fields: fewer instructions than five compares and adds an id, in a pass bound by its
    // issue rate (Nsight Compute: ~0.56 instructions a cycle per scheduler). With the notes the
    // pass takes ~1.4 us more than before and the gather's second pass (~2.8 us) goes: 22.8 ->
    // 21.9 us a call at 17 x 131072 on an H100 (BENCHMARKS.md, nineteenth pass).
    uint32_t classes = 0;
    uint32_t probe_count = 0;
    uint32_t noted = 0;  // this warp's ids at or above e so far (past kNotedPerWarp: not all noted)
    const int below_near = estimate - kNearBoundaries + 1;  // the highest bucket no near boundary reaches
    const int far = bound[kBoundaries - 1];
    const Source slice_bits{bits, cand_key, cand_pos, hi - lo, sealed_in_slice, false, false, skip};
    const unsigned lower_lanes = (1u << lane) - 1u;
    ForEachStep(slice_bits, warp, lane, [&](const Entries& e) {
      unsigned take = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int bin = TopBin(e.key[j]);
        const int c = min(max(bin - below_near, 0), kNearBoundaries) + (bin >= far ? 1 : 0);
        const bool valid = Valid(e, j);
        classes += valid ? (1u << (6 * c)) >> 6 : 0u;
        probe_count += (valid && e.key[j] == probe) ? 1u : 0u;
        take |= (valid && c >= kBoundaries - 1) ? 1u << j : 0u;  // class >= 4: at or above bound[1] = e
      }
      *reinterpret_cast<uint4*>(bits + e.pos[0]) = make_uint4(e.key[0], e.key[1], e.key[2], e.key[3]);
      // This lane's place among the step's noted ids (lower lanes' first, then its own in order)
      // from four ballots: independent instructions, not a chain of shuffles in the pass.
      uint32_t slot = noted, step_total = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned m = __ballot_sync(kFullMask, (take >> j) & 1u);
        slot += static_cast<uint32_t>(__popc(m & lower_lanes));
        step_total += static_cast<uint32_t>(__popc(m));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if ((take >> j) & 1u) {
          if (slot < static_cast<uint32_t>(kNotedPerWarp)) noted_positions[slot] = static_cast<uint32_t>(e.pos[j]);
          ++slot;
        }
      }
      noted += step_total;
    });
    if (lane == 0 && noted > static_cast<uint32_t>(kNotedPerWarp)) atomicOr(&sh.noted_overflow, 1u);
    uint32_t count[kBoundaries];
    uint32_t at_or_above = 0;
#pragma unroll
    for (int b = 0; b < kBoundaries; ++b) {
      const int c = kBoundaries - b;  // the ids at or above bound[b]: classes c .. 5
      at_or_above += (classes >> (6 * (c - 1))) & 63u;
      count[b] = at_or_above;
    }
#pragma unroll
    for (int b = 0; b < kBoundaries; ++b) {
      count[b] = WarpSum(count[b]);
      if (lane == 0) {
        sh.warp_counts[warp][b] = count[b];
        atomicAdd(&sh.counts[b], count[b]);
      }
    }
    probe_count = WarpSum(probe_count);
    if (lane == 0 && probe_count > 0) atomicAdd(&sh.probe_count, probe_count);
  }
  TopkStamp(5);  // thread 0's share of the slice landed and counted
  Cluster<kCluster>::Sync();
  if (warp == 0) DecideBracket<kCluster>(sh, bound, unsealed, k, a.capacity, probe, rank, lane);
  __syncthreads();
  TopkStamp(6);  // the cluster's counts exchanged, the bracket decided
  const int range_lo = sh.range_lo, range_hi = sh.range_hi, gather = sh.gather;
  const bool exchange = sh.exchange;
  // T's bucket holds one key: no candidates, no digits, and the output's
  // counts are the boundary counts already taken.
  const bool single = sh.single;
  uint32_t remaining = static_cast<uint32_t>(k) - sh.above;
  uint32_t prefix = static_cast<uint32_t>(range_lo) << TopkDigitShift(0);

  // 3. Candidates: the ids with top digit >= range_lo (every id the selection
  // can take), in id order, when this block's fit.
  const uint32_t gathered = gather >= 0 ? sh.rank_count[rank] : 0u;
  const bool use_candidates = !single && gather >= 0 && gathered <= static_cast<uint32_t>(a.capacity);
  // The counting pass noted every id at or above e = bound[1]: the candidates when gather is 1,
  // a superset of them (filtered here) when it is 0.
  const bool all_noted = sh.noted_overflow == 0 && (gather == 0 || gather == 1);
  if (use_candidates) {
    const uint32_t per_warp = sh.warp_counts[lane][gather];  // lane w: warp w's count
    uint32_t at = WarpSum(lane < warp ? per_warp : 0u);
    if (all_noted) {
      const int noted = static_cast<int>(sh.warp_counts[warp][1]);
      for (int base = 0; base < noted; base += kWarp) {
        const int i = base + lane;
        const uint32_t pos = i < noted ? noted_positions[i] : 0u;
        const uint32_t key = i < noted ? bits[pos] : 0u;
        const bool keep = i < noted && TopBin(key) >= range_lo;
        const unsigned kept = __ballot_sync(kFullMask, keep);
        if (keep) {
          const uint32_t slot = at + static_cast<uint32_t>(__popc(kept & ((1u << lane) - 1u)));
          cand_key[slot] = key;
          cand_pos[slot] = pos;
        }
        at += static_cast<uint32_t>(__popc(kept));
      }
    } else if (__shfl_sync(kFullMask, per_warp, warp) > 0) {
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
  const Source src =
      use_candidates
          ? Source{bits, cand_key, cand_pos, static_cast<int>(gathered), static_cast<int>(gathered), true, true}
          : slice;
  if (use_candidates && !exchange) __syncthreads();  // passes read other warps' candidates

  TopkStamp(7);  // candidates gathered
  // 4. The digits.
  uint32_t threshold, ties;
  unsigned long long before = 0;  // ids above T (high) and equal (low) in lower-ranked blocks
  if (single) {
    threshold = probe;
    ties = remaining;
    before = sh.single_before;
    Cluster<kCluster>::Arrive();  // DecideBracket's were the last reads of a peer
  } else if (exchange) {
    // Typical rows: the row's candidates fit in one block. Every block merges
    // them and finishes alone.
    Cluster<kCluster>::Sync();  // every block's candidates are in place
    TopkStamp(8);  // the cluster's candidates in place
    MergeCandidates<kCluster>(merged, cand_key, sh, warp, lane);
    Cluster<kCluster>::Arrive();  // no peer's shared memory is read after this
    __syncthreads();
    TopkStamp(9);  // candidates merged
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
    TopkStamp(10);  // the digits resolved
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

  TopkStamp(11);  // T known
  // 5. Output: every id above T, and the first `ties` equal to T, at its
  // place in ascending id order.
  uint32_t g_warp = 0, e_warp = 0;
  if (single) {
    // The boundary counts of step 2 over the same source (the slice): above
    // T's bucket, and in it (every id of which has the key T).
    g_warp = sh.warp_counts[warp][0];
    e_warp = sh.warp_counts[warp][1] - g_warp;
  } else {
    ForEachStep(src, warp, lane, [&](const Entries& e) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        g_warp += (Valid(e, j) && e.key[j] > threshold) ? 1u : 0u;
        e_warp += (Valid(e, j) && e.key[j] == threshold) ? 1u : 0u;
      }
    });
    g_warp = WarpSum(g_warp);
    e_warp = WarpSum(e_warp);
  }
  if (lane == 0) sh.warp_out[warp] = (static_cast<unsigned long long>(g_warp) << 32) | e_warp;
  __syncthreads();
  const unsigned long long per_warp = sh.warp_out[lane];  // lane w: warp w's counts
  const unsigned long long warps_before = WarpSum(lane < warp ? per_warp : 0ull);
  const unsigned long long block_total = WarpSum(per_warp);
  if (!exchange && !single) {
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
  TopkStamp(12);  // the lower blocks' output counts known
  const uint32_t g_before = static_cast<uint32_t>(before >> 32), e_before = static_cast<uint32_t>(before);
  int32_t* const out = a.selected + row * k;
  // Selected ids before an id: every id above T, the first `ties` equal to T.
  uint32_t g_seen = g_before + static_cast<uint32_t>(warps_before >> 32);
  uint32_t e_seen = e_before + static_cast<uint32_t>(warps_before);
  // A warp writes when it holds an id above T, or one of the first `ties`
  // equal to T (many ties: most warps hold only ties past the first `ties`).
  if (g_warp > 0 || (e_warp > 0 && e_seen < ties)) {
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
  TopkStamp(13);  // output written
  Cluster<kCluster>::Wait();
}

#ifdef HISPARSE_TOPK_TRACE
// The trace build's launch floor: the resident kernel's launch shape (its grid, clusters, 1024
// threads and shared memory) doing nothing but the stamps and one cluster barrier, so that the
// bench can set a launch's time against what the launch alone costs.
template <int kCluster>
__global__ void __launch_bounds__(kTopkResidentThreads, 1) TopkResidentEmptyKernel(const ResidentArgs) {
  TopkStamp(0);
  Cluster<kCluster>::Sync();
  TopkStamp(13);
}
#endif

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_RESIDENT_KERNELS_CUH_

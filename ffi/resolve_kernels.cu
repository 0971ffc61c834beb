// RESOLVE and the pool write on CUDA: the contract of resolve.h, bit-identical
// to resolve_cpu.cc. See resolve_cuda.h for the launch plans.
//
// Resolve kernel: one block per stream, of kResolveThreads (32 warps), or of
// kResolveThreadsSmall (16 warps) when there are more streams than SMs and
// B <= kResolveSmallBlockMaxSlots. The kernel is latency-bound (dependent
// global and shared-memory round trips between barriers, a few items per
// thread) and a 1024-thread block at 64 registers takes a whole SM, so 256
// streams on 132 SMs ran in two waves; 512-thread blocks let two streams
// share an SM in one wave instead.
// Shared memory holds an open-addressing table of the selected ids as two
// arrays (keys[cap], words[cap], cap = pow2 >= 2k: 4-byte strides spread
// random probes over all 32 banks, where int2 entries used only 16), the miss
// plan (int2 {slot, record} x k) and a hit bitmap (B bits). Ids hash by the
// high bits of a Fibonacci product, so ids that share their low bits (strided
// page ids) do not pile up in one probe run. Per-item values live in
// registers: lane l of warp w owns the selection positions
// j = w * 32 * rk + 32 * c + l (c < rk rounds) and the lru positions
// i = w * 32 * rb + 32 * c + l, so ballots plus one scan of the warp totals
// rank items in their global order. Only set membership, min and max go
// through atomics, so every result is independent of thread timing (and of
// the table layout):
//   1. table <- empty (key -1, word INT_MAX); miss plan <- -1
//   2. insert each valid id; word = atomicMin(position)      (rule 0, 1)
//   3. item j is its id's first appearance iff word == j (word < k)
//   4. slot b holding a selected id: word = atomicMax(k + b), hit bit of b
//      (max b, like the CPU's last-writer-wins scan; k + b > any position,
//      so no pass resets the word in between)
//   5. count per warp: misses (first appearance, word still < k) and
//      evictables (lru items whose slot is not hit); warp 0 scans the totals
//   6. evictable of rank r: new lru position r - M (kept) or E - M + r
//      (taken by miss r, plan[r].slot); hit of rank h: position E + h.
//      Miss of rank m: word = -(m + 2), plan[m].record = id  (rules 2-4)
//   7. slots[j] from the word (>= k: hit slot word - k; <= -2: plan[m].slot),
//      miss_records / miss_slots / slot_record from the plan      (rule 6)
//   8. fused plan: the block's warps copy its misses               (rule 5)
// Fetch kernel (split plan): blocks of kFetchThreads, spread over
// (chunks x streams); warp g of a stream takes misses g, g + G, ... .
// Copies move 16 B (8 B when the record or a base pointer does not allow it)
// per lane: ld.global.nc from the pinned pool, st.global.cg into hot. A warp
// keeps several rows in flight (RowBatch: up to 32 x unroll vectors) so the
// host link stays busy; few misses are spread one row per warp instead.
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "resolve_cuda.h"

namespace hisparse {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kFetchWarps = kFetchThreads / kWarp;
static_assert(kResolveThreads == 1024 && kResolveThreadsSmall % kWarp == 0 &&
                  kResolveThreadsSmall <= kResolveThreads,
              "the warp-total scan holds one warp total per lane of warp 0");
constexpr int kLargeSharedBytes = 48 * 1024;  // above this a kernel must opt in
constexpr int kMaxDevices = 64;

// Vectors in flight per lane in one copy batch: fused copies run inside the
// resolve kernel (64 registers per thread), the split fetch kernel has room.
constexpr int kFusedCopyUnroll = 4;
constexpr int kFetchCopyUnroll = 8;

// Item flags packed with the table entry index (entries < 2^15).
constexpr int kEntryMask = (1 << 16) - 1;
constexpr int kFirstAppearance = 1 << 16;

// ---------------------------------------------------------------------------
// Kernel arguments.

struct ResolveArgs {
  const uint8_t* host_pool;  // [L, S, R, W] pinned host
  const int32_t* selection;  // [S, k]
  const int32_t* sealed;     // [S]
  const int32_t* layer;      // [] device scalar
  uint8_t* hot;              // [L, S, B, W]
  int32_t* slot_record;      // [L, S, B]
  int32_t* lru;              // [L, S, B]
  int32_t* slots;            // [S, k]
  int32_t* miss_records;     // [S, k]
  int32_t* miss_slots;       // [S, k]
  int32_t* misses;           // [S]
  int32_t* invalid;          // [S]
  int64_t layers, streams, record_bytes;
  int32_t top_k, hot_slots, pool_records;
  uint32_t table_mask;   // table capacity - 1
  uint32_t table_shift;  // 32 - log2(table capacity)
  int32_t copy_vector;  // 16 or 8: bytes per lane access
  int32_t row_batch;    // rows a warp keeps in flight (fused copy)
  bool fused_fetch;     // copy misses inside the resolve kernel
};

struct FetchArgs {
  const uint8_t* host_pool;     // [L, S, R, W] pinned host
  const int32_t* layer;         // [] device scalar
  const int32_t* miss_records;  // [S, k]
  const int32_t* miss_slots;    // [S, k]
  const int32_t* misses;        // [S]
  uint8_t* hot;                 // [L, S, B, W]
  int64_t layers, streams, record_bytes;
  int32_t top_k, hot_slots, pool_records;
  int32_t chunks;     // blocks per stream
  int32_t row_batch;  // rows a warp keeps in flight at most
};

struct PoolWriteArgs {
  const uint8_t* records;  // [L, S, n, W] device
  const int32_t* start;    // [S]
  const int32_t* count;    // [S]
  uint8_t* host_pool;      // [L, S, R, W] pinned host
  int64_t layers, streams, rows, pool_records, record_bytes;
};

// ---------------------------------------------------------------------------
// Device helpers.

// Fibonacci hashing: the high bits of the product depend on every bit of the
// id (the low bits would depend only on the id's low bits).
__device__ __forceinline__ uint32_t HashId(int32_t id, uint32_t shift) {
  return (static_cast<uint32_t>(id) * 2654435761u) >> shift;
}

// The id table in shared memory: keys[e] (-1 = empty) and words[e].
struct IdTable {
  int* keys;
  int* words;
  uint32_t mask, shift;

  // Inserts a valid id (>= 0) and lowers its word to `position`.
  __device__ __forceinline__ void Insert(int32_t id, int32_t position) const {
    uint32_t i = HashId(id, shift);
    while (true) {
      const int prev = atomicCAS(&keys[i], -1, id);
      if (prev == -1 || prev == id) {
        atomicMin(&words[i], position);
        return;
      }
      i = (i + 1) & mask;
    }
  }

  // Entry index of a valid id, or -1 when absent. Keys are stable (called
  // after the insert phase and a barrier).
  __device__ __forceinline__ int Find(int32_t id) const {
    uint32_t i = HashId(id, shift);
    while (true) {
      const int key = keys[i];
      if (key == id) return static_cast<int>(i);
      if (key == -1) return -1;
      i = (i + 1) & mask;
    }
  }
};

__device__ __forceinline__ unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

template <typename V>
__device__ __forceinline__ V LoadPool(const V* p) {
  return __ldg(p);  // ld.global.nc: the pool is read-only during the call
}

// One warp copies the rows of one batch: row t < rows (t < 32) goes from
// src_base + rec_t * W to dst_base + slot_t * W, where lane t holds rec_t and
// slot_t (rec_t < 0: skip). The rows' vectors are numbered flat (row-major)
// and dealt to the lanes kUnroll at a time, loads first, then stores, so a
// warp keeps up to 32 x kUnroll vectors in flight. rows * n <= 32 * kUnroll
// unless rows == 1 (long records loop over segments).
template <typename V, int kUnroll, bool kStreamingStore>
__device__ __forceinline__ void CopyRowBatch(const uint8_t* src_base, uint8_t* dst_base,
                                             int64_t record_bytes, int n, int rows, int lane,
                                             int lane_rec, int lane_slot) {
  const int total = rows * n;
  for (int base = 0; base < total; base += kWarp * kUnroll) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = base + u * kWarp + lane;
      const int t = rows == 1 ? 0 : f / n;
      const int rec = __shfl_sync(kFullMask, lane_rec, t & (kWarp - 1));
      if (f < total && rec >= 0)
        v[u] = LoadPool(reinterpret_cast<const V*>(src_base + rec * record_bytes) + (f - t * n));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = base + u * kWarp + lane;
      const int t = rows == 1 ? 0 : f / n;
      const int rec = __shfl_sync(kFullMask, lane_rec, t & (kWarp - 1));
      const int slot = __shfl_sync(kFullMask, lane_slot, t & (kWarp - 1));
      if (f < total && rec >= 0 && slot >= 0) {
        V* dst = reinterpret_cast<V*>(dst_base + slot * record_bytes) + (f - t * n);
        if constexpr (kStreamingStore) {
          __stcg(dst, v[u]);
        } else {
          *dst = v[u];
        }
      }
    }
  }
}

// Rows a warp copies per batch so that rows * n fills 32 x unroll vectors.
__host__ __device__ __forceinline__ int RowBatch(int64_t vectors_per_row, int unroll) {
  const int64_t capacity = int64_t{kWarp} * unroll;
  if (vectors_per_row >= capacity) return 1;
  const int64_t rows = capacity / vectors_per_row;
  return rows > kWarp ? kWarp : static_cast<int>(rows);
}

// Copies misses [0, M) of one stream with `warps` warps, warp g taking the
// misses g + t * warps of each batch of rows_per_warp * warps. The plan is
// read through `plan_at(m) -> int2 {slot, record}`.
template <typename V, int kUnroll, typename PlanAt>
__device__ __forceinline__ void CopyMisses(const uint8_t* src_base, uint8_t* dst_base,
                                           int64_t record_bytes, int hot_slots, int max_batch,
                                           int misses, int warp, int warps, int lane,
                                           PlanAt plan_at) {
  if (misses <= 0) return;
  const int n = static_cast<int>(record_bytes / static_cast<int64_t>(sizeof(V)));
  // Few misses: one row per warp spreads them over more warps (and SMs).
  const int per_warp = (misses + warps - 1) / warps;
  const int rows = per_warp < max_batch ? per_warp : max_batch;
  for (int first = 0; first < misses; first += rows * warps) {
    int lane_rec = -1, lane_slot = -1;
    const int m = first + warp + lane * warps;
    if (lane < rows && m < misses) {
      const int2 p = plan_at(m);
      if (p.x >= 0 && p.x < hot_slots && p.y >= 0) {
        lane_slot = p.x;
        lane_rec = p.y;
      }
    }
    CopyRowBatch<V, kUnroll, true>(src_base, dst_base, record_bytes, n, rows, lane, lane_rec,
                                   lane_slot);
  }
}

// Per-lane slot ids held in registers; the packed form keeps two per register
// (slots < kMaxResolveHotSlots <= 2^15; anything else reads back as -1, which
// only a malformed lru can produce).
template <int N, bool kPacked>
struct SlotList {
  int v[N];
  __device__ __forceinline__ void Set(int c, int slot) { v[c] = slot; }
  __device__ __forceinline__ int Get(int c) const { return v[c]; }
};

template <int N>
struct SlotList<N, true> {
  static_assert(N % 2 == 0 && kMaxResolveHotSlots <= 0x8000, "two 16-bit slots per word");
  uint32_t w[N / 2];
  __device__ __forceinline__ void Set(int c, int slot) {
    const uint32_t bits = slot >= 0 && slot < 0x8000 ? static_cast<uint32_t>(slot) : 0xffffu;
    if (c % 2 == 0) {
      w[c / 2] = bits;
    } else {
      w[c / 2] |= bits << 16;
    }
  }
  __device__ __forceinline__ int Get(int c) const {
    const uint32_t bits = (w[c / 2] >> (16 * (c % 2))) & 0xffffu;
    return bits == 0xffffu ? -1 : static_cast<int>(bits);
  }
};

__device__ __forceinline__ int WarpSum(int v) {
#pragma unroll
  for (int d = kWarp / 2; d > 0; d /= 2) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

// Layer outside [0, L): nothing resolves, state untouched.
template <int kThreads>
__device__ void ResolveNothing(const ResolveArgs& a, int stream, int* warp_counts) {
  const int k = a.top_k;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int32_t* sel = a.selection + int64_t{stream} * k;
  const int64_t out = int64_t{stream} * k;
  int invalid = 0;
  for (int j = tid; j < k; j += kThreads) {
    invalid += sel[j] != -1;
    a.slots[out + j] = -1;
    a.miss_records[out + j] = -1;
    a.miss_slots[out + j] = -1;
  }
  invalid = WarpSum(invalid);
  if (lane == 0) warp_counts[warp] = invalid;
  __syncthreads();
  if (warp == 0) {
    const int total = WarpSum(lane < kThreads / kWarp ? warp_counts[lane] : 0);
    if (lane == 0) {
      a.misses[stream] = 0;
      a.invalid[stream] = total;
    }
  }
}

// ---------------------------------------------------------------------------
// Resolve kernel. kThreads: threads of the block; kRounds: most lru items per
// lane (B <= kThreads * kRounds). Selection items per lane are at most
// min(kRounds, 8): k <= B, and k <= 8192 = 1024 x 8.

template <int kThreads, int kRounds>
__global__ void __launch_bounds__(kThreads, kResolveThreads / kThreads)
    ResolveKernel(const ResolveArgs a) {
  constexpr int kWarps = kThreads / kWarp;
  constexpr int kSelRounds = kRounds < 8 ? kRounds : 8;
  static_assert(kThreads == kResolveThreads || kRounds <= 8,
                "smaller blocks only serve B <= 8 x kThreads (so k <= 8 x kThreads)");
  extern __shared__ int2 shared[];
  __shared__ int warp_misses[kWarps];
  __shared__ int warp_evictables[kWarps];
  __shared__ int warp_invalid[kWarps];
  __shared__ int block_totals[3];  // misses, evictables, invalid

  const int stream = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int k = a.top_k, B = a.hot_slots;
  const uint32_t mask = a.table_mask;
  int* keys = reinterpret_cast<int*>(shared);                     // [mask + 1]
  int* words = keys + mask + 1;                                   // [mask + 1]
  int2* plan = reinterpret_cast<int2*>(words + mask + 1);         // [k] {slot, record}
  uint32_t* hit_bits = reinterpret_cast<uint32_t*>(plan + k);     // [ceil(B / 32)]
  const IdTable table{keys, words, mask, a.table_shift};

  // Lane-owned positions (see the file comment).
  const int sel_rounds = (k + kThreads - 1) / kThreads;
  const int lru_rounds = (B + kThreads - 1) / kThreads;
  const int j0 = warp * kWarp * sel_rounds + lane;
  const int i0 = warp * kWarp * lru_rounds + lane;

  // Issue every global read up front; their latency overlaps steps 1-2. The
  // selection and sealed do not depend on the layer: load them with it.
  const int32_t* sel = a.selection + int64_t{stream} * k;
  int id[kSelRounds];
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    id[c] = (c < sel_rounds && j < k) ? sel[j] : -1;
  }
  const int sealed = a.sealed[stream];
  const int layer = *a.layer;
  if (layer < 0 || layer >= a.layers) {
    ResolveNothing<kThreads>(a, stream, warp_invalid);
    return;
  }
  const int64_t ls = int64_t{layer} * a.streams + stream;
  int32_t* slot_record = a.slot_record + ls * B;
  int32_t* lru = a.lru + ls * B;
  const int limit = max(0, min(sealed, a.pool_records));
  // slot_record[b], b = c * threads + tid, and lru[i], i = i0 + 32 c (-1 past
  // B). The largest variant loads them later, when other items are dead, and
  // packs the lru, to stay within 64 registers.
  constexpr bool kEarly = kRounds <= 8;
  int held[kRounds];
  auto load_held = [&] {
#pragma unroll
    for (int c = 0; c < kRounds; ++c) {
      const int b = c * kThreads + tid;
      held[c] = b < B ? slot_record[b] : -1;
    }
  };
  if constexpr (kEarly) load_held();
  SlotList<kRounds, !kEarly> order;
  auto load_lru = [&] {
#pragma unroll
    for (int c = 0; c < kRounds; ++c) {
      const int i = i0 + c * kWarp;
      order.Set(c, (c < lru_rounds && i < B) ? lru[i] : -1);
    }
  };
  if constexpr (kEarly) load_lru();

  // 1. Empty table and plan.
  for (uint32_t e = tid; e <= mask; e += kThreads) {
    keys[e] = -1;
    words[e] = INT_MAX;
  }
  for (int m = tid; m < k; m += kThreads) plan[m] = make_int2(-1, -1);
  __syncthreads();

  // 2. Rule 0 and the distinct ids with their first position.
  int invalid = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    if (id[c] == -1) continue;
    if (id[c] < 0 || id[c] >= limit) {
      ++invalid;
      id[c] = -1;  // padding from here on
      continue;
    }
    table.Insert(id[c], j0 + c * kWarp);
  }
  __syncthreads();

  // 3. Entry of each valid item; is it the first appearance?
  // From here on an item is known by its entry (the id is keys[entry]).
  int entry[kSelRounds];  // entry index | kFirstAppearance, or -1
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    entry[c] = -1;
    if (id[c] >= 0) {
      const int e = table.Find(id[c]);
      entry[c] = e | (words[e] == j0 + c * kWarp ? kFirstAppearance : 0);
    }
  }
  if constexpr (!kEarly) load_held();
  __syncthreads();

  // 4. Hit slots: word = k + largest slot holding the id (every word is a
  // position < k before this step). Hit bits of 32 consecutive slots belong
  // to one warp round.
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const int b = c * kThreads + tid;
    bool hit = false;
    if (b < B && held[c] >= 0 && held[c] < limit) {
      const int e = table.Find(held[c]);
      if (e >= 0) {
        atomicMax(&words[e], k + b);
        hit = true;
      }
    }
    const unsigned bits = __ballot_sync(kFullMask, hit);
    const int b_warp = c * kThreads + warp * kWarp;
    if (lane == 0 && b_warp < B) hit_bits[b_warp / kWarp] = bits;
  }
  if constexpr (!kEarly) load_lru();
  __syncthreads();

  // 5. Count misses and evictables per warp, then scan the warp totals.
  unsigned miss_flags = 0, evict_flags = 0;
  int misses_in_warp = 0, evictables_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const bool miss = entry[c] >= 0 && (entry[c] & kFirstAppearance) &&
                      words[entry[c] & kEntryMask] < k;
    miss_flags |= unsigned{miss} << c;
    misses_in_warp += __popc(__ballot_sync(kFullMask, miss));
  }
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const int slot = order.Get(c);
    const bool in_lru = c < lru_rounds && i0 + c * kWarp < B;
    const bool hit = slot >= 0 && slot < B && ((hit_bits[slot / kWarp] >> (slot % kWarp)) & 1u);
    const bool evictable = in_lru && !hit;
    evict_flags |= unsigned{evictable} << c;
    evictables_in_warp += __popc(__ballot_sync(kFullMask, evictable));
  }
  invalid = WarpSum(invalid);
  if (lane == 0) {
    warp_misses[warp] = misses_in_warp;
    warp_evictables[warp] = evictables_in_warp;
    warp_invalid[warp] = invalid;
  }
  __syncthreads();
  if (warp == 0) {
    const bool owner = lane < kWarps;  // lanes past the warp count add zeros
    const int mv = owner ? warp_misses[lane] : 0, ev = owner ? warp_evictables[lane] : 0;
    int mi = mv, ei = ev;  // inclusive scans
#pragma unroll
    for (int d = 1; d < kWarp; d *= 2) {
      const int mu = __shfl_up_sync(kFullMask, mi, d), eu = __shfl_up_sync(kFullMask, ei, d);
      if (lane >= d) {
        mi += mu;
        ei += eu;
      }
    }
    const int total_invalid = WarpSum(owner ? warp_invalid[lane] : 0);
    if (owner) {
      warp_misses[lane] = mi - mv;
      warp_evictables[lane] = ei - ev;
    }
    if (lane == kWarp - 1) {
      block_totals[0] = mi;
      block_totals[1] = ei;
      block_totals[2] = total_invalid;
    }
  }
  __syncthreads();
  const int M = block_totals[0], E = block_totals[1];

  // 6a. New lru, and the slot each miss takes (rules 3, 4).
  int evict_rank = warp_evictables[warp];
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const bool evictable = (evict_flags >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, evictable);
    const int i = i0 + c * kWarp;
    if (c < lru_rounds && i < B) {
      const int r = evict_rank + __popc(bits & LanesBelow(lane));
      int position;
      if (evictable) {
        position = r >= M ? r - M : E - M + r;
        if (r < M) plan[r].x = order.Get(c);
      } else {
        position = E + (i - r);
      }
      // Always in [0, B) unless a malformed state holds a record twice.
      if (position >= 0 && position < B) lru[position] = order.Get(c);
    }
    evict_rank += __popc(bits);
  }
  // 6b. Miss ranks in first-appearance order (rule 2).
  int miss_rank = warp_misses[warp];
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const bool miss = (miss_flags >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, miss);
    if (miss) {
      const int m = miss_rank + __popc(bits & LanesBelow(lane));
      const int e = entry[c] & kEntryMask;
      plan[m].y = keys[e];
      words[e] = -(m + 2);
    }
    miss_rank += __popc(bits);
  }
  __syncthreads();

  // 7. Outputs (rule 6) and the new slot records (rule 5). A valid item's
  // word is now k + its hit slot, or -(m + 2) for miss m.
  const int64_t out = int64_t{stream} * k;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    if (c < sel_rounds && j < k) {
      int slot = -1;
      if (entry[c] >= 0) {
        const int word = words[entry[c] & kEntryMask];
        slot = word >= k ? word - k : (word <= -2 ? plan[-(word + 2)].x : -1);
      }
      a.slots[out + j] = slot;
    }
  }
  for (int m = tid; m < k; m += kThreads) {
    const bool taken = m < M;
    const int2 p = taken ? plan[m] : make_int2(-1, -1);
    a.miss_records[out + m] = p.y;
    a.miss_slots[out + m] = p.x;
    if (taken && p.x >= 0 && p.x < B) slot_record[p.x] = p.y;
  }
  if (tid == 0) {
    a.misses[stream] = M;
    a.invalid[stream] = block_totals[2];
  }

  // 8. Fused plan: this block copies its own misses.
  if (a.fused_fetch) {
    const int64_t W = a.record_bytes;
    const uint8_t* src = a.host_pool + ls * a.pool_records * W;
    uint8_t* dst = a.hot + ls * B * W;
    auto plan_at = [plan](int m) { return plan[m]; };
    if (a.copy_vector == 16) {
      CopyMisses<int4, kFusedCopyUnroll>(src, dst, W, B, a.row_batch, M, warp, kWarps, lane,
                                         plan_at);
    } else {
      CopyMisses<uint2, kFusedCopyUnroll>(src, dst, W, B, a.row_batch, M, warp, kWarps, lane,
                                          plan_at);
    }
  }
}

// ---------------------------------------------------------------------------
// Split plan: copy every stream's misses with many blocks.

template <typename V>
__global__ void __launch_bounds__(kFetchThreads) FetchKernel(const FetchArgs a) {
  const int stream = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int layer = *a.layer;
  if (layer < 0 || layer >= a.layers) return;
  const int misses = a.misses[stream];
  const int64_t ls = int64_t{layer} * a.streams + stream;
  const int64_t W = a.record_bytes;
  const int64_t out = int64_t{stream} * a.top_k;
  const int32_t* miss_records = a.miss_records + out;
  const int32_t* miss_slots = a.miss_slots + out;
  auto plan_at = [=](int m) { return make_int2(miss_slots[m], miss_records[m]); };
  CopyMisses<V, kFetchCopyUnroll>(a.host_pool + ls * a.pool_records * W, a.hot + ls * a.hot_slots * W,
                                  W, a.hot_slots, a.row_batch, misses,
                                  chunk * kFetchWarps + warp, a.chunks * kFetchWarps, lane,
                                  plan_at);
}

// ---------------------------------------------------------------------------
// Pool write: one warp per row, straight into pinned host memory.

template <typename V>
__global__ void __launch_bounds__(kFetchThreads) PoolWriteKernel(const PoolWriteArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * kFetchWarps;
  const int64_t n = a.rows, W = a.record_bytes, R = a.pool_records;
  const int vectors = static_cast<int>(W / static_cast<int64_t>(sizeof(V)));
  const int64_t total = a.layers * a.streams * n;
  for (int64_t row = int64_t{blockIdx.x} * kFetchWarps + threadIdx.x / kWarp; row < total;
       row += warps) {
    const int64_t ls = row / n, i = row - ls * n, s = ls % a.streams;
    const int32_t offered = a.count[s];
    const int64_t count = offered < 0 ? 0 : (offered < n ? offered : n);
    const int64_t r = int64_t{a.start[s]} + i;
    if (i >= count || r < 0 || r >= R) continue;
    // Row-relative addressing: rec 0 of the row's own base, slot 0 of the pool row.
    CopyRowBatch<V, kFetchCopyUnroll, false>(a.records + row * W, a.host_pool + (ls * R + r) * W, W,
                                             vectors, 1, lane, 0, 0);
  }
}

// ---------------------------------------------------------------------------
// Host side.

int SmCount(int device) {
  static std::atomic<int> counts[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return 132;
  int sms = counts[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms <= 0)
      sms = 132;
    counts[device].store(sms, std::memory_order_relaxed);  // every racer stores the same value
  }
  return sms;
}

using ResolveKernelFn = void (*)(ResolveArgs);

struct ResolveVariant {
  ResolveKernelFn kernel;
  int threads;
};

// Every instantiated variant, for the shared-memory opt-in.
constexpr ResolveKernelFn kResolveKernels[] = {
    ResolveKernel<kResolveThreadsSmall, 1>, ResolveKernel<kResolveThreadsSmall, 2>,
    ResolveKernel<kResolveThreadsSmall, 4>, ResolveKernel<kResolveThreadsSmall, 8>,
    ResolveKernel<kResolveThreads, 1>,      ResolveKernel<kResolveThreads, 2>,
    ResolveKernel<kResolveThreads, 4>,      ResolveKernel<kResolveThreads, 8>,
    ResolveKernel<kResolveThreads, 16>};

// Small blocks (two per SM) when there are more streams than SMs, so that
// large blocks would queue in a second wave, and B <= kResolveSmallBlockMaxSlots
// (at most 8 items per lane, the register budget of kEarly). Otherwise large
// blocks: with an SM each, 32 warps hide more latency than 16 with twice the
// items per lane.
ResolveVariant ResolveKernelFor(int64_t hot_slots, int64_t streams, int sms) {
  if (streams > sms && hot_slots <= kResolveSmallBlockMaxSlots) {
    constexpr int t = kResolveThreadsSmall;
    const int64_t rounds = (hot_slots + t - 1) / t;
    if (rounds <= 1) return {ResolveKernel<t, 1>, t};
    if (rounds <= 2) return {ResolveKernel<t, 2>, t};
    if (rounds <= 4) return {ResolveKernel<t, 4>, t};
    return {ResolveKernel<t, 8>, t};
  }
  constexpr int t = kResolveThreads;
  const int64_t rounds = (hot_slots + t - 1) / t;
  if (rounds <= 1) return {ResolveKernel<t, 1>, t};
  if (rounds <= 2) return {ResolveKernel<t, 2>, t};
  if (rounds <= 4) return {ResolveKernel<t, 4>, t};
  if (rounds <= 8) return {ResolveKernel<t, 8>, t};
  return {ResolveKernel<t, 16>, t};
}

// Lets every resolve kernel use up to kMaxResolveSharedBytes of dynamic
// shared memory on `device`; host-side setup, done once per device.
cudaError_t OptInSharedMemory(int device) {
  static std::once_flag once[kMaxDevices];
  static cudaError_t result[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::call_once(once[device], [device] {
    cudaError_t err = cudaSuccess;
    for (ResolveKernelFn fn : kResolveKernels) {
      const cudaError_t e = cudaFuncSetAttribute(
          fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxResolveSharedBytes));
      if (err == cudaSuccess) err = e;
    }
    result[device] = err;
  });
  return result[device];
}

bool Aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

int64_t TableCapacity(int64_t top_k) {
  int64_t capacity = 16;
  while (capacity < 2 * top_k) capacity *= 2;
  return capacity;
}

cudaError_t Fail(cudaError_t err, const char* kernel, const char** failed_kernel) {
  if (err != cudaSuccess && failed_kernel != nullptr) *failed_kernel = kernel;
  return err;
}

}  // namespace

int64_t ResolveSharedBytes(int64_t top_k, int64_t hot_slots) {
  return TableCapacity(top_k) * 8 + top_k * 8 + (hot_slots + 31) / 32 * 4;
}

ResolveLaunchPlan ChooseResolvePlan(ResolveLaunchPlan plan, int64_t streams) {
  if (plan != ResolveLaunchPlan::kAuto) return plan;
  return streams < kAutoSplitBelowStreams ? ResolveLaunchPlan::kSplit : ResolveLaunchPlan::kFused;
}

cudaError_t LaunchResolve(const ResolveDims& d, const int32_t* layer, const ResolveBuffers& io,
                          bool fetch, ResolveLaunchPlan plan, cudaStream_t stream,
                          const char** failed_kernel) {
  constexpr const char* kResolveName = "hisparse resolve kernel";
  constexpr const char* kFetchName = "hisparse fetch kernel";
  if (d.top_k < 0 || d.top_k > kMaxResolveTopK || d.hot_slots < d.top_k ||
      d.hot_slots > kMaxResolveHotSlots || d.record_bytes <= 0 || d.record_bytes % 8 != 0 ||
      d.pool_records < 0 || d.pool_records > INT32_MAX || d.streams < 0 ||
      d.streams > INT32_MAX || d.layers < 0)
    return Fail(cudaErrorInvalidValue, kResolveName, failed_kernel);
  if (d.streams == 0) return cudaSuccess;

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  const int64_t shared_bytes = ResolveSharedBytes(d.top_k, d.hot_slots);
  if (shared_bytes > kLargeSharedBytes) {
    err = OptInSharedMemory(device);
    if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  }

  const bool vec16 = d.record_bytes % 16 == 0 && Aligned(io.host_pool, 16) && Aligned(io.hot, 16);
  if (!vec16 && !(Aligned(io.host_pool, 8) && Aligned(io.hot, 8)))
    return Fail(cudaErrorMisalignedAddress, kResolveName, failed_kernel);
  const int vector = vec16 ? 16 : 8;
  const bool split = ChooseResolvePlan(plan, d.streams) == ResolveLaunchPlan::kSplit;

  ResolveArgs a;
  a.host_pool = io.host_pool;
  a.selection = io.selection;
  a.sealed = io.sealed;
  a.layer = layer;
  a.hot = io.hot;
  a.slot_record = io.slot_record;
  a.lru = io.lru;
  a.slots = io.slots;
  a.miss_records = io.miss_records;
  a.miss_slots = io.miss_slots;
  a.misses = io.misses;
  a.invalid = io.invalid;
  a.layers = d.layers;
  a.streams = d.streams;
  a.record_bytes = d.record_bytes;
  a.top_k = static_cast<int32_t>(d.top_k);
  a.hot_slots = static_cast<int32_t>(d.hot_slots);
  a.pool_records = static_cast<int32_t>(d.pool_records);
  const int64_t capacity = TableCapacity(d.top_k);
  a.table_mask = static_cast<uint32_t>(capacity - 1);
  a.table_shift = 32;
  for (int64_t c = capacity; c > 1; c /= 2) --a.table_shift;
  a.copy_vector = vector;
  a.row_batch = RowBatch(d.record_bytes / vector, kFusedCopyUnroll);
  a.fused_fetch = fetch && !split;
  const ResolveVariant variant = ResolveKernelFor(d.hot_slots, d.streams, SmCount(device));
  variant.kernel<<<static_cast<unsigned>(d.streams), variant.threads,
                   static_cast<size_t>(shared_bytes), stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  if (!fetch || !split || d.top_k == 0) return cudaSuccess;

  FetchArgs f;
  f.host_pool = io.host_pool;
  f.layer = layer;
  f.miss_records = io.miss_records;
  f.miss_slots = io.miss_slots;
  f.misses = io.misses;
  f.hot = io.hot;
  f.layers = d.layers;
  f.streams = d.streams;
  f.record_bytes = d.record_bytes;
  f.top_k = static_cast<int32_t>(d.top_k);
  f.hot_slots = static_cast<int32_t>(d.hot_slots);
  f.pool_records = static_cast<int32_t>(d.pool_records);
  f.row_batch = RowBatch(d.record_bytes / vector, kFetchCopyUnroll);
  // Enough blocks in all to keep the link busy, but no more per stream than
  // k misses at one row per warp could use.
  const int64_t wanted = (int64_t{kFetchBlocksPerSm} * SmCount(device) + d.streams - 1) / d.streams;
  const int64_t useful = (d.top_k + kFetchWarps - 1) / kFetchWarps;
  const int64_t chunks = wanted < useful ? wanted : useful;
  if (chunks * d.streams > INT32_MAX) return Fail(cudaErrorInvalidValue, kFetchName, failed_kernel);
  f.chunks = static_cast<int32_t>(chunks);
  const unsigned grid = static_cast<unsigned>(chunks * d.streams);
  if (vec16) {
    FetchKernel<int4><<<grid, kFetchThreads, 0, stream>>>(f);
  } else {
    FetchKernel<uint2><<<grid, kFetchThreads, 0, stream>>>(f);
  }
  return Fail(cudaGetLastError(), kFetchName, failed_kernel);
}

cudaError_t LaunchPoolWrite(const PoolWriteDims& d, const uint8_t* records, const int32_t* start,
                            const int32_t* count, uint8_t* host_pool, cudaStream_t stream,
                            const char** failed_kernel) {
  constexpr const char* kName = "hisparse pool write kernel";
  if (d.record_bytes <= 0 || d.record_bytes % 8 != 0 || d.rows < 0 || d.layers < 0 ||
      d.streams < 0 || d.pool_records < 0)
    return Fail(cudaErrorInvalidValue, kName, failed_kernel);
  const int64_t total = d.layers * d.streams * d.rows;
  if (total == 0) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return Fail(err, kName, failed_kernel);
  const bool vec16 = d.record_bytes % 16 == 0 && Aligned(records, 16) && Aligned(host_pool, 16);
  if (!vec16 && !(Aligned(records, 8) && Aligned(host_pool, 8)))
    return Fail(cudaErrorMisalignedAddress, kName, failed_kernel);
  PoolWriteArgs a;
  a.records = records;
  a.start = start;
  a.count = count;
  a.host_pool = host_pool;
  a.layers = d.layers;
  a.streams = d.streams;
  a.rows = d.rows;
  a.pool_records = d.pool_records;
  a.record_bytes = d.record_bytes;
  const int64_t needed = (total + kFetchWarps - 1) / kFetchWarps;
  const int64_t cap = int64_t{16} * SmCount(device);
  const unsigned grid = static_cast<unsigned>(needed < cap ? needed : cap);
  if (vec16) {
    PoolWriteKernel<int4><<<grid, kFetchThreads, 0, stream>>>(a);
  } else {
    PoolWriteKernel<uint2><<<grid, kFetchThreads, 0, stream>>>(a);
  }
  return Fail(cudaGetLastError(), kName, failed_kernel);
}

}  // namespace hisparse

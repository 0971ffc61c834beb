// RESOLVE and the pool write on CUDA: the contracts of resolve.h and
// pool_write.h, bit-identical to resolve_cpu.cc and pool_write_cpu.cc. See
// resolve_cuda.h for the launch plans.
//
// Resolve kernel: one block per stream, of kResolveThreads (32 warps), or of
// kResolveThreadsSmall (16 warps) when there are more streams than SMs and
// B <= kResolveSmallBlockMaxSlots (a 1024-thread block at 64 registers takes
// a whole SM, so 256 streams on 132 SMs would run in two waves; 512-thread
// blocks let two streams share an SM in one wave instead).
//
// A block is latency-bound: its time is the chain of dependent global round
// trips, shared-memory probe runs and barriers, not bandwidth. The kernel is
// laid out to keep that chain short:
//  - the inserts of the selected ids overlap the second global round trip
//    (slot_record and lru can only be addressed once the layer is read):
//    slot_record is staged into shared memory with cp.async, which holds no
//    registers while it flies;
//  - every lane probes all of its items in lock step, so one item's latency
//    hides the others' (a lane's items used to probe one after the other);
//  - the table is sparse (load <= 1/4 when shared memory allows, else <= 1/2)
//    and lookups read 4 keys per 16-byte load, so a warp's longest probe run
//    is ~2 loads instead of ~14 (linear probing at load 1/2);
//  - the lru side probes the record of lru[i] directly (from the staged
//    slot_record), so the hit and evictable flags come out in lru order
//    without a hit bitmap and the barrier it needed;
//  - the number of misses is known from counts alone, M = distinct ids -
//    hit slots (no record is held twice), so the lru can be rewritten right
//    after the probes, and a stream without misses finishes there (3
//    barriers: the common steady state). Misses take one barrier more, and a
//    second one only when an id that misses appears twice or the block
//    copies its own misses;
//  - block totals and exclusive warp offsets are single __reduce_add_sync
//    over the warp totals, computed by every warp (no scan, no extra barrier);
//  - the malformed-state check (resolve.h) rides on the loads and barriers
//    the block has anyway: in phase 1 each lane marks its lru slots in a
//    bitmap (outside [0, B) or marked twice: malformed); in phase 2 every
//    staged record is range-checked and its slot inserted into a set keyed
//    by the record (one there already: held twice). Any lane that finds a
//    fault sets a shared flag, read after barrier 3, before anything is
//    written. Cost per block: clearing B/8 bytes plus a set of 4B to 8B
//    bytes of shared memory, one shared atomicAnd per lru position, one
//    shared load and one 16-bit atomicCAS per slot (one more load and CAS
//    per collision, the set at load <= 1/2), in a rolled loop of two slots
//    per lane and round (a wider lock step spilled registers in the
//    variants of 8 lru rounds); no extra barrier. The ChecksStateFirst shapes (B >
//    8192 with k > 4096) have no shared memory left for the set: they check
//    in a pass of their own before the table is built, with the set laid
//    over the table's memory, at the price of two more barriers, clearing
//    the table twice and a second read of the lru and slot_record rows.
//
// Shared memory: keys[cap] (-1 = empty) and words[cap] of an open-addressing
// table of the selected ids (cap = power of two, see TableCapacity); then a
// region of max(B, 2k) ints holding the staged slot_record until the probes
// are done, then the miss plan (plan_slot[k], plan_record[k]); then the
// state check's bitmap of slots not yet seen in lru (B bits) and its set of
// held records (uint16 slot ids keyed by the record each slot holds,
// capacity a power of two >= 2B; not for ChecksStateFirst shapes). A word holds
// either 0xffff << 16 | (first position of its id in the selection) or
// slot << 16 | 0xffff for the slot holding the id; both are merged with
// atomicMin, where a slot always wins (slot < 0xffff). Only the keys are
// cleared: the item that inserts an id writes its word. Ids hash by the high
// bits of a Fibonacci product, so ids that share their low bits (strided page
// ids) do not pile up in one probe run. Only membership and min go through
// atomics, so every result is independent of thread timing (and of the table
// layout). Per-item values live in registers: lane l of warp w owns
// the selection positions j = w * 32 * rk + 32 * c + l (c < rk rounds) and
// the lru positions i = w * 32 * rb + 32 * c + l, so ballots plus the warp
// offsets rank items in their global order. Phases, between barriers:
//   0. keys, bitmap and held set <- -1; load the selection, sealed, layer;
//      cp.async slot_record; load lru (variants with many lru rounds per
//      lane load it after the inserts, to bound registers)           [bar 1]
//   1. rule 0; insert each valid id with atomicCAS; the item whose CAS put
//      the key in (one per distinct id) writes the word (its position);
//      count distinct and invalid ids per warp. Mark the lru slots in the
//      bitmap (outside [0, B) or already marked: malformed)           [bar 2]
//   2. later copies of an id: atomicMin(word, their position). Lru side: the
//      record of slot lru[i]; found in the table -> hit, atomicMin(word,
//      slot), else evictable; count evictables per warp. Slot side: each
//      record in [-1, R), and, if >= 0, the first of its value in the held
//      set (else malformed)                                          [bar 3]
//   M. malformed: slots and miss plan -1, misses 0, invalid as counted; done
//      (nothing of the state was written).
//   3. totals; M = distinct - (B - evictables). New lru (rule 4): evictable
//      of rank r goes to r - M (kept) or E - M + r (taken by miss r,
//      plan_slot[r]); a hit after h hits to E + h. slots[j] of hits and
//      padding (rule 6). M = 0: done. Else flag misses (first position, no
//      slot) and count them per warp                                  [bar 4]
//   4. miss of rank m: slot plan_slot[m]; slots, miss_records, miss_slots,
//      slot_record (rules 2, 3, 5)                 [bar 5: only if needed]
//   5. later copies of a missing id read its slot; fused plan: the block's
//      warps copy its misses                                          (rule 5)
// Fetch kernel (split plan): blocks of kFetchThreads, spread over
// (chunks x streams); warp g of a stream takes misses g, g + G, ... .
// Copies move 16 B (8 B when the record or a base pointer does not allow it)
// per lane: ld.global.nc from the pinned pool, st.global.cg into hot. A warp
// keeps several rows in flight (RowBatch: up to 32 x unroll vectors) so the
// host link stays busy; few misses are spread one row per warp instead.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "common.h"
#include "pool_write_cuda.h"
#include "resolve_cuda.h"

namespace hisparse {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kFetchWarps = kFetchThreads / kWarp;
static_assert(kResolveThreads == 1024 && kResolveThreadsSmall % kWarp == 0 &&
                  kResolveThreadsSmall <= kResolveThreads,
              "warp totals are read one per lane of a warp");
// Above this, static plus dynamic shared memory, a kernel must opt in.
constexpr int kLargeSharedBytes = 48 * 1024;
// Static shared memory of a resolve block: four int per warp and a flag.
constexpr int ResolveStaticSharedBytes(int threads) { return (4 * (threads / kWarp) + 1) * 4; }
constexpr int kResolveStaticSharedBytes = ResolveStaticSharedBytes(kResolveThreads);
constexpr int kMaxDevices = 64;

// Vectors in flight per lane in one copy batch: fused copies run inside the
// resolve kernel (64 registers per thread), the split fetch kernel has room.
constexpr int kFusedCopyUnroll = 4;
constexpr int kFetchCopyUnroll = 8;

// Items of a lane that probe the table in lock step: enough to overlap the
// latencies, few enough to keep their probe state in registers.
constexpr int kProbeBatch = 4;
// Slots of a lane that go into the held-record set in lock step: the state
// check runs where the probes' registers are still live, and more than 2
// spill in the variants of 8 lru rounds.
constexpr int kHeldBatch = 2;

// A bigger table (load <= 1/4) is used while the table and the region stay
// within this, so that two 512-thread blocks still fit on one SM (with the
// state check's memory on top; see the static_assert in the host part).
constexpr int64_t kLowLoadSharedBytes = 96 * 1024;

// Empty entry of the held-record set (slot ids are < kMaxResolveHotSlots).
constexpr unsigned short kNoHeldSlot = 0xffffu;
static_assert(kMaxResolveHotSlots <= kNoHeldSlot, "slot ids fit 16 bits below kNoHeldSlot");

// ---------------------------------------------------------------------------
// Shared-memory layout of a resolve block, shared by the launcher and the
// kernel: [keys, words: table capacity each][region][slot bitmap][held set].

__host__ __device__ constexpr int64_t RoundUp4(int64_t n) { return (n + 3) / 4 * 4; }

// Ints of the region (staged slot_record, then the miss plan): max(B, 2k),
// kept a multiple of 4 so that what follows is 16-byte aligned.
__host__ __device__ constexpr int64_t RegionInts(int64_t top_k, int64_t hot_slots) {
  return RoundUp4(hot_slots > 2 * top_k ? hot_slots : 2 * top_k);
}

// Ints of the bitmap of slots not yet seen in lru (B bits).
__host__ __device__ constexpr int64_t SlotBitmapInts(int64_t hot_slots) {
  return RoundUp4((hot_slots + 31) / 32);
}

// B > 8192 with k > 4096, exactly the shapes of the <1024, 16, 8> variant:
// the table (load <= 1/2 of 2k ids) and the staged records take 192 KiB, so
// the held-record set gets no memory of its own; these shapes check the state
// in a pass before the table is built, with the set laid over the table's
// memory (2 x capacity >= 4k > B ints).
__host__ __device__ constexpr bool ChecksStateFirst(int64_t top_k, int64_t hot_slots) {
  return hot_slots > 8 * kResolveThreads && top_k > 4 * kResolveThreads;
}

// Capacity of the held-record set: a power of two >= 2B (load <= 1/2, so
// every insert ends), or 0 for ChecksStateFirst shapes.
__host__ __device__ constexpr int64_t HeldCapacity(int64_t top_k, int64_t hot_slots) {
  if (ChecksStateFirst(top_k, hot_slots)) return 0;
  int64_t capacity = 16;
  while (capacity < 2 * hot_slots) capacity *= 2;
  return capacity;
}

// Table words: 16-bit slot (high) and first position (low) fields.
constexpr uint32_t kNoSlot = 0xffffu;
static_assert(kMaxResolveHotSlots < kNoSlot && kMaxResolveTopK < kNoSlot,
              "slots and positions fit 16 bits below the kNoSlot sentinel");

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
  int32_t* malformed;        // [S]
  int64_t layers, streams, record_bytes;
  int32_t top_k, hot_slots, pool_records;
  uint32_t table_mask;   // table capacity - 1
  uint32_t table_shift;  // 32 - log2(table capacity)
  uint32_t held_mask;    // held-record set capacity - 1 (0: ChecksStateFirst shape)
  uint32_t held_shift;   // 32 - log2(held-record set capacity)
  int32_t check_offset;  // bytes from the start of shared memory to the slot bitmap
  int32_t check_vectors; // int4 of the slot bitmap and the held set (cleared together)
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

// Word of an id whose first position in the selection is j, and of an id
// held by `slot` (slot < 0: by none). atomicMin of the two keeps the slot.
__device__ __forceinline__ uint32_t PositionWord(int j) {
  return (kNoSlot << 16) | static_cast<uint32_t>(j);
}
__device__ __forceinline__ uint32_t SlotWord(int slot) {
  return slot >= 0 ? (static_cast<uint32_t>(slot) << 16) | 0xffffu : 0xffffffffu;
}
// The slot a word names, or -1.
__device__ __forceinline__ int WordSlot(uint32_t word) {
  const uint32_t slot = word >> 16;
  return slot == kNoSlot ? -1 : static_cast<int>(slot);
}
__device__ __forceinline__ int WordPosition(uint32_t word) {
  return static_cast<int>(word & 0xffffu);
}

// Inserts the ids of the items in `todo` (bit c: item c) by linear probing
// with atomicCAS, kProbeBatch items of the lane in lock step so that their
// CAS latencies overlap. entry[c] = index of the id's key. Returns the items
// whose CAS put the key in: exactly one item per distinct id. Keys are only
// touched by atomics during the inserts.
template <int N>
__device__ __forceinline__ unsigned InsertIds(int* keys, uint32_t mask, uint32_t shift,
                                              const int (&id)[N], unsigned todo,
                                              int (&entry)[N]) {
  constexpr int kBatch = N < kProbeBatch ? N : kProbeBatch;
  static_assert(N % kBatch == 0, "whole batches");
  unsigned won = 0;
#pragma unroll
  for (int c0 = 0; c0 < N; c0 += kBatch) {
    unsigned left = (todo >> c0) & ((1u << kBatch) - 1u);
    uint32_t at[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) at[u] = HashId(id[c0 + u], shift);
    while (left != 0) {
      int prev[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if ((left >> u) & 1u) prev[u] = atomicCAS(&keys[at[u]], -1, id[c0 + u]);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (!((left >> u) & 1u)) continue;
        if (prev[u] == -1 || prev[u] == id[c0 + u]) {
          entry[c0 + u] = static_cast<int>(at[u]);
          if (prev[u] == -1) won |= 1u << (c0 + u);
          left &= ~(1u << u);
        } else {
          at[u] = (at[u] + 1) & mask;
        }
      }
    }
  }
  return won;
}

// Bit q set where key q of the group equals v.
__device__ __forceinline__ unsigned GroupEquals(int4 g, int v) {
  return unsigned{g.x == v} | unsigned{g.y == v} << 1 | unsigned{g.z == v} << 2 |
         unsigned{g.w == v} << 3;
}

// Looks up the records of the items in `todo` (bit u: item u) in the
// finished table (keys are read-only after the inserts). Each step reads the
// aligned group of 4 keys holding the probe position with one 16-byte load
// and scans it from there: linear probing never leaves an empty key between
// an id's hash and the id. entry[u] = index of the record's key; returns the
// items found.
template <int N>
__device__ __forceinline__ unsigned FindRecords(const int* keys, uint32_t mask, uint32_t shift,
                                                const int (&rec)[N], unsigned todo,
                                                int (&entry)[N]) {
  uint32_t at[N];
#pragma unroll
  for (int u = 0; u < N; ++u) at[u] = HashId(rec[u], shift);
  unsigned found = 0;
  while (todo != 0) {
    int4 group[N];
#pragma unroll
    for (int u = 0; u < N; ++u)
      if ((todo >> u) & 1u) group[u] = *reinterpret_cast<const int4*>(keys + (at[u] & ~3u));
#pragma unroll
    for (int u = 0; u < N; ++u) {
      if (!((todo >> u) & 1u)) continue;
      const unsigned from = 0xfu << (at[u] & 3u);  // the probe position and after
      const unsigned match = GroupEquals(group[u], rec[u]) & from;
      if (match != 0) {
        entry[u] = static_cast<int>((at[u] & ~3u) + __ffs(match) - 1);
        found |= 1u << u;
        todo &= ~(1u << u);
      } else if ((GroupEquals(group[u], -1) & from) != 0) {
        todo &= ~(1u << u);
      } else {
        at[u] = ((at[u] | 3u) + 1) & mask;
      }
    }
  }
  return found;
}

// Marks `slot` seen in the bitmap of slots not yet seen in lru (all ones at
// first). False when the slot lies outside [0, B) or was seen before: the lru
// row is then not a permutation of [0, B).
__device__ __forceinline__ bool MarkSlotSeen(uint32_t* unseen, int slot, int hot_slots) {
  if (slot < 0 || slot >= hot_slots) return false;
  const uint32_t bit = 1u << (slot & 31);
  return (atomicAnd(&unseen[slot >> 5], ~bit) & bit) != 0;
}

// Inserts the slots of the items in `todo` (bit u: item u) into the set of
// held records: 16-bit slot ids keyed by the record the slot holds
// (records[slot], the staged slot_record), kNoHeldSlot = empty, linear
// probing with atomicCAS, the items of a lane in lock step. Returns the items
// whose record a slot inserted before them holds too. Each slot is inserted
// once and the set has room for 2B, so it stays at load <= 1/2 and every
// probe run ends.
template <int N>
__device__ __forceinline__ unsigned InsertHeld(unsigned short* held, uint32_t mask,
                                               uint32_t shift, const int* records,
                                               const int (&rec)[N], const int (&slot)[N],
                                               unsigned todo) {
  uint32_t at[N];
#pragma unroll
  for (int u = 0; u < N; ++u) at[u] = HashId(rec[u], shift);
  unsigned repeated = 0;
  while (todo != 0) {
    unsigned short prev[N];
#pragma unroll
    for (int u = 0; u < N; ++u)
      if ((todo >> u) & 1u)
        prev[u] = atomicCAS(&held[at[u]], kNoHeldSlot, static_cast<unsigned short>(slot[u]));
#pragma unroll
    for (int u = 0; u < N; ++u) {
      if (!((todo >> u) & 1u)) continue;
      if (prev[u] == kNoHeldSlot) {
        todo &= ~(1u << u);
      } else if (records[prev[u]] == rec[u]) {
        repeated |= 1u << u;
        todo &= ~(1u << u);
      } else {
        at[u] = (at[u] + 1) & mask;
      }
    }
  }
  return repeated;
}

// Starts copying src[0, n) (global) into dst (shared) with cp.async, which
// holds no register while the loads fly; WaitStaged() before the barrier
// that publishes dst. 16-byte copies when n and both addresses allow them.
__device__ __forceinline__ void StageAsync(int* dst, const int* src, int n, int tid,
                                           int threads) {
  const bool wide = n % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (wide) {
    for (int q = tid; q < n / 4; q += threads) __pipeline_memcpy_async(dst + 4 * q, src + 4 * q, 16);
  } else {
    for (int b = tid; b < n; b += threads) __pipeline_memcpy_async(dst + b, src + b, 4);
  }
  __pipeline_commit();
}
__device__ __forceinline__ void WaitStaged() { __pipeline_wait_prior(0); }

// Sum of v over the warp, and over the lanes below `below`.
__device__ __forceinline__ int WarpTotal(int v) { return __reduce_add_sync(kFullMask, v); }
__device__ __forceinline__ int WarpTotalBelow(int v, int lane, int below) {
  return __reduce_add_sync(kFullMask, lane < below ? v : 0);
}

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
// read through `plan_at(m) -> int2 {slot, record}`; an entry outside the hot
// buffer or the pool is skipped (none reaches here: a malformed state
// resolves nothing, so this only keeps any plan inside the stream's rows).
template <typename V, int kUnroll, typename PlanAt>
__device__ __forceinline__ void CopyMisses(const uint8_t* src_base, uint8_t* dst_base,
                                           int64_t record_bytes, int hot_slots, int pool_records,
                                           int max_batch, int misses, int warp, int warps,
                                           int lane, PlanAt plan_at) {
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
      if (p.x >= 0 && p.x < hot_slots && p.y >= 0 && p.y < pool_records) {
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
// only a malformed lru can produce, and the state check then rejects).
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

// A stream that resolves nothing (layer outside [0, L): limit 0, malformed
// 0; malformed state, checked apart: its limit, malformed 1): rule 0 alone,
// every output -1, state untouched. One barrier; every thread calls it.
template <int kThreads>
__device__ void ResolveNothing(const ResolveArgs& a, int stream, int limit, int malformed,
                               int* warp_counts) {
  const int k = a.top_k;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int32_t* sel = a.selection + int64_t{stream} * k;
  const int64_t out = int64_t{stream} * k;
  int invalid = 0;
  for (int j = tid; j < k; j += kThreads) {
    const int id = sel[j];
    invalid += id != -1 && (id < 0 || id >= limit);
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
      a.malformed[stream] = malformed;
    }
  }
}

// The state check of the ChecksStateFirst shapes, in a pass of its own before
// the table is built: lru slots go into the bitmap, the records of the slots
// into a set of int keys laid over the table's keys and words (`held`, 2 x
// table capacity >= 2B entries). Returns in every thread whether the stream's
// state is malformed (two barriers).
template <int kThreads>
__device__ bool StateMalformedApart(const ResolveArgs& a, const int32_t* slot_record,
                                    const int32_t* lru, int* held, uint32_t* unseen) {
  const int tid = threadIdx.x, B = a.hot_slots;
  const uint32_t held_capacity = 2 * (a.table_mask + 1);
  int4* clear = reinterpret_cast<int4*>(held);
  for (uint32_t q = tid; q < held_capacity / 4; q += kThreads) clear[q] = make_int4(-1, -1, -1, -1);
  clear = reinterpret_cast<int4*>(unseen);
  for (int q = tid; q < SlotBitmapInts(B) / 4; q += kThreads) clear[q] = make_int4(-1, -1, -1, -1);
  __syncthreads();
  bool bad = false;
#pragma unroll 1
  for (int i0 = tid; i0 < B; i0 += kHeldBatch * kThreads) {
    int rec[kHeldBatch], entry[kHeldBatch];
    unsigned todo = 0;
#pragma unroll
    for (int u = 0; u < kHeldBatch; ++u) {
      const int i = i0 + u * kThreads;  // an lru position, and a slot
      rec[u] = -1;
      if (i >= B) continue;
      bad |= !MarkSlotSeen(unseen, lru[i], B);
      const int r = slot_record[i];
      bad |= r < -1 || r >= a.pool_records;
      if (r >= 0 && r < a.pool_records) {
        rec[u] = r;
        todo |= 1u << u;
      }
    }
    const unsigned won = InsertIds(held, held_capacity - 1, a.table_shift - 1, rec, todo, entry);
    bad |= (todo & ~won) != 0;  // another slot put the record in first
  }
  return __syncthreads_or(bad);
}

// ---------------------------------------------------------------------------
// Resolve kernel. kThreads: threads of the block; kRounds: most lru items per
// lane (B <= kThreads * kRounds); kSelRounds: most selection items per lane
// (k <= kThreads * kSelRounds; k <= B and k <= 8192 = 1024 x 8, so at most
// min(kRounds, 8)). Sizing both to the shape keeps the per-item registers of
// the common shapes (k = B/2 .. B/4) within 64 without spilling. See the file
// comment for the phases.

template <int kThreads, int kRounds, int kSelRounds>
__global__ void __launch_bounds__(kThreads, kResolveThreads / kThreads)
    ResolveKernel(const ResolveArgs a) {
  constexpr int kWarps = kThreads / kWarp;
  constexpr int kLruBatch = kRounds < kProbeBatch ? kRounds : kProbeBatch;
  static_assert(kThreads == kResolveThreads || kRounds <= 8,
                "smaller blocks only serve B <= 8 x kThreads (so k <= 8 x kThreads)");
  static_assert(kSelRounds <= kRounds && kSelRounds <= 8, "k <= B and k <= 8192");
  static_assert(kRounds <= 32 && kRounds % kLruBatch == 0, "item bits fit one word");
  // The lane's lru slot ids: up to 8 are loaded before the inserts, so that
  // the loads fly while the inserts run, and the largest variant loads its
  // 16 after them; from 8 on they are kept two per register. Both keep the
  // registers within 64.
  constexpr bool kEarlyLru = kRounds <= 8;
  constexpr bool kPackedLru = kRounds >= 8;
  // The variant of exactly the ChecksStateFirst shapes (B > 8 x 1024 takes 16
  // lru rounds of a 1024-thread block, k > 4 x 1024 takes 8 selection rounds).
  constexpr bool kCheckFirst = kRounds == 16 && kSelRounds == 8;
  static_assert(!kCheckFirst || kThreads == kResolveThreads, "ChecksStateFirst shapes are large");
  extern __shared__ int4 shared[];
  __shared__ int warp_distinct[kWarps];
  __shared__ int warp_invalid[kWarps];
  __shared__ int warp_evictable[kWarps];
  __shared__ int warp_misses[kWarps];
  __shared__ int state_malformed;  // 0, or 1 once any lane finds the state malformed

  const int stream = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const unsigned lanes_below = LanesBelow(lane);
  const int k = a.top_k, B = a.hot_slots;
  const uint32_t mask = a.table_mask, capacity = a.table_mask + 1;
  int* keys = reinterpret_cast<int*>(shared);                      // [capacity]
  uint32_t* words = reinterpret_cast<uint32_t*>(keys + capacity);  // [capacity]
  int* region = reinterpret_cast<int*>(words + capacity);          // [max(B, 2k)]
  int* staged_record = region;    // [B] slot_record, phases 0-2
  int* plan_slot = region;        // [k] slot taken by miss m, phases 3-5
  int* plan_record = region + k;  // [k] record of miss m, phases 4-5
  // Read from the kernel arguments where used, so that no register holds them.
  auto unseen = [&a] {  // [B bits] slots not yet seen in lru
    return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(shared) + a.check_offset);
  };
  auto held = [&a] {  // [held_mask + 1] the held-record set
    return reinterpret_cast<unsigned short*>(reinterpret_cast<char*>(shared) + a.check_offset +
                                             SlotBitmapInts(a.hot_slots) * 4);
  };

  // Lane-owned positions (see the file comment).
  const int sel_rounds = (k + kThreads - 1) / kThreads;
  const int lru_rounds = (B + kThreads - 1) / kThreads;
  const int j0 = warp * kWarp * sel_rounds + lane;
  const int i0 = warp * kWarp * lru_rounds + lane;

  if constexpr (kCheckFirst) {
    const int layer = *a.layer;
    if (layer >= 0 && layer < a.layers) {  // else phase 0 resolves nothing
      const int64_t ls = int64_t{layer} * a.streams + stream;
      if (StateMalformedApart<kThreads>(a, a.slot_record + ls * B, a.lru + ls * B, keys,
                                        unseen())) {
        const int limit = max(0, min(a.sealed[stream], a.pool_records));
        ResolveNothing<kThreads>(a, stream, limit, 1, warp_invalid);
        return;
      }
    }
  }

  // 0. Loads that do not depend on the layer, with the layer; the key clear
  // overlaps them.
  const int32_t* sel = a.selection + int64_t{stream} * k;
  int id[kSelRounds];
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    id[c] = (c < sel_rounds && j < k) ? sel[j] : -1;
  }
  const int sealed = a.sealed[stream];
  const int layer = *a.layer;
  for (uint32_t q = tid; q < capacity / 4; q += kThreads) shared[q] = make_int4(-1, -1, -1, -1);
  if (tid == 0) state_malformed = 0;
  if constexpr (!kCheckFirst) {
    int4* check = reinterpret_cast<int4*>(unseen());  // the bitmap, then the held set
    for (int q = tid; q < a.check_vectors; q += kThreads) check[q] = make_int4(-1, -1, -1, -1);
  }
  if (layer < 0 || layer >= a.layers) {
    ResolveNothing<kThreads>(a, stream, 0, 0, warp_invalid);  // limit 0: every id invalid
    return;
  }
  const int64_t ls = int64_t{layer} * a.streams + stream;
  int32_t* slot_record = a.slot_record + ls * B;
  int32_t* lru = a.lru + ls * B;
  const int limit = max(0, min(sealed, a.pool_records));
  StageAsync(staged_record, slot_record, B, tid, kThreads);
  auto lru_at = [&](int c) {  // lru[i] of the lane's position c, -1 past B
    const int i = i0 + c * kWarp;
    return (c < lru_rounds && i < B) ? lru[i] : -1;
  };
  int early_lru[kEarlyLru ? kRounds : 1];
  if constexpr (kEarlyLru) {
#pragma unroll
    for (int c = 0; c < kRounds; ++c) early_lru[c] = lru_at(c);
  }
  __syncthreads();  // 1: keys cleared

  // 1. Rule 0, then the distinct valid ids (rule 1).
  unsigned valid = 0, bad = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    if (id[c] == -1) continue;
    if (id[c] < 0 || id[c] >= limit) {
      bad |= 1u << c;
    } else {
      valid |= 1u << c;
    }
  }
  int entry[kSelRounds];
  const unsigned won = InsertIds(keys, mask, a.table_shift, id, valid, entry);
  int distinct_in_warp = 0, invalid_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    // Only the winner touches the word before the barrier.
    if ((won >> c) & 1u) words[entry[c]] = PositionWord(j0 + c * kWarp);
    distinct_in_warp += __popc(__ballot_sync(kFullMask, (won >> c) & 1u));
    invalid_in_warp += __popc(__ballot_sync(kFullMask, (bad >> c) & 1u));
  }
  if (lane == 0) {
    warp_distinct[warp] = distinct_in_warp;
    warp_invalid[warp] = invalid_in_warp;
  }
  SlotList<kRounds, kPackedLru> order;
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    if constexpr (kEarlyLru) {
      order.Set(c, early_lru[c]);
    } else {
      order.Set(c, lru_at(c));
    }
  }
  if constexpr (!kCheckFirst) {  // lru: every slot in [0, B), none twice
#pragma unroll
    for (int c = 0; c < kRounds; ++c) {
      const int i = i0 + c * kWarp;
      if (c < lru_rounds && i < B && !MarkSlotSeen(unseen(), order.Get(c), B))
        atomicOr(&state_malformed, 1);  // an atomic: lanes may race to report
    }
  }
  WaitStaged();
  __syncthreads();  // 2: table complete, slot_record staged

  // 2. First positions (rule 2 orders misses by them), and the hit slots.
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    if (((valid & ~won) >> c) & 1u) atomicMin(&words[entry[c]], PositionWord(j0 + c * kWarp));
  }
  unsigned evictable = 0;
  int evictables_in_warp = 0;
#pragma unroll
  for (int c0 = 0; c0 < kRounds; c0 += kLruBatch) {
    int rec[kLruBatch], at[kLruBatch];
    unsigned listed = 0, probe = 0;
#pragma unroll
    for (int u = 0; u < kLruBatch; ++u) {
      const int slot = order.Get(c0 + u);
      rec[u] = -1;
      // Out-of-range slots only come from a malformed lru (found out at bar 3).
      if (slot >= 0 && slot < B) {
        listed |= 1u << u;
        rec[u] = staged_record[slot];
      }
      if (rec[u] >= 0 && rec[u] < limit) probe |= 1u << u;
    }
    const unsigned hit = FindRecords(keys, mask, a.table_shift, rec, probe, at);
#pragma unroll
    for (int u = 0; u < kLruBatch; ++u) {
      // The smallest slot wins if a malformed state holds a record twice.
      if ((hit >> u) & 1u) atomicMin(&words[at[u]], SlotWord(order.Get(c0 + u)));
    }
    evictable |= (listed & ~hit) << c0;
  }
  if constexpr (!kCheckFirst) {
    // slot_record: every record in [-1, R), none >= 0 held by two slots. A
    // rolled loop over the slots, apart from the probes, so that it holds no
    // more registers than one batch of inserts.
#pragma unroll 1
    for (int b0 = tid; b0 < B; b0 += kHeldBatch * kThreads) {
      int rec[kHeldBatch], slot[kHeldBatch];
      unsigned todo = 0, wrong = 0;
#pragma unroll
      for (int u = 0; u < kHeldBatch; ++u) {
        slot[u] = b0 + u * kThreads;
        rec[u] = slot[u] < B ? staged_record[slot[u]] : -1;
        wrong |= rec[u] < -1 || rec[u] >= a.pool_records;
        if (rec[u] >= 0 && rec[u] < a.pool_records) todo |= 1u << u;
      }
      wrong |= InsertHeld(held(), a.held_mask, a.held_shift, staged_record, rec, slot, todo);
      if (wrong) atomicOr(&state_malformed, 1);
    }
  }
#pragma unroll
  for (int c = 0; c < kRounds; ++c)
    evictables_in_warp += __popc(__ballot_sync(kFullMask, (evictable >> c) & 1u));
  if (lane == 0) warp_evictable[warp] = evictables_in_warp;
  __syncthreads();  // 3: words final (first position or hit slot), the state's verdict
  const bool malformed = !kCheckFirst && state_malformed != 0;  // else checked apart

  // 3. Totals. In a well-formed state every lru position is a hit or an
  // evictable slot and distinct slots hold distinct records, so the hit
  // slots are the hit ids and M = distinct - hits. Only a well-formed state
  // gets past the verdict; the clamp keeps every index below in bounds
  // whatever the counts.
  const bool owner = lane < kWarps;
  const int lane_distinct = owner ? warp_distinct[lane] : 0;
  const int lane_invalid = owner ? warp_invalid[lane] : 0;
  const int lane_evictable = owner ? warp_evictable[lane] : 0;
  const int distinct = WarpTotal(lane_distinct);
  const int total_invalid = WarpTotal(lane_invalid);
  const int E = WarpTotal(lane_evictable);
  const int M = max(0, min(distinct - (B - E), E));
  if (malformed) {  // resolves nothing; nothing of the state was written
    const int64_t out = int64_t{stream} * k;
    for (int j = tid; j < k; j += kThreads) {
      a.slots[out + j] = -1;
      a.miss_records[out + j] = -1;
      a.miss_slots[out + j] = -1;
    }
    if (tid == 0) {
      a.misses[stream] = 0;
      a.invalid[stream] = total_invalid;
      a.malformed[stream] = 1;
    }
    return;
  }

  // New lru (rule 4) and the slot each miss takes (rule 3).
  int evict_rank = WarpTotalBelow(lane_evictable, lane, warp);
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const bool is_evictable = (evictable >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, is_evictable);
    const int i = i0 + c * kWarp;
    if (c < lru_rounds && i < B) {
      const int r = evict_rank + __popc(bits & lanes_below);  // evictables before i
      const int slot = order.Get(c);
      int position;
      if (is_evictable) {
        position = r >= M ? r - M : E - M + r;
        if (r < M) plan_slot[r] = slot;
      } else {
        position = E + (i - r);
      }
      // Always in [0, B) in a well-formed state; the guard is the last line
      // between any count and a write outside the row.
      if (position >= 0 && position < B) lru[position] = slot;
    }
    evict_rank += __popc(bits);
  }

  // slots[j] of hits and padding (rule 6); flag the misses.
  const int64_t out = int64_t{stream} * k;
  uint32_t word[kSelRounds];
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c)
    if ((valid >> c) & 1u) word[c] = words[entry[c]];
  unsigned miss = 0, repeat_miss = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    if (c >= sel_rounds || j >= k) continue;
    int slot = -1;
    if ((valid >> c) & 1u) {
      slot = WordSlot(word[c]);
      if (slot < 0 && M > 0) {
        if (WordPosition(word[c]) == j) {
          miss |= 1u << c;
        } else {
          repeat_miss |= 1u << c;
        }
        continue;  // written in phase 4 or 5
      }
    }
    a.slots[out + j] = slot;  // -1 for padding and invalid ids
  }
  if (tid == 0) {
    a.misses[stream] = M;
    a.invalid[stream] = total_invalid;
    a.malformed[stream] = 0;
  }
  for (int m = M + tid; m < k; m += kThreads) {
    a.miss_records[out + m] = -1;
    a.miss_slots[out + m] = -1;
  }
  if (M == 0) return;  // the steady state: every selected id was resident

  int misses_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c)
    misses_in_warp += __popc(__ballot_sync(kFullMask, (miss >> c) & 1u));
  if (lane == 0) warp_misses[warp] = misses_in_warp;
  const bool repeats = __syncthreads_or(repeat_miss != 0);  // 4: plan_slot, miss counts

  // 4. Miss of rank m (first-appearance order, rule 2) takes plan_slot[m].
  int miss_rank = WarpTotalBelow(owner ? warp_misses[lane] : 0, lane, warp);
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const bool is_miss = (miss >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, is_miss);
    if (is_miss) {
      const int m = miss_rank + __popc(bits & lanes_below);  // < k
      const int slot = m < M ? plan_slot[m] : -1;           // m < M: the state is well formed
      const int record = keys[entry[c]];  // the id: not kept in registers past phase 1
      a.slots[out + j0 + c * kWarp] = slot;
      a.miss_records[out + m] = record;
      a.miss_slots[out + m] = slot;
      if (m < M) plan_record[m] = record;
      if (slot >= 0 && slot < B) slot_record[slot] = record;
      if (repeats) words[entry[c]] = SlotWord(slot);
    }
    miss_rank += __popc(bits);
  }
  if (!repeats && !a.fused_fetch) return;
  __syncthreads();  // 5: slots of missing ids, miss plan

  // 5. Later copies of a missing id, and the fused plan's copy (rule 5).
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c)
    if ((repeat_miss >> c) & 1u) a.slots[out + j0 + c * kWarp] = WordSlot(words[entry[c]]);
  if (a.fused_fetch) {
    const int64_t W = a.record_bytes;
    const uint8_t* src = a.host_pool + ls * a.pool_records * W;
    uint8_t* dst = a.hot + ls * B * W;
    auto plan_at = [plan_slot, plan_record](int m) {
      return make_int2(plan_slot[m], plan_record[m]);
    };
    if (a.copy_vector == 16) {
      CopyMisses<int4, kFusedCopyUnroll>(src, dst, W, B, a.pool_records, a.row_batch, M, warp,
                                         kWarps, lane, plan_at);
    } else {
      CopyMisses<uint2, kFusedCopyUnroll>(src, dst, W, B, a.pool_records, a.row_batch, M, warp,
                                          kWarps, lane, plan_at);
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
                                  W, a.hot_slots, a.pool_records, a.row_batch, misses,
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

// Every instantiated variant, for the shared-memory opt-in:
// k{Small,Large}Kernels[r][s] has 2^r lru and 2^s selection items per lane
// (s clamped to r and to 3: k <= B, k <= 8192).
template <int kThreads, int kRounds>
constexpr std::array<ResolveKernelFn, 4> SelectionVariants() {
  return {ResolveKernel<kThreads, kRounds, 1>,
          ResolveKernel<kThreads, kRounds, (kRounds < 2 ? kRounds : 2)>,
          ResolveKernel<kThreads, kRounds, (kRounds < 4 ? kRounds : 4)>,
          ResolveKernel<kThreads, kRounds, (kRounds < 8 ? kRounds : 8)>};
}
constexpr std::array<ResolveKernelFn, 4> kSmallKernels[] = {
    SelectionVariants<kResolveThreadsSmall, 1>(), SelectionVariants<kResolveThreadsSmall, 2>(),
    SelectionVariants<kResolveThreadsSmall, 4>(), SelectionVariants<kResolveThreadsSmall, 8>()};
constexpr std::array<ResolveKernelFn, 4> kLargeKernels[] = {
    SelectionVariants<kResolveThreads, 1>(), SelectionVariants<kResolveThreads, 2>(),
    SelectionVariants<kResolveThreads, 4>(), SelectionVariants<kResolveThreads, 8>(),
    SelectionVariants<kResolveThreads, 16>()};

// Index of the smallest power of two >= n (n >= 1).
int CeilLog2(int64_t n) {
  int r = 0;
  while ((int64_t{1} << r) < n) ++r;
  return r;
}

// Small blocks (two per SM) when there are more streams than SMs, so that
// large blocks would queue in a second wave, and B <= kResolveSmallBlockMaxSlots
// (at most 8 lru items per lane). Otherwise large blocks: with an SM each, 32
// warps hide more latency than 16 with twice the items per lane.
ResolveVariant ResolveKernelFor(int64_t top_k, int64_t hot_slots, int64_t streams, int sms) {
  const bool small = streams > sms && hot_slots <= kResolveSmallBlockMaxSlots;
  const int threads = small ? kResolveThreadsSmall : kResolveThreads;
  const int r = CeilLog2((hot_slots + threads - 1) / threads);
  const int s = CeilLog2((top_k + threads - 1) / threads);
  const int sel = s < 3 ? s : 3;
  return {small ? kSmallKernels[r][sel] : kLargeKernels[r][sel], threads};
}

// Lets every resolve kernel use up to kMaxResolveSharedBytes of dynamic
// shared memory on `device`; host-side setup, done once per device.
cudaError_t OptInSharedMemory(int device) {
  static std::once_flag once[kMaxDevices];
  static cudaError_t result[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::call_once(once[device], [device] {
    cudaError_t err = cudaSuccess;
    auto opt_in = [&err](const auto& table) {
      for (const auto& row : table) {
        for (ResolveKernelFn fn : row) {
          const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(kMaxResolveSharedBytes));
          if (err == cudaSuccess) err = e;
        }
      }
    };
    opt_in(kSmallKernels);
    opt_in(kLargeKernels);
    result[device] = err;
  });
  return result[device];
}

// Bytes of a table of `capacity` entries (keys and words) and of the region:
// what decides the table's load (TableCapacity).
constexpr int64_t TableAndRegionBytes(int64_t capacity, int64_t top_k, int64_t hot_slots) {
  return capacity * 8 + (hot_slots > 2 * top_k ? hot_slots : 2 * top_k) * 4;
}

// Table capacity for k selected ids: a power of two >= 4k (load <= 1/4) while
// the table and the region stay within kLowLoadSharedBytes, else >= 2k (load
// <= 1/2). At load 1/4 a warp's longest probe run (32 lanes x 4 items) is
// about 2 group loads and its longest insert run about 3 CAS, against about 4
// and 7 at 1/2 (simulated with random ids).
constexpr int64_t TableCapacity(int64_t top_k, int64_t hot_slots) {
  int64_t capacity = 16;
  while (capacity < 2 * top_k) capacity *= 2;
  if (TableAndRegionBytes(2 * capacity, top_k, hot_slots) <= kLowLoadSharedBytes) capacity *= 2;
  return capacity;
}

// Dynamic shared memory of a resolve block for (k, B): the layout above.
constexpr int64_t SharedBytes(int64_t top_k, int64_t hot_slots) {
  return TableCapacity(top_k, hot_slots) * 8 + RegionInts(top_k, hot_slots) * 4 +
         SlotBitmapInts(hot_slots) * 4 + HeldCapacity(top_k, hot_slots) * 2;
}

// The most any shape with B <= max_slots takes. For one k the bytes grow with
// B but for two drops (the table stops being doubled, ChecksStateFirst starts
// at B = 8193), so the largest are at B = max_slots, at B = 8192, or where the
// table is still doubled (bounded by `doubled`, below).
constexpr int64_t MostSharedBytes(int64_t max_slots) {
  const int64_t doubled = kLowLoadSharedBytes + 12 + SlotBitmapInts(max_slots) * 4 +
                          HeldCapacity(0, max_slots) * 2;
  int64_t most = doubled;
  const int64_t max_k = max_slots < kMaxResolveTopK ? max_slots : kMaxResolveTopK;
  for (int64_t k = 0; k <= max_k; ++k) {
    for (int64_t b : {int64_t{8192}, max_slots}) {
      if (b < k || b > max_slots || b < 1) continue;
      const int64_t bytes = SharedBytes(k, b);
      if (bytes > most) most = bytes;
    }
  }
  return most;
}
static_assert(MostSharedBytes(kMaxResolveHotSlots) == kMaxResolveSharedBytes &&
                  kMaxResolveSharedBytes + kResolveStaticSharedBytes <= 227 * 1024,
              "kMaxResolveSharedBytes bounds every shape and fits an sm_90 block");
// Two small blocks per SM (228 KiB each, 1 KiB reserved per block, allocated
// in 128-byte units), the point of kResolveThreadsSmall.
static_assert(2 * ((MostSharedBytes(kResolveSmallBlockMaxSlots) +
                    ResolveStaticSharedBytes(kResolveThreadsSmall) + 127) /
                       128 * 128 +
                   1024) <=
                  228 * 1024,
              "two small resolve blocks fit one SM");
// The set of a ChecksStateFirst shape, laid over the table, has room for 2B.
static_assert(2 * TableCapacity(4 * kResolveThreads + 1, kMaxResolveHotSlots) >=
                  2 * kMaxResolveHotSlots,
              "the table's memory holds the held-record set at load <= 1/2");
// ChecksStateFirst names exactly the shapes ResolveKernelFor sends to the
// <1024, 16, 8> variant (16 lru rounds: B > 8 x 1024; 8 selection rounds:
// k > 4 x 1024), whose kernel checks the state apart.
static_assert(!ChecksStateFirst(4 * kResolveThreads, kMaxResolveHotSlots) &&
                  !ChecksStateFirst(kMaxResolveTopK, 8 * kResolveThreads) &&
                  ChecksStateFirst(4 * kResolveThreads + 1, 8 * kResolveThreads + 1),
              "ChecksStateFirst matches the kernel variant");

cudaError_t Fail(cudaError_t err, const char* kernel, const char** failed_kernel) {
  if (err != cudaSuccess && failed_kernel != nullptr) *failed_kernel = kernel;
  return err;
}

}  // namespace

int64_t ResolveSharedBytes(int64_t top_k, int64_t hot_slots) {
  return SharedBytes(top_k, hot_slots);
}

ResolveLaunchPlan ChooseResolvePlan(ResolveLaunchPlan plan, int64_t streams) {
  if (plan != ResolveLaunchPlan::kAuto) return plan;
  return streams < kAutoSplitBelowStreams ? ResolveLaunchPlan::kSplit : ResolveLaunchPlan::kFused;
}

cudaError_t LaunchResolve(const ResolveDims& d, const int32_t* layer, const ResolveBuffers& io,
                          bool fetch, ResolveLaunchPlan plan, cudaStream_t stream,
                          const char** failed_kernel) {
  constexpr const char* kResolveName = "hisparse resolve kernel";
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
  if (shared_bytes + kResolveStaticSharedBytes > kLargeSharedBytes) {
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
  a.malformed = io.malformed;
  a.layers = d.layers;
  a.streams = d.streams;
  a.record_bytes = d.record_bytes;
  a.top_k = static_cast<int32_t>(d.top_k);
  a.hot_slots = static_cast<int32_t>(d.hot_slots);
  a.pool_records = static_cast<int32_t>(d.pool_records);
  const int64_t capacity = TableCapacity(d.top_k, d.hot_slots);
  a.table_mask = static_cast<uint32_t>(capacity - 1);
  a.table_shift = 32;
  for (int64_t c = capacity; c > 1; c /= 2) --a.table_shift;
  const int64_t held_capacity = HeldCapacity(d.top_k, d.hot_slots);
  a.held_mask = held_capacity > 0 ? static_cast<uint32_t>(held_capacity - 1) : 0;
  a.held_shift = 32;
  for (int64_t c = held_capacity; c > 1; c /= 2) --a.held_shift;
  a.check_offset = static_cast<int32_t>((capacity * 2 + RegionInts(d.top_k, d.hot_slots)) * 4);
  a.check_vectors = static_cast<int32_t>((SlotBitmapInts(d.hot_slots) + held_capacity / 2) / 4);
  a.copy_vector = vector;
  a.row_batch = RowBatch(d.record_bytes / vector, kFusedCopyUnroll);
  a.fused_fetch = fetch && !split;
  const ResolveVariant variant = ResolveKernelFor(d.top_k, d.hot_slots, d.streams, SmCount(device));
  variant.kernel<<<static_cast<unsigned>(d.streams), variant.threads,
                   static_cast<size_t>(shared_bytes), stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  if (!fetch || !split || d.top_k == 0) return cudaSuccess;
  return LaunchResolveFetch(d, layer, io, int64_t{kFetchBlocksPerSm} * SmCount(device), stream,
                            failed_kernel);
}

cudaError_t LaunchResolveFetch(const ResolveDims& d, const int32_t* layer, const ResolveBuffers& io,
                               int64_t max_blocks, cudaStream_t stream, const char** failed_kernel) {
  constexpr const char* kFetchName = "hisparse fetch kernel";
  if (d.streams == 0 || d.top_k == 0) return cudaSuccess;
  if (max_blocks < 1 || d.streams > INT32_MAX)
    return Fail(cudaErrorInvalidValue, kFetchName, failed_kernel);
  const bool vec16 = d.record_bytes % 16 == 0 && Aligned(io.host_pool, 16) && Aligned(io.hot, 16);
  if (!vec16 && !(Aligned(io.host_pool, 8) && Aligned(io.hot, 8)))
    return Fail(cudaErrorMisalignedAddress, kFetchName, failed_kernel);
  const int vector = vec16 ? 16 : 8;
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
  const int64_t wanted = (max_blocks + d.streams - 1) / d.streams;
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

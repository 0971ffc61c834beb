// What RESOLVE's kernels and their launchers share (resolve_kernels.cu is the one
// translation unit that includes it): constants, the shared-memory layout of a
// resolve block, the kernels' arguments and the device helpers (table probes,
// the record copy of record_copy.cuh, per-lane slot lists, block totals).
#ifndef HISPARSE_FFI_RESOLVE_DEVICE_CUH_
#define HISPARSE_FFI_RESOLVE_DEVICE_CUH_

#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "resolve_cuda.h"
#include "resolve_phase_clock.h"

namespace hisparse {

#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
// [kPhaseClockStreams, kStampsPerStream] stamps of the last launch (resolve_phase_clock.h).
__device__ unsigned long long g_resolve_phase_clock[kPhaseClockStreams * kStampsPerStream];
#endif

namespace {

// Thread 0 of the block of `stream` stamps clock64() at `mark`; nothing
// unless built with -DHISPARSE_RESOLVE_PHASE_CLOCK.
__device__ __forceinline__ void PhaseMark(int stream, int mark) {
#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
  if (threadIdx.x == 0 && stream < kPhaseClockStreams)
    g_resolve_phase_clock[stream * kStampsPerStream + mark] = clock64();
#endif
}

// The global timer (ns) of the phase clock, at entry and at exit.
__device__ __forceinline__ void PhaseStampNs(int stream, int stamp) {
#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
  if (threadIdx.x == 0 && stream < kPhaseClockStreams) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    g_resolve_phase_clock[stream * kStampsPerStream + stamp] = ns;
  }
#endif
}

// Stamps the entry when made and the exit when its scope ends, whichever
// return the block takes.
struct PhaseClockScope {
  int stream;
  __device__ __forceinline__ explicit PhaseClockScope(int s) : stream(s) {
    PhaseStampNs(stream, kStampEntryNs);
    PhaseMark(stream, kMarkEntry);
  }
  __device__ __forceinline__ ~PhaseClockScope() {
    PhaseMark(stream, kMarkExit);
    PhaseStampNs(stream, kStampExitNs);
  }
};

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kFetchWarps = kFetchThreads / kWarp;
static_assert(kResolveThreads == 1024 && kResolveThreadsSmall % kWarp == 0 &&
                  kResolveThreadsSmall <= kResolveThreads,
              "warp totals are read one per lane of a warp");
// Above this, static plus dynamic shared memory, a kernel must opt in.
constexpr int kLargeSharedBytes = 48 * 1024;
// Static shared memory of a resolve block: four int per warp.
constexpr int ResolveStaticSharedBytes(int threads) { return 4 * (threads / kWarp) * 4; }
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

// Ints of a bitmap of the records [0, R) not yet seen held.
__host__ __device__ constexpr int64_t RecordBitmapInts(int64_t pool_records) {
  return RoundUp4((pool_records + 31) / 32);
}

// Whether the slot_record check marks records in a bitmap of R bits laid
// over the held-record set's memory (it fits while R <= 16 x the set's
// capacity, e.g. R <= 131072 at B = 4096) instead of inserting them into the
// set: one shared atomic per slot instead of a hash, a probe run of emulated
// 16-bit CAS and a load per collision, and a smaller clear. Larger pools keep
// the set, whose size depends on B only.
__host__ __device__ constexpr bool UsesRecordBitmap(int64_t top_k, int64_t hot_slots,
                                                    int64_t pool_records) {
  return !ChecksStateFirst(top_k, hot_slots) &&
         RecordBitmapInts(pool_records) <= HeldCapacity(top_k, hot_slots) / 2;
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
  // The launch's StreamRange (resolve.h): block b resolves stream stream_begin + b (a cluster's
  // blocks share one), and the range's blocks fill the output rows of the others.
  int64_t stream_begin, stream_count;
  int32_t top_k, hot_slots, pool_records;
  uint32_t table_mask;   // table capacity - 1
  uint32_t table_shift;  // 32 - log2(table capacity)
  uint32_t held_mask;    // held-record set capacity - 1 (0: ChecksStateFirst shape)
  uint32_t held_shift;   // 32 - log2(held-record set capacity)
  int32_t check_offset;  // bytes from the start of shared memory to the slot bitmap
  int32_t check_vectors; // int4 of the slot bitmap and the held set or record bitmap
                         // (cleared together)
  bool record_bitmap;    // UsesRecordBitmap: records go into a bitmap, not the held set
  int32_t hit_offset;    // cluster kernel: bytes to hit_of_pos (then the slot and record bitmaps)
  int32_t record_offset; // cluster kernel: bytes to the record bitmap
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
  int64_t stream_begin;  // the launch's first stream: blocks cover [stream_begin, + grid / chunks)
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
#ifdef HISPARSE_RESOLVE_SCALAR_PROBE
  // A/B variant: one key per step. At load <= 1/4 a lookup takes ~1.2-1.4
  // probes on average, and a 4-byte load costs a quarter of the shared-memory
  // wavefronts of a 16-byte one; the group load shortens only the longest runs.
  uint32_t at[N];
#pragma unroll
  for (int u = 0; u < N; ++u) at[u] = HashId(rec[u], shift);
  unsigned found = 0;
  while (todo != 0) {
    int key[N];
#pragma unroll
    for (int u = 0; u < N; ++u)
      if ((todo >> u) & 1u) key[u] = keys[at[u]];
#pragma unroll
    for (int u = 0; u < N; ++u) {
      if (!((todo >> u) & 1u)) continue;
      if (key[u] == rec[u]) {
        entry[u] = static_cast<int>(at[u]);
        found |= 1u << u;
        todo &= ~(1u << u);
      } else if (key[u] == -1) {
        todo &= ~(1u << u);
      } else {
        at[u] = (at[u] + 1) & mask;
      }
    }
  }
  return found;
#else
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
#endif
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

}  // namespace
}  // namespace hisparse

#include "record_copy.cuh"

namespace hisparse {
namespace {

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

// The output rows of the streams outside the launch's range (resolve.h,
// "Stream range": what a selection of padding gives), spread over the range's
// `blocks` blocks: block `block` fills outside streams block, block + blocks,
// ... . Stores only; nothing when the range is every stream. Every thread
// calls it (FillOutsideRange), first thing. Not inlined, and given the
// fields it writes rather than the kernel's arguments (whose address would
// put a copy of them in local memory): inlined, it changed the register
// allocation (and spills) of the largest resolve variants.
template <int kThreads>
__device__ __noinline__ void FillRows(int32_t* slots, int32_t* miss_records, int32_t* miss_slots,
                                      int32_t* misses, int32_t* invalid, int32_t* malformed,
                                      int64_t outside, int64_t begin, int64_t count, int k,
                                      int64_t block, int64_t blocks) {
  for (int64_t o = block; o < outside; o += blocks) {
    const int64_t s = o < begin ? o : o + count;
    const int64_t out = s * k;
    for (int j = threadIdx.x; j < k; j += kThreads) {
      slots[out + j] = -1;
      miss_records[out + j] = -1;
      miss_slots[out + j] = -1;
    }
    if (threadIdx.x == 0) {
      misses[s] = 0;
      invalid[s] = 0;
      malformed[s] = 0;
    }
  }
}

template <int kThreads>
__device__ __forceinline__ void FillOutsideRange(const ResolveArgs& a, int64_t block,
                                                 int64_t blocks) {
  if (a.stream_count == a.streams) return;  // every stream resolved: no row to fill
  FillRows<kThreads>(a.slots, a.miss_records, a.miss_slots, a.misses, a.invalid, a.malformed,
                     a.streams - a.stream_count, a.stream_begin, a.stream_count, a.top_k, block,
                     blocks);
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

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_DEVICE_CUH_

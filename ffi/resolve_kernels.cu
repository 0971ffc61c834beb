// RESOLVE and the pool write on CUDA: the contracts of resolve.h and
// pool_write.h, bit-identical to resolve_cpu.cc and pool_write_cpu.cc. See
// resolve_cuda.h for the launch plans.
//
// With few streams (and 4096 < B <= 8192, k <= 4096, a record bitmap for the
// state check) the launcher takes the cluster variant instead, two or four
// blocks per stream on as many SMs: resolve_cluster_kernel.cuh.
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
//  - the malformed-state check (resolve.h) rides on the loads, passes and
//    barriers the block has anyway: in phase 1 each lane marks its lru slots
//    in a bitmap (outside [0, B) or marked twice: malformed); in phase 2 the
//    lru pass, which reads the record of every listed slot for its probe
//    anyway, marks that record in a bitmap of R bits (outside [-1, R) or
//    marked twice: malformed). A permutation lists each slot once, so this
//    covers slot_record; any other lru is malformed already. The verdict is
//    the __syncthreads_or of barrier 3, before anything is written. Cost per
//    block: clearing B/8 + R/8 bytes of shared memory and one shared atomic
//    per lru position and per listed record; no extra pass, load or barrier.
//    The record bitmap lies over the memory of a held-record set (4B to 8B
//    bytes) and is used while it fits (R <= 16 x the set's capacity, e.g.
//    R <= 131072 at B = 4096). Larger pools insert every staged record into
//    the set instead (uint16 slot ids keyed by the record; one there already:
//    held twice), in a rolled loop of two slots per lane and round after the
//    probes: a hash, a 16-bit atomicCAS and a load per collision per slot
//    (with the set for every pool, the check took the no-IO call from 13.0
//    to 24.2 us at 64 streams, B = 4096: BENCHMARKS.md). The
//    ChecksStateFirst shapes (B > 8192 with k > 4096) have no shared memory
//    left for either: they check in a pass of their own before the table is
//    built, with a set laid over the table's memory, at the price of two
//    more barriers, clearing the table twice and a second read of the lru
//    and slot_record rows.
//
// Shared memory: keys[cap] (-1 = empty) and words[cap] of an open-addressing
// table of the selected ids (cap = power of two, see TableCapacity); then a
// region of max(B, 2k) ints holding the staged slot_record until the probes
// are done, then the miss plan (plan_slot[k], plan_record[k]); then the
// state check's bitmap of slots not yet seen in lru (B bits) and the memory
// of its set of held records (uint16 slot ids keyed by the record each slot
// holds, capacity a power of two >= 2B), which holds the bitmap of records
// not yet seen held (R bits) where that fits; not for ChecksStateFirst
// shapes. A word holds either 0xffff << 16 | (first position of its id in
// the selection) or
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
//      slot), else evictable; count evictables per warp. State check: the
//      record of each listed slot in [-1, R) and, if >= 0, the first of its
//      value in the record bitmap (or, past it, in the held set; else
//      malformed)                                    [bar 3: OR of verdicts]
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

// One translation unit, in this order: the kernels are templates in its anonymous
// namespace, instantiated by the launchers of resolve_launch.cuh.
#include "resolve_device.cuh"

namespace hisparse {
namespace {

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

  FillOutsideRange<kThreads>(a, blockIdx.x, gridDim.x);
  const int stream = static_cast<int>(a.stream_begin) + static_cast<int>(blockIdx.x);
  const PhaseClockScope phase_clock(stream);
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
  auto unseen_records = [&held] {  // [R bits] record bitmap mode: records not yet seen held
    return reinterpret_cast<uint32_t*>(held());
  };
  // This lane found the state malformed; the block's verdict is the OR at bar 3.
  bool bad_state = false;

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
  PhaseMark(stream, kMarkTable);

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
      if (c < lru_rounds && i < B && !MarkSlotSeen(unseen(), order.Get(c), B)) bad_state = true;
    }
  }
  WaitStaged();
  __syncthreads();  // 2: table complete, slot_record staged
  PhaseMark(stream, kMarkProbe);

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
    if constexpr (!kCheckFirst) {
      // Record bitmap mode: the record of each listed slot, in [-1, R) and,
      // if >= 0, seen for the first time. A permutation lists every slot
      // once, so this covers slot_record; any other lru is malformed anyway
      // (then a slot listed twice may read as a record held twice: the
      // verdict is the same).
      if (a.record_bitmap) {
#pragma unroll
        for (int u = 0; u < kLruBatch; ++u) {
          if (((listed >> u) & 1u) && rec[u] != -1 &&
              !MarkSlotSeen(unseen_records(), rec[u], a.pool_records))
            bad_state = true;
        }
      }
    }
    evictable |= (listed & ~hit) << c0;
  }
  if (!kCheckFirst && !a.record_bitmap) {
    // Held-set mode (pools too large for the record bitmap): every record
    // in [-1, R), none >= 0 held by two slots. A rolled loop over the slots,
    // apart from the probes, so that it holds no more registers than one
    // batch of inserts.
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
      if (wrong) bad_state = true;
    }
  }
#pragma unroll
  for (int c = 0; c < kRounds; ++c)
    evictables_in_warp += __popc(__ballot_sync(kFullMask, (evictable >> c) & 1u));
  if (lane == 0) warp_evictable[warp] = evictables_in_warp;
  // 3: words final (first position or hit slot), the state's verdict (the
  // ChecksStateFirst variant checked apart: bad_state stays false).
  const bool malformed = __syncthreads_or(bad_state) != 0;
  PhaseMark(stream, kMarkVerdict);

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
  PhaseMark(stream, kMarkLru);
  if (M == 0) return;  // the steady state: every selected id was resident

  int misses_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c)
    misses_in_warp += __popc(__ballot_sync(kFullMask, (miss >> c) & 1u));
  if (lane == 0) warp_misses[warp] = misses_in_warp;
  const bool repeats = __syncthreads_or(repeat_miss != 0);  // 4: plan_slot, miss counts
  PhaseMark(stream, kMarkMissRank);

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

}  // namespace
}  // namespace hisparse

#include "resolve_cluster_kernel.cuh"
#include "resolve_fetch_kernels.cuh"
#include "resolve_launch.cuh"

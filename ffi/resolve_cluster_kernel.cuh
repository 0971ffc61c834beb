// The resolve kernel on a thread-block cluster of kCluster CTAs per stream
// (2 or 4; sm_90 distributed shared memory), for launches with at most
// SMs / kCluster streams. Included by resolve_kernels.cu after ResolveKernel;
// same contract (resolve.h), bit-identical outputs and state.
//
// Why: one 1024-thread block per stream is bound by the instructions its SM
// issues (Nsight Compute, 64 streams, B = 4096: ~1500 per warp at 0.62 IPC
// per scheduler, 42% of them in the lru probe pass), while 64 streams leave
// 68 of the 132 SMs idle. kCluster CTAs on as many SMs split the B-sized
// work (the lru loads, the probes of the listed slots' records, the state
// check's marks, the lru rewrite) and the output writes: CTA r takes the
// r-th part of the lru positions and of the selection positions. Each builds
// the whole table of the k selected ids (a replica: its lookups stay local),
// and they exchange only small things through distributed shared memory.
// Each CTA writes only its own shared memory and the others read it after a
// cluster barrier (pull): a release at cluster scope compiles to a GPU-wide
// MEMBAR that waits for every outstanding global access of the thread (the
// first version pushed into the other CTAs behind such barriers and lost
// more than the split gained), while a CTA's stores into its own shared
// memory are complete after a CTA fence (MEMBAR.CTA), so a relaxed arrive
// after that fence is enough for any CTA that reads them after the wait.
//  - the slot of each hit, by the first selection position of its id
//    (hit_of_pos[k]), which is why words hold only first positions here
//    (every item atomicMin's its position, so they are final at barrier 2
//    and a hit can name its id's position in phase 2); after barrier A each
//    CTA merges every CTA's hit_of_pos into its own (the max: -1 or the one
//    slot holding the id; a reader sees the old or the merged value, both
//    give the same max);
//  - each warp's count of evictable slots (a part's ranks start after the
//    earlier parts' evictables);
//  - the state check: each CTA marks the slots its part of lru lists and the
//    records they hold in its own bitmaps (a repeat within the part shows in
//    the atomic, as in ResolveKernel); a repeat across parts is a bit cleared
//    in two CTAs' bitmaps, found by reading every CTA's bitmaps after
//    barrier A (B + R bits), with every CTA's state_bad. Every CTA reaches
//    the same verdict before anything is written;
//  - the slot each miss takes (plan_slot, by rank, in the CTA whose lru part
//    has that evictable), read after barrier B by the CTA that writes the
//    miss.
// Every CTA flags misses over the whole selection (cheap: a word and a
// hit_of_pos read per item), so the miss ranks need no exchange. All take
// the same path (layer, verdict, M, repeats and the plan are the same in
// all), so the cluster barriers match: A (hits, counts, check marks), X
// (split: arrive after the last read of another CTA's memory, wait before
// the next barrier or the exit, so no CTA leaves while another reads it), B
// (plan_slot; only when M > 0), then either Y (no CTA leaves before the
// others have read its plan_slot) or, for repeated missing ids and the fused
// copy, C: a full release barrier behind which each CTA writes the missing
// ids' slots and the whole plan into every CTA (rare, or bound by the copy).
#ifndef HISPARSE_FFI_RESOLVE_CLUSTER_KERNEL_CUH_
#define HISPARSE_FFI_RESOLVE_CLUSTER_KERNEL_CUH_

namespace hisparse {
namespace {

// `p` in the shared memory of CTA `rank` of the cluster.
template <typename T>
__device__ __forceinline__ T* SharedOf(T* p, int rank) {
  return static_cast<T*>(__cluster_map_shared_rank(static_cast<const void*>(p), rank));
}

// Writes `v` to p[i] in every CTA of the cluster, this one included.
template <int kCluster>
__device__ __forceinline__ void StoreAll(int* p, int i, int v) {
#pragma unroll
  for (int q = 0; q < kCluster; ++q) SharedOf(p, q)[i] = v;
}

// kCluster: CTAs per stream; kRounds: most lru items per lane in one part
// (ceil(B / kCluster) <= 1024 x kRounds); kSelRounds: most selection items
// per lane (all k ids: every CTA builds the whole table).
template <int kCluster, int kRounds, int kSelRounds>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kResolveThreads, 1)
    ResolveClusterKernel(const ResolveArgs a) {
  constexpr int kThreads = kResolveThreads;
  constexpr int kWarps = kThreads / kWarp;
  constexpr int kLruBatch = kRounds < kProbeBatch ? kRounds : kProbeBatch;
  static_assert(kCluster == 2 || kCluster == 4, "pairs or quads of CTAs");
  static_assert(kRounds <= 4 && kSelRounds <= 4 && kRounds % kLruBatch == 0,
                "cluster shapes: B <= 8192, k <= 4096");
  extern __shared__ int4 shared[];
  __shared__ int warp_distinct[kWarps];
  __shared__ int warp_invalid[kWarps];
  __shared__ int warp_evictable[kWarps];          // this CTA's, read by every CTA
  __shared__ int evict_counts[kCluster * kWarps];  // [rank][warp]: every CTA's, gathered
  __shared__ int warp_misses[kWarps];
  __shared__ int state_bad;   // some CTA found the state malformed in its part
  __shared__ int any_repeat;  // a missing id appears more than once

  FillOutsideRange<kThreads>(a, blockIdx.x, gridDim.x);  // every CTA takes a share
  const int rank = static_cast<int>(blockIdx.x % kCluster);  // rank in the cluster
  const int stream = static_cast<int>(a.stream_begin) + static_cast<int>(blockIdx.x / kCluster);
  const PhaseClockScope phase_clock(rank == 0 ? stream : kPhaseClockStreams);
  const int clock_stream = rank == 0 ? stream : kPhaseClockStreams;  // only rank 0 records
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
  auto at_offset = [&a](int32_t bytes) {
    return reinterpret_cast<int*>(reinterpret_cast<char*>(shared) + bytes);
  };
  int* hit_of_pos = at_offset(a.hit_offset);  // [k] slot of the id first at position p, or -1
  uint32_t* unseen = reinterpret_cast<uint32_t*>(at_offset(a.check_offset));  // [B bits]
  uint32_t* unseen_records = reinterpret_cast<uint32_t*>(at_offset(a.record_offset));  // [R bits]
  bool bad_state = false;

  // Lane-owned positions: every selection position (the whole table), and
  // this CTA's part of the lru positions [lru_base, lru_base + lru_count).
  const int sel_rounds = (k + kThreads - 1) / kThreads;
  const int part_b = (B + kCluster - 1) / kCluster;
  const int lru_base = min(B, rank * part_b);
  const int lru_count = min(part_b, B - lru_base);
  const int lru_rounds = (part_b + kThreads - 1) / kThreads;
  const int j0 = warp * kWarp * sel_rounds + lane;
  const int li0 = warp * kWarp * lru_rounds + lane;  // + lru_base: the lru position
  // Selection positions whose outputs this CTA writes: [own_lo, own_hi).
  const int part_k = (k + kCluster - 1) / kCluster;
  const int own_lo = min(k, rank * part_k), own_hi = min(k, own_lo + part_k);
  auto own = [own_lo, own_hi](int j) { return j >= own_lo && j < own_hi; };

  // 0. Loads that do not depend on the layer, with the layer; the clears
  // (keys and words, hit_of_pos, the two bitmaps) overlap them.
  const int32_t* sel = a.selection + int64_t{stream} * k;
  int id[kSelRounds];
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    id[c] = (c < sel_rounds && j < k) ? sel[j] : -1;
  }
  const int sealed = a.sealed[stream];
  const int layer = *a.layer;
  for (uint32_t q = tid; q < capacity / 2; q += kThreads) shared[q] = make_int4(-1, -1, -1, -1);
  {
    int4* clear = reinterpret_cast<int4*>(hit_of_pos);  // hit_of_pos, then the bitmaps
    for (int q = tid; q < a.check_vectors; q += kThreads) clear[q] = make_int4(-1, -1, -1, -1);
  }
  if (tid == 0) {
    state_bad = 0;
    any_repeat = 0;
  }
  if (layer < 0 || layer >= a.layers) {  // no cluster barrier on this path, in either CTA
    if (rank == 0) ResolveNothing<kThreads>(a, stream, 0, 0, warp_invalid);
    return;
  }
  const int64_t ls = int64_t{layer} * a.streams + stream;
  int32_t* slot_record = a.slot_record + ls * B;
  int32_t* lru = a.lru + ls * B;
  const int limit = max(0, min(sealed, a.pool_records));
  StageAsync(staged_record, slot_record, B, tid, kThreads);
  SlotList<kRounds, false> order;
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const int li = li0 + c * kWarp;
    order.Set(c, (c < lru_rounds && li < lru_count) ? lru[lru_base + li] : -1);
  }
  __syncthreads();  // 1: keys and words cleared
  PhaseMark(clock_stream, kMarkTable);

  // 1. Rule 0, then the distinct valid ids (rule 1); every item min's its
  // position into the word, so the words hold first positions at barrier 2.
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
    if ((valid >> c) & 1u) atomicMin(&words[entry[c]], PositionWord(j0 + c * kWarp));
    distinct_in_warp += __popc(__ballot_sync(kFullMask, (won >> c) & 1u));
    invalid_in_warp += __popc(__ballot_sync(kFullMask, (bad >> c) & 1u));
  }
  if (lane == 0) {
    warp_distinct[warp] = distinct_in_warp;
    warp_invalid[warp] = invalid_in_warp;
  }
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {  // lru: every slot of the part in [0, B), none twice in it
    const int li = li0 + c * kWarp;
    if (c < lru_rounds && li < lru_count && !MarkSlotSeen(unseen, order.Get(c), B)) bad_state = true;
  }
  WaitStaged();
  __syncthreads();  // 2: table and first positions complete, slot_record staged
  PhaseMark(clock_stream, kMarkProbe);

  // 2. The records of this part's listed slots: hits (their slot goes to
  // this CTA's hit_of_pos) and evictables; the state check's record marks.
  unsigned evictable = 0;
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
      if ((hit >> u) & 1u) {
        // A record held twice (malformed, rejected at bar 3) may write one
        // position twice; the position is < k either way.
        hit_of_pos[WordPosition(words[at[u]])] = order.Get(c0 + u);
      }
    }
#pragma unroll
    for (int u = 0; u < kLruBatch; ++u) {
      if (((listed >> u) & 1u) && rec[u] != -1 &&
          !MarkSlotSeen(unseen_records, rec[u], a.pool_records))
        bad_state = true;
    }
    evictable |= (listed & ~hit) << c0;
  }
  int evictables_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kRounds; ++c)
    evictables_in_warp += __popc(__ballot_sync(kFullMask, (evictable >> c) & 1u));
  if (lane == 0) warp_evictable[warp] = evictables_in_warp;
  if (bad_state) state_bad = 1;
  __threadfence_block();  // this CTA's stores are in its shared memory before it arrives
  __cluster_barrier_arrive_relaxed();
  __cluster_barrier_wait();  // A: hits, counts and every CTA's marks in place

  // 2b. Repeats across parts: a slot listed, or a record held, in two parts
  // is a bit cleared in two CTAs' bitmaps. Every CTA checks every word, so
  // all reach the same verdict. Then every CTA's hits and counts, gathered.
  {
    const int slot_words = (B + 31) / 32, record_words = (a.pool_records + 31) / 32;
    bool across = false;
    auto overlap = [&across](const uint32_t* bitmap, int words_n, int tid_) {
      for (int w = tid_; w < words_n; w += kThreads) {
        uint32_t seen = 0, twice = 0;
#pragma unroll
        for (int q = 0; q < kCluster; ++q) {
          const uint32_t cleared = ~SharedOf(bitmap, q)[w];
          twice |= seen & cleared;
          seen |= cleared;
        }
        across |= twice != 0;
      }
    };
    overlap(unseen, slot_words, tid);
    overlap(unseen_records, record_words, tid);
    if (tid < kCluster && *SharedOf(&state_bad, tid) != 0) across = true;
    if (across) bad_state = true;
    for (int p = tid; p < k; p += kThreads) {
      int slot = -1;
#pragma unroll
      for (int q = 0; q < kCluster; ++q) slot = max(slot, SharedOf(hit_of_pos, q)[p]);
      hit_of_pos[p] = slot;
    }
    if (tid < kCluster * kWarps) evict_counts[tid] = SharedOf(warp_evictable, tid / kWarps)[tid % kWarps];
  }
  // 3: the same verdict in every CTA; every value read from another CTA has
  // been used (stored or OR'ed) before this barrier, so the reads are done.
  const bool malformed = __syncthreads_or(bad_state) != 0;
  __cluster_barrier_arrive_relaxed();  // X: done reading the other CTAs' memory
  PhaseMark(clock_stream, kMarkVerdict);

  // 3. Totals: every CTA has every warp count of every part.
  const bool owner = lane < kWarps;
  const int lane_distinct = owner ? warp_distinct[lane] : 0;
  const int lane_invalid = owner ? warp_invalid[lane] : 0;
  const int distinct = WarpTotal(lane_distinct);
  const int total_invalid = WarpTotal(lane_invalid);
  int E = 0, earlier_e = 0;  // all evictables; those of the parts before this one
  int part_e[kCluster];      // each part's evictables: the ranks its CTA's plan_slot holds
#pragma unroll
  for (int q = 0; q < kCluster; ++q) {
    part_e[q] = WarpTotal(owner ? evict_counts[q * kWarps + lane] : 0);
    E += part_e[q];
    if (q < rank) earlier_e += part_e[q];
  }
  const int lane_evictable = owner ? evict_counts[rank * kWarps + lane] : 0;
  const int M = max(0, min(distinct - (B - E), E));
  const int64_t out = int64_t{stream} * k;
  if (malformed) {  // resolves nothing; nothing of the state was written
    for (int j = own_lo + tid; j < own_hi; j += kThreads) {
      a.slots[out + j] = -1;
      a.miss_records[out + j] = -1;
      a.miss_slots[out + j] = -1;
    }
    if (rank == 0 && tid == 0) {
      a.misses[stream] = 0;
      a.invalid[stream] = total_invalid;
      a.malformed[stream] = 1;
    }
    __cluster_barrier_wait();  // X
    return;
  }

  // New lru (rule 4) for this part and the slot each miss takes (rule 3):
  // ranks of a part start after the earlier parts' evictables.
  int evict_rank = earlier_e + WarpTotalBelow(lane_evictable, lane, warp);
#pragma unroll
  for (int c = 0; c < kRounds; ++c) {
    const bool is_evictable = (evictable >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, is_evictable);
    const int li = li0 + c * kWarp;
    if (c < lru_rounds && li < lru_count) {
      const int i = lru_base + li;
      const int r = evict_rank + __popc(bits & lanes_below);  // evictables before i
      const int slot = order.Get(c);
      int position;
      if (is_evictable) {
        position = r >= M ? r - M : E - M + r;
        if (r < M) plan_slot[r] = slot;  // read by the CTA that writes miss r
      } else {
        position = E + (i - r);
      }
      // Always in [0, B) in a well-formed state; the guard is the last line
      // between any count and a write outside the row.
      if (position >= 0 && position < B) lru[position] = slot;
    }
    evict_rank += __popc(bits);
  }

  // slots[j] of hits and padding (rule 6) for this CTA's positions; misses
  // and repeats flagged over all positions (the same ranks in every CTA).
  unsigned miss = 0, repeat_miss = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    if (c >= sel_rounds || j >= k) continue;
    int slot = -1;
    if ((valid >> c) & 1u) {
      const int p = WordPosition(words[entry[c]]);
      slot = hit_of_pos[p];
      if (slot < 0 && M > 0) {
        if (p == j) {
          miss |= 1u << c;
        } else {
          repeat_miss |= 1u << c;
        }
        continue;  // written in phase 4 or 5
      }
    }
    if (own(j)) a.slots[out + j] = slot;  // -1 for padding and invalid ids
  }
  if (rank == 0 && tid == 0) {
    a.misses[stream] = M;
    a.invalid[stream] = total_invalid;
    a.malformed[stream] = 0;
  }
  for (int m = M + rank * kThreads + tid; m < k; m += kCluster * kThreads) {
    a.miss_records[out + m] = -1;
    a.miss_slots[out + m] = -1;
  }
  PhaseMark(clock_stream, kMarkLru);
  if (M == 0) {  // the steady state: every selected id was resident
    __cluster_barrier_wait();  // X
    return;
  }

  int misses_in_warp = 0;
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c)
    misses_in_warp += __popc(__ballot_sync(kFullMask, (miss >> c) & 1u));
  if (lane == 0) warp_misses[warp] = misses_in_warp;
  if (repeat_miss != 0) any_repeat = 1;
  __threadfence_block();     // plan_slot in this CTA's shared memory before it arrives
  __cluster_barrier_wait();  // X
  __cluster_barrier_arrive_relaxed();
  __cluster_barrier_wait();  // B: plan_slot of every CTA, miss counts, any_repeat
  const bool repeats = any_repeat != 0;
  PhaseMark(clock_stream, kMarkMissRank);

  // 4. Miss of rank m (first-appearance order, rule 2) takes plan_slot[m];
  // the CTA that owns its position writes it.
  int miss_rank = WarpTotalBelow(owner ? warp_misses[lane] : 0, lane, warp);
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const bool is_miss = (miss >> c) & 1u;
    const unsigned bits = __ballot_sync(kFullMask, is_miss);
    const int j = j0 + c * kWarp;
    if (is_miss && own(j)) {
      const int m = miss_rank + __popc(bits & lanes_below);  // < k
      int slot = -1;  // plan_slot[m] of the CTA whose lru part has evictable m (m < M: well formed)
      if (m < M) {
        int q = 0, start = 0;
        while (q + 1 < kCluster && m >= start + part_e[q]) start += part_e[q++];
        slot = SharedOf(plan_slot, q)[m];
      }
      const int record = keys[entry[c]];  // the id: not kept in registers past phase 1
      a.slots[out + j] = slot;
      a.miss_records[out + m] = record;
      a.miss_slots[out + m] = slot;
      if (slot >= 0 && slot < B) slot_record[slot] = record;
      if (a.fused_fetch && m < M) {  // the same slot another CTA may still read: harmless
        StoreAll<kCluster>(plan_slot, m, slot);
        StoreAll<kCluster>(plan_record, m, record);
      }
      if (repeats) StoreAll<kCluster>(hit_of_pos, j, slot);  // j: the id's first position
    }
    miss_rank += __popc(bits);
  }
  if (!repeats && !a.fused_fetch) {
    // Y: the slots read from other CTAs were used by the stores above, so
    // the reads are done; no CTA leaves before every CTA's are.
    __cluster_barrier_arrive_relaxed();
    __cluster_barrier_wait();
    return;
  }
  __cluster_barrier_arrive();
  __cluster_barrier_wait();  // C: the whole plan and the missing ids' slots in every CTA

  // 5. Later copies of a missing id, and the fused plan's copy (rule 5),
  // spread over the warps of every CTA.
#pragma unroll
  for (int c = 0; c < kSelRounds; ++c) {
    const int j = j0 + c * kWarp;
    if (((repeat_miss >> c) & 1u) && own(j))
      a.slots[out + j] = hit_of_pos[WordPosition(words[entry[c]])];
  }
  if (a.fused_fetch) {
    const int64_t W = a.record_bytes;
    const uint8_t* src = a.host_pool + ls * a.pool_records * W;
    uint8_t* dst = a.hot + ls * B * W;
    auto plan_at = [plan_slot, plan_record](int m) {
      return make_int2(plan_slot[m], plan_record[m]);
    };
    const int copy_warp = rank * kWarps + warp, copy_warps = kCluster * kWarps;
    if (a.copy_vector == 16) {
      CopyMisses<int4, kFusedCopyUnroll>(src, dst, W, B, a.pool_records, a.row_batch, M,
                                         copy_warp, copy_warps, lane, plan_at);
    } else {
      CopyMisses<uint2, kFusedCopyUnroll>(src, dst, W, B, a.pool_records, a.row_batch, M,
                                          copy_warp, copy_warps, lane, plan_at);
    }
  }
}

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_CLUSTER_KERNEL_CUH_

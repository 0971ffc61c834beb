// The miss fetch's footprint (issue 23): how fast a fetch variant moves random
// 1152-byte records from the pinned host pool into a device hot buffer, and how
// much it slows an HBM-bound kernel that runs beside it.
//
// Variants (each gathers rows[i] of the pool into hot slot slots[i], i < R):
//   gather     RESOLVE's own record copy (CopyMisses of ffi/record_copy.cuh,
//              the split fetch kernel's code): 256-thread blocks, each warp
//              holding up to 32 x unroll 16-byte zero-copy loads in flight;
//              16 blocks (the prefetch's count) and kFetchBlocksPerSm x SMs
//              (the split plan's grid); then 2-8 blocks with a deeper unroll
//              (16 vectors per lane in flight, 102 registers: an unroll of 32
//              takes 171, and a 256-thread block of those does not fit on an
//              SM beside the neighbour's two blocks, so it is left out).
//   cp.async   128-thread blocks (2-8 of them), each lane keeping 4 or 8 stages
//              of 8 cp.async copies (16 bytes, host-mapped global -> shared) in
//              flight, then storing what landed: the bytes in flight sit in
//              shared memory (64 or 128 KiB a block), not in registers.
//   tma        one warp per block, lane 0 alone drives a ring of `stages` row
//              buffers in shared memory: cp.async.bulk global -> shared (the
//              host-mapped pool is global memory), completion on an mbarrier,
//              then cp.async.bulk shared -> global into the hot buffer. No
//              registers hold the data; a block keeps `stages` rows in flight.
//              2-16 blocks of 32 or 128 stages, then 32-128 blocks of 16 or 32
//              (the copy spread over more SMs' engines).
// Rows: R in {2048, 8192, 32768} (--rows) distinct random rows of a pinned
// pool of --pool-gib GiB (default 6.75; the pool is filled by a kernel that
// writes the host memory), scattered to a random permutation of hot slots.
// Each timed call gathers another of `sets` row sets (sets x R x 1152 B >= 3 x
// L2), so no call finds its rows in L2.
// Checked first: for every variant and R, the hot buffer (poisoned before)
// holds, after one call on the first and on the last row set, exactly the
// pool's bytes of every row (memcmp against the host pool). A failing
// configuration prints FAIL, is not timed, and the program exits 1 at the end.
// Alone: --iters calls (default 20) after 3 warm-ups, each between CUDA events,
// all queued behind a 20 ms spin; link GB/s = R x 1152 B / time.
// Beside: a neighbour kernel reads --neighbour-gib GiB (default 2) of device
// memory, `passes` times over (enough to last 1.5 x the fetch alone), with 2
// blocks of 512 threads per SM and 4 independent 16-byte loads per thread in
// flight, which leaves an SM half its warp slots and registers, and (its
// carveout set to shared memory first) its shared memory, so the fetch's
// blocks fit beside it. Per iteration: the neighbour alone, then the neighbour
// on stream A and the fetch on stream B (highest priority, as the prefetch's),
// both released by one event after a spin, the neighbour launched first.
// Events on both streams give the neighbour's time alone T and beside T' and
// the fetch's time beside (its GB/s beside). Both kernels also stamp the
// device clock (globaltimer) at their first block's start and last block's
// end, which says when their blocks really ran: the fetch's start offset after
// the neighbour's (large when its blocks found no room) and the overlap window
// W. Reported: the whole-kernel ratio T' / T (depends on how long the
// neighbour is), and the neighbour's slowdown inside the window,
// W / (W - (T' - T)) (its rate alone / its rate while the fetch runs, medians),
// which does not; `covered` is W / the fetch's stamped span (1: the fetch ran
// wholly inside the neighbour).
// Ceiling printed first: cudaMemcpy H2D of 256 MiB from the same pinned pool.
// A bulk load that never lands (should host-mapped memory not serve TMA) ends
// its block after 200 ms of waiting, and the check reports FAIL.
//
// Build (repository root):
//   make -C ffi/bench fetch-footprint
// Run (well under a minute on an H200 after the pool is pinned; prints
// Markdown, writes JSON):
//   build/fetch_footprint_bench results/fetch_footprint.json
//   build/fetch_footprint_bench /tmp/ff.json --rows 8192 --pool-gib 4 --iters 10
//   build/fetch_footprint_bench /tmp/tma.json --only tma   # variants whose name holds "tma"
//   build/fetch_footprint_bench /tmp/ld.json --only gather,cp.async   # either
// Without --pool-gib, a pool that cannot be pinned at 6.75 GiB is retried at
// 4 GiB (one line says so).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "resolve_device.cuh"  // RESOLVE's record copy (CopyMisses, RowBatch) and its constants
#include "tests/harness.h"

namespace {

using harness::Spin;
using harness::Stats;

constexpr int64_t kRecordBytes = 1152;
constexpr int kVectors = kRecordBytes / 16;  // 16-byte vectors per record
constexpr int kNeighbourThreads = 512;
constexpr int kNeighbourBlocksPerSm = 2;
constexpr int kNeighbourUnroll = 4;

// ---------------------------------------------------------------------------
// Kernels.

__device__ __forceinline__ uint64_t GlobalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A kernel's span on the device clock: stamps[0] the first block's start
// (atomicMin, the host sets it to ~0 first), stamps[1] the last block's end
// (atomicMax, from 0). Null: not stamped. Events say when a stream reached a
// kernel; these say when its blocks ran, which is what overlapped.
__device__ __forceinline__ void StampStart(unsigned long long* stamps) {
  if (stamps != nullptr && threadIdx.x == 0) atomicMin(stamps, static_cast<unsigned long long>(GlobalNs()));
}
__device__ __forceinline__ void StampEnd(unsigned long long* stamps) {
  if (stamps != nullptr && threadIdx.x == 0) atomicMax(stamps + 1, static_cast<unsigned long long>(GlobalNs()));
}

// Fills n 8-byte words (of host-mapped memory: the pool) with splitmix64 of their index.
__global__ void FillPool(uint64_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = harness::Mix(static_cast<uint64_t>(i) ^ seed);
}

// The current fetch: CopyMisses of record_copy.cuh over the plan (slots[m], rows[m]).
template <int kUnroll>
__global__ void __launch_bounds__(hisparse::kFetchThreads)
    GatherKernel(const uint8_t* pool, uint8_t* hot, const int32_t* rows, const int32_t* slots, int count,
                 int pool_rows, unsigned long long* stamps) {
  StampStart(stamps);
  const int lane = threadIdx.x % hisparse::kWarp, warp = threadIdx.x / hisparse::kWarp;
  auto plan_at = [=](int m) { return make_int2(slots[m], rows[m]); };
  hisparse::CopyMisses<int4, kUnroll>(pool, hot, kRecordBytes, count, pool_rows,
                                      hisparse::RowBatch(kVectors, kUnroll), count,
                                      blockIdx.x * hisparse::kFetchWarps + warp,
                                      gridDim.x * hisparse::kFetchWarps, lane, plan_at);
  __syncthreads();
  StampEnd(stamps);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Waits for the phase of `parity` of mbarrier `bar`; false after kWaitLimitNs
// (a bulk load that never lands: the check then fails instead of the run hanging).
constexpr uint64_t kWaitLimitNs = 200'000'000;

__device__ __forceinline__ bool MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  uint64_t start = 0;
  for (int spins = 0;; ++spins) {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (done) return true;
    if (spins == 0) start = GlobalNs();
    if (spins % 1024 == 1023 && GlobalNs() - start > kWaitLimitNs) return false;
  }
}

// The record at `src` (host-mapped pool memory) into stage buffer `buf`, completing on mbarrier `bar`.
__device__ __forceinline__ void BulkLoadRow(uint32_t buf, uint32_t bar, const uint8_t* src) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(int{kRecordBytes})
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(buf),
      "l"(src), "r"(int{kRecordBytes}), "r"(bar)
      : "memory");
}

// The TMA fetch: block b takes rows b, b + grid, ...; lane 0 keeps up to kStages
// bulk loads in flight, and stores each row as soon as it lands. A stage is
// reloaded once the store issued one row earlier has read its buffer
// (wait_group.read 1), so a store's read overlaps the next row's wait.
template <int kStages>
__global__ void __launch_bounds__(32) TmaKernel(const uint8_t* pool, uint8_t* hot, const int32_t* rows,
                                                const int32_t* slots, int count,
                                                unsigned long long* stamps) {
  extern __shared__ __align__(128) uint8_t stage_bytes[];
  __shared__ __align__(8) uint64_t bars[kStages];
  if (threadIdx.x != 0) return;
  StampStart(stamps);
  const int first = blockIdx.x, step = gridDim.x;
  const int mine = first < count ? (count - first + step - 1) / step : 0;
  for (int s = 0; s < kStages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SharedAddress(&bars[s])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const uint32_t buf0 = SharedAddress(stage_bytes), bar0 = SharedAddress(bars);
  auto buf = [&](int k) { return buf0 + static_cast<uint32_t>((k % kStages) * kRecordBytes); };
  auto bar = [&](int k) { return bar0 + static_cast<uint32_t>((k % kStages) * 8); };
  auto src = [&](int k) { return pool + int64_t{rows[first + int64_t{k} * step]} * kRecordBytes; };
  for (int k = 0; k < mine && k < kStages; ++k) BulkLoadRow(buf(k), bar(k), src(k));
  for (int k = 0; k < mine; ++k) {
    if (!MbarrierWait(bar(k), (k / kStages) & 1)) break;  // rows left unstored fail the check
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the landed row, to the store's proxy
    uint8_t* dst = hot + int64_t{slots[first + int64_t{k} * step]} * kRecordBytes;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(buf(k)),
                 "r"(int{kRecordBytes})
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // Row k - 1's store has read its stage: refill that stage with row k - 1 + kStages.
    const int refill = k - 1 + kStages;
    if (k >= 1 && refill < mine) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      BulkLoadRow(buf(refill), bar(refill), src(refill));
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // stores done before the block's memory goes
  StampEnd(stamps);
}

// The cp.async fetch: 128-thread blocks; warp w of W copies the rows w, w + W, ...,
// their 16-byte vectors numbered flat and taken kVecs per lane a stage; a lane
// keeps kStages stages of cp.async (global -> shared, 16 bytes each) in flight,
// so the bytes in flight live in shared memory, not in registers. A lane reads
// back only the vectors it copied itself (after its own wait_group), so no
// barrier is needed between the copy and the store.
constexpr int kCpAsyncThreads = 128;

template <int kVecs, int kStages>
__global__ void __launch_bounds__(kCpAsyncThreads)
    CpAsyncKernel(const uint8_t* pool, uint8_t* hot, const int32_t* rows, const int32_t* slots, int count,
                  unsigned long long* stamps) {
  extern __shared__ __align__(16) int4 staged[];  // [kStages][kVecs][kCpAsyncThreads]
  StampStart(stamps);
  const int lane = threadIdx.x % 32;
  const int warp = blockIdx.x * (kCpAsyncThreads / 32) + threadIdx.x / 32;
  const int warps = gridDim.x * (kCpAsyncThreads / 32);
  const int64_t mine = warp < count ? (count - warp + warps - 1) / warps : 0;
  const int64_t total = mine * kVectors;
  const int64_t stages = (total + 32 * kVecs - 1) / (32 * kVecs);
  auto at = [&](int64_t s, int u) { return int64_t{s} * 32 * kVecs + u * 32 + lane; };  // flat vector index
  auto issue = [&](int64_t s) {
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t f = at(s, u);
      if (s < stages && f < total) {
        const int64_t m = warp + (f / kVectors) * int64_t{warps};
        const uint8_t* src = pool + int64_t{rows[m]} * kRecordBytes + (f % kVectors) * 16;
        const uint32_t dst = SharedAddress(&staged[((s % kStages) * kVecs + u) * kCpAsyncThreads + threadIdx.x]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty groups too: the count stays in step
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int64_t s = 0; s < stages; ++s) {
    issue(s + kStages - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");  // stage s has landed
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int64_t f = at(s, u);
      if (f < total) {
        const int64_t m = warp + (f / kVectors) * int64_t{warps};
        int4* dst = reinterpret_cast<int4*>(hot + int64_t{slots[m]} * kRecordBytes) + f % kVectors;
        __stcg(dst, staged[((s % kStages) * kVecs + u) * kCpAsyncThreads + threadIdx.x]);
      }
    }
  }
  __syncthreads();
  StampEnd(stamps);
}

// The HBM-bound neighbour: `passes` reads of n 16-byte vectors, kNeighbourUnroll
// independent loads per thread in flight, folded so nothing is dead code.
__global__ void __launch_bounds__(kNeighbourThreads)
    NeighbourRead(const uint4* __restrict__ p, int64_t n, int passes, uint32_t* sink,
                  unsigned long long* stamps) {
  StampStart(stamps);
  uint32_t acc = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += kNeighbourUnroll * stride) {
      uint4 v[kNeighbourUnroll];
#pragma unroll
      for (int u = 0; u < kNeighbourUnroll; ++u)
        v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kNeighbourUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never; keeps the loads
  __syncthreads();
  StampEnd(stamps);
}

// ---------------------------------------------------------------------------
// Variants.

enum class Kind { kGather, kCpAsync, kTma };

struct Variant {
  std::string name;
  Kind kind;
  int blocks;       // 0: kFetchBlocksPerSm x SMs
  int unroll;       // gather: vectors per lane in flight; cp.async: vectors per lane a stage
  int stages;       // tma: rows per block in flight; cp.async: stages per lane in flight
  int threads() const {
    return kind == Kind::kGather ? hisparse::kFetchThreads : kind == Kind::kCpAsync ? kCpAsyncThreads : 32;
  }
  int smem() const {
    if (kind == Kind::kTma) return stages * static_cast<int>(kRecordBytes);
    if (kind == Kind::kCpAsync) return stages * unroll * kCpAsyncThreads * 16;
    return 0;
  }
  // Bytes the variant can hold in flight from the host, by its design.
  int64_t in_flight_bytes(int grid) const {
    if (kind == Kind::kTma) return int64_t{grid} * stages * kRecordBytes;
    if (kind == Kind::kCpAsync) return int64_t{grid} * smem();
    const int rows = hisparse::RowBatch(kVectors, unroll);
    return int64_t{grid} * hisparse::kFetchWarps * rows * kRecordBytes;
  }
};

std::vector<Variant> AllVariants() {
  return {
      {"gather (prefetch)", Kind::kGather, 16, hisparse::kFetchCopyUnroll, 0},
      {"gather (split plan)", Kind::kGather, 0, hisparse::kFetchCopyUnroll, 0},
      {"gather unroll 16", Kind::kGather, 2, 16, 0},
      {"gather unroll 16", Kind::kGather, 4, 16, 0},
      {"gather unroll 16", Kind::kGather, 8, 16, 0},
      {"cp.async 8 x 4", Kind::kCpAsync, 2, 8, 4},
      {"cp.async 8 x 4", Kind::kCpAsync, 4, 8, 4},
      {"cp.async 8 x 4", Kind::kCpAsync, 8, 8, 4},
      {"cp.async 8 x 8", Kind::kCpAsync, 2, 8, 8},
      {"cp.async 8 x 8", Kind::kCpAsync, 4, 8, 8},
      {"tma 32 stages", Kind::kTma, 4, 0, 32},
      {"tma 32 stages", Kind::kTma, 16, 0, 32},
      {"tma 128 stages", Kind::kTma, 2, 0, 128},
      {"tma 128 stages", Kind::kTma, 4, 0, 128},
      {"tma 128 stages", Kind::kTma, 8, 0, 128},
      {"tma 128 stages", Kind::kTma, 16, 0, 128},
      // Spread over more SMs, fewer rows each: does the link's rate beside an HBM-bound neighbour
      // come back with more copy engines driving it (16 blocks moved 11-14 GB/s there)?
      {"tma 32 stages", Kind::kTma, 32, 0, 32},
      {"tma 32 stages", Kind::kTma, 64, 0, 32},
      {"tma 16 stages", Kind::kTma, 128, 0, 16},
  };
}

int GridOf(const Variant& v, int sms) { return v.blocks > 0 ? v.blocks : hisparse::kFetchBlocksPerSm * sms; }

void LaunchFetch(const Variant& v, int grid, const uint8_t* pool, uint8_t* hot, const int32_t* rows,
                 const int32_t* slots, int count, int pool_rows, unsigned long long* stamps, cudaStream_t stream) {
  if (v.kind == Kind::kGather) {
    const int t = hisparse::kFetchThreads;
    if (v.unroll == 8) GatherKernel<8><<<grid, t, 0, stream>>>(pool, hot, rows, slots, count, pool_rows, stamps);
    else GatherKernel<16><<<grid, t, 0, stream>>>(pool, hot, rows, slots, count, pool_rows, stamps);
  } else if (v.kind == Kind::kCpAsync) {
    if (v.stages == 4) CpAsyncKernel<8, 4><<<grid, kCpAsyncThreads, v.smem(), stream>>>(pool, hot, rows, slots, count, stamps);
    else CpAsyncKernel<8, 8><<<grid, kCpAsyncThreads, v.smem(), stream>>>(pool, hot, rows, slots, count, stamps);
  } else if (v.stages == 16) {  // each TmaKernel<S> rings over S stages: its smem() must match
    TmaKernel<16><<<grid, 32, v.smem(), stream>>>(pool, hot, rows, slots, count, stamps);
  } else if (v.stages == 32) {
    TmaKernel<32><<<grid, 32, v.smem(), stream>>>(pool, hot, rows, slots, count, stamps);
  } else if (v.stages == 128) {
    TmaKernel<128><<<grid, 32, v.smem(), stream>>>(pool, hot, rows, slots, count, stamps);
  } else {
    std::fprintf(stderr, "%s: no TMA kernel of %d stages\n", v.name.c_str(), v.stages);
    std::exit(2);
  }
  CUDA_OK(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// Host side.

// `count` distinct random rows of [0, pool_rows).
std::vector<int32_t> DistinctRows(std::mt19937_64& rng, int count, int64_t pool_rows) {
  std::unordered_set<int32_t> seen;
  std::vector<int32_t> rows;
  rows.reserve(count);
  std::uniform_int_distribution<int64_t> pick(0, pool_rows - 1);
  while (static_cast<int>(rows.size()) < count) {
    const int32_t r = static_cast<int32_t>(pick(rng));
    if (seen.insert(r).second) rows.push_back(r);
  }
  return rows;
}

float Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

double Median(std::vector<double> v) { return harness::Summarize(std::move(v)).median_us; }

struct Result {
  std::string variant;
  int blocks = 0, warps = 0, rows = 0, stages = 0, unroll = 0;
  int64_t in_flight = 0;
  bool ok = false;
  Stats alone;
  double gbs_min = 0, gbs_med = 0, gbs_max = 0, gbs_beside = 0;
  double neighbour_alone_us = 0, neighbour_beside_us = 0, fetch_beside_us = 0;
  double whole_ratio = 0, window_slowdown = 0, window_us = 0, start_offset_us = 0, covered = 0;
  int passes = 0;
};

// Everything one measurement uses: the pool, the hot buffer, the neighbour, the
// streams and the row sets of the current R.
struct Bench {
  int sms = 0, iters = 0;
  uint8_t* pool = nullptr;      // pinned, as the host reads it (the check)
  uint8_t* pool_dev = nullptr;  // the same memory, as the kernels address it
  int64_t pool_rows = 0;
  uint8_t* hot = nullptr;
  cudaStream_t ns = nullptr, fs = nullptr;  // the neighbour's, the fetch's (highest priority)
  const uint4* nbuf = nullptr;
  int64_t nvec = 0;
  uint32_t* sink = nullptr;
  unsigned long long* stamps = nullptr;  // device-clock spans: [0, 1] the neighbour's, [2, 3] the fetch's
  double pass_us = 0;                    // one neighbour pass alone
  // The current R: `sets` row sets of R rows and their hot slots, host and device.
  int R = 0, sets = 0;
  std::vector<int32_t> rows, slots;
  int32_t *rows_dev = nullptr, *slots_dev = nullptr;
  std::vector<uint8_t> got;

  void Neighbour(int passes, unsigned long long* span) const {
    NeighbourRead<<<kNeighbourBlocksPerSm * sms, kNeighbourThreads, 0, ns>>>(nbuf, nvec, passes, sink, span);
    CUDA_OK(cudaGetLastError());
  }
  void Fetch(const Variant& v, int set, cudaStream_t st, unsigned long long* span = nullptr) const {
    LaunchFetch(v, GridOf(v, sms), pool_dev, hot, rows_dev + size_t(set) * R, slots_dev + size_t(set) * R, R,
                static_cast<int>(pool_rows), span, st);
  }
  size_t Bytes() const { return size_t(R) * kRecordBytes; }

  // New row sets for R rows: enough sets that they do not fit 3 x L2 together.
  void NewRows(std::mt19937_64& rng, int rows_per_set, int64_t l2_bytes) {
    R = rows_per_set;
    sets = static_cast<int>(std::max<int64_t>(2, (3 * l2_bytes + Bytes() - 1) / Bytes()));
    rows.assign(size_t(sets) * R, 0);
    slots.assign(size_t(sets) * R, 0);
    for (int s = 0; s < sets; ++s) {
      const std::vector<int32_t> r = DistinctRows(rng, R, pool_rows);
      std::copy(r.begin(), r.end(), rows.begin() + size_t(s) * R);
      std::vector<int32_t> perm(R);
      for (int i = 0; i < R; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.end(), slots.begin() + size_t(s) * R);
    }
    CUDA_OK(cudaFree(rows_dev));
    CUDA_OK(cudaFree(slots_dev));
    CUDA_OK(cudaMalloc(&rows_dev, rows.size() * 4));
    CUDA_OK(cudaMalloc(&slots_dev, slots.size() * 4));
    CUDA_OK(cudaMemcpy(rows_dev, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(slots_dev, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
    got.resize(Bytes());
  }

  // Whether one call on the first and on the last set leaves, in the poisoned
  // hot buffer, exactly the pool's bytes of every row at its slot.
  bool Check(const Variant& v) {
    for (int set : {0, sets - 1}) {
      CUDA_OK(cudaMemsetAsync(hot, 0xA5, Bytes(), fs));
      Fetch(v, set, fs);
      CUDA_OK(cudaStreamSynchronize(fs));
      CUDA_OK(cudaMemcpy(got.data(), hot, Bytes(), cudaMemcpyDeviceToHost));
      for (int i = 0; i < R; ++i) {
        const int32_t row = rows[size_t(set) * R + i], slot = slots[size_t(set) * R + i];
        if (std::memcmp(got.data() + size_t(slot) * kRecordBytes, pool + size_t(row) * kRecordBytes,
                        kRecordBytes) != 0) {
          std::printf("FAIL %s, %d blocks, %d rows: set %d, row %d (pool row %d, slot %d) differs\n",
                      v.name.c_str(), GridOf(v, sms), R, set, i, row, slot);
          return false;
        }
      }
    }
    return true;
  }

  // The fetch alone: --iters calls after 3 warm-ups, behind one 20 ms spin.
  void TimeAlone(const Variant& v, Result& res) const {
    int calls = 0;  // successive calls, warm-ups included, take successive sets
    res.alone = harness::Summarize(
        harness::EventTimes(fs, iters, 3, 20'000'000, 0, [&](int) { Fetch(v, calls++ % sets, fs); }));
    res.gbs_min = Bytes() / (res.alone.max_us * 1e3);
    res.gbs_med = Bytes() / (res.alone.median_us * 1e3);
    res.gbs_max = Bytes() / (res.alone.min_us * 1e3);
  }

  // The neighbour alone, then beside the fetch, --iters times after one warm-up
  // (see the header for the figures).
  void TimeBeside(const Variant& v, Result& res) const {
    res.passes = std::max(1, static_cast<int>(std::ceil(1.5 * res.alone.median_us / pass_us)));
    cudaEvent_t n0, n1, f0, f1, go;
    for (cudaEvent_t* e : {&n0, &n1, &f0, &f1}) CUDA_OK(cudaEventCreate(e));
    CUDA_OK(cudaEventCreateWithFlags(&go, cudaEventDisableTiming));
    std::vector<double> t_alone, t_beside, t_fetch, window, offset, cover;
    for (int it = 0; it < iters + 1; ++it) {
      Spin<<<1, 1, 0, ns>>>(200'000);
      CUDA_OK(cudaEventRecord(n0, ns));
      Neighbour(res.passes, nullptr);
      CUDA_OK(cudaEventRecord(n1, ns));
      CUDA_OK(cudaStreamSynchronize(ns));
      const double alone_us = 1000.0 * Ms(n0, n1);
      // The neighbour, then the fetch beside it, both released by `go`.
      CUDA_OK(cudaMemsetAsync(stamps, 0xff, 4 * sizeof(unsigned long long), ns));  // starts: ~0
      CUDA_OK(cudaMemsetAsync(stamps + 1, 0, sizeof(unsigned long long), ns));      // ends: 0
      CUDA_OK(cudaMemsetAsync(stamps + 3, 0, sizeof(unsigned long long), ns));
      Spin<<<1, 1, 0, ns>>>(200'000);
      CUDA_OK(cudaEventRecord(go, ns));
      CUDA_OK(cudaStreamWaitEvent(fs, go, 0));
      CUDA_OK(cudaEventRecord(n0, ns));
      Neighbour(res.passes, stamps);
      CUDA_OK(cudaEventRecord(n1, ns));
      CUDA_OK(cudaEventRecord(f0, fs));
      Fetch(v, (it * 7 + 1) % sets, fs, stamps + 2);
      CUDA_OK(cudaEventRecord(f1, fs));
      CUDA_OK(cudaStreamSynchronize(fs));
      CUDA_OK(cudaStreamSynchronize(ns));
      if (it == 0) continue;  // warm-up
      unsigned long long span[4];
      CUDA_OK(cudaMemcpy(span, stamps, sizeof(span), cudaMemcpyDeviceToHost));
      // Microseconds on the device clock, from the neighbour's first block.
      const double s_n1 = (double(span[1]) - double(span[0])) * 1e-3;
      const double s_f0 = (double(span[2]) - double(span[0])) * 1e-3;
      const double s_f1 = (double(span[3]) - double(span[0])) * 1e-3;
      const double w = std::max(0.0, std::min(s_n1, s_f1) - std::max(0.0, s_f0));
      t_alone.push_back(alone_us);
      t_beside.push_back(1000.0 * Ms(n0, n1));
      t_fetch.push_back(1000.0 * Ms(f0, f1));
      window.push_back(w);
      offset.push_back(s_f0);
      cover.push_back(s_f1 > s_f0 ? w / (s_f1 - s_f0) : 0.0);
    }
    for (cudaEvent_t e : {n0, n1, f0, f1, go}) CUDA_OK(cudaEventDestroy(e));
    res.neighbour_alone_us = Median(t_alone);
    res.neighbour_beside_us = Median(t_beside);
    res.fetch_beside_us = Median(t_fetch);
    res.window_us = Median(window);
    res.start_offset_us = Median(offset);
    res.covered = Median(cover);
    res.gbs_beside = Bytes() / (res.fetch_beside_us * 1e3);
    res.whole_ratio = res.neighbour_beside_us / res.neighbour_alone_us;
    const double lost = res.neighbour_beside_us - res.neighbour_alone_us;
    res.window_slowdown = res.window_us > lost ? res.window_us / (res.window_us - lost) : INFINITY;
  }
};

void WriteJson(FILE* json, const harness::DeviceInfo& dev, double pool_gib, double h2d_gbs, const Bench& b,
               double neighbour_gib, const std::vector<Result>& results, bool all_ok) {
  std::fprintf(json, "{\n  \"device\": \"%s\",\n  \"record_bytes\": %lld,\n  \"pool_gib\": %.3f,\n",
               harness::DeviceLine(dev).c_str(), (long long)kRecordBytes, pool_gib);
  std::fprintf(json, "  \"h2d_memcpy_gbs\": %.2f,\n  \"neighbour\": {\"blocks\": %d, \"threads\": %d, "
               "\"gib\": %.3f, \"pass_us\": %.2f},\n  \"iters\": %d,\n  \"results\": [\n",
               h2d_gbs, kNeighbourBlocksPerSm * b.sms, kNeighbourThreads, neighbour_gib, b.pass_us, b.iters);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(json,
                 "    {\"variant\": \"%s\", \"blocks\": %d, \"warps\": %d, \"unroll\": %d, \"stages\": %d, "
                 "\"in_flight_bytes\": %lld, \"rows\": %d, \"ok\": %s, \"us_alone\": [%.2f, %.2f, %.2f], "
                 "\"gbs_alone\": [%.2f, %.2f, %.2f], \"us_beside\": %.2f, \"gbs_beside\": %.2f, "
                 "\"neighbour_passes\": %d, \"neighbour_alone_us\": %.2f, \"neighbour_beside_us\": %.2f, "
                 "\"neighbour_slowdown_whole\": %.4f, \"neighbour_slowdown_window\": %.4f, \"window_us\": %.2f, "
                 "\"fetch_start_offset_us\": %.2f, \"covered\": %.3f}%s\n",
                 r.variant.c_str(), r.blocks, r.warps, r.unroll, r.stages, (long long)r.in_flight, r.rows,
                 r.ok ? "true" : "false", r.alone.min_us, r.alone.median_us, r.alone.max_us, r.gbs_min, r.gbs_med,
                 r.gbs_max, r.fetch_beside_us, r.gbs_beside, r.passes, r.neighbour_alone_us,
                 r.neighbour_beside_us, r.whole_ratio, std::isfinite(r.window_slowdown) ? r.window_slowdown : -1.0,
                 r.window_us, r.start_offset_us, r.covered, i + 1 < results.size() ? "," : "");
  }
  std::fprintf(json, "  ],\n  \"all_ok\": %s\n}\n", all_ok ? "true" : "false");
}

const char* kUsage =
    "usage: %s OUT.json [--rows N,N,...] [--only SUBSTRING,...] [--pool-gib G] [--neighbour-gib G] [--iters N] "
    "[--seed N]\n";

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> v;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    v.push_back(s.substr(start, comma - start));
  v.push_back(s.substr(start));
  return v;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (!comma) break;
    p = comma + 1;
  }
  return v;
}

// Pins a pool of `gib` GiB (whole records), mapped; null when cudaHostAlloc fails.
uint8_t* PinPool(double gib) {
  const size_t bytes = static_cast<size_t>(static_cast<int64_t>(gib * (1ull << 30)) / kRecordBytes) * kRecordBytes;
  uint8_t* pool = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&pool), bytes, cudaHostAllocMapped | cudaHostAllocPortable) ==
      cudaSuccess)
    return pool;
  (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
  return nullptr;
}

}  // namespace

// Long: the flags, then the setup and the sweep read top to bottom in one place.
int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  const char* out_path = argv[1];
  std::vector<int> row_counts = {2048, 8192, 32768};
  double pool_gib = 6.75, neighbour_gib = 2.0;
  bool pool_gib_given = false;
  std::vector<std::string> only;  // --only: variants whose name holds one of these
  int iters = 20;
  uint64_t seed = 23;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) row_counts = ParseList(argv[++i]);
    else if (a == "--pool-gib" && i + 1 < argc) pool_gib = std::atof(argv[++i]), pool_gib_given = true;
    else if (a == "--only" && i + 1 < argc) only = SplitList(argv[++i]);
    else if (a == "--neighbour-gib" && i + 1 < argc) neighbour_gib = std::atof(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::max(3, std::atoi(argv[++i]));
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, kUsage, argv[0]);
      return 2;
    }
  }
  for (int r : row_counts) {
    if (r < 1) {
      std::fprintf(stderr, "--rows: every count must be >= 1, got %d\n", r);
      return 2;
    }
  }
  if (!(pool_gib > 0) || !(neighbour_gib > 0)) {
    std::fprintf(stderr, "--pool-gib and --neighbour-gib must be > 0\n");
    return 2;
  }
  FILE* json = harness::OpenJson(out_path);
  const harness::DeviceInfo dev = harness::QueryDevice();
  Bench b;
  b.sms = dev.prop.multiProcessorCount;
  b.iters = iters;
  std::printf("# Miss fetch footprint: %s\n\n", harness::DeviceLine(dev).c_str());

  // --- the pinned pool ------------------------------------------------------
  const int max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  b.pool = PinPool(pool_gib);
  if (b.pool == nullptr && !pool_gib_given) {
    b.pool = PinPool(4.0);
    if (b.pool != nullptr) std::printf("cannot pin %.2f GiB (cudaHostAlloc failed): using a 4 GiB pool\n", pool_gib);
    pool_gib = 4.0;
  }
  if (b.pool == nullptr) {
    std::fprintf(stderr, "cannot pin a %.2f GiB pool (cudaHostAlloc failed): try a smaller --pool-gib\n", pool_gib);
    return 2;
  }
  b.pool_rows = static_cast<int64_t>(pool_gib * (1ull << 30)) / kRecordBytes;
  const size_t pool_bytes = static_cast<size_t>(b.pool_rows) * kRecordBytes;
  if (b.pool_rows < 4 * int64_t{max_rows} || b.pool_rows > INT32_MAX) {
    std::fprintf(stderr, "--pool-gib %.2f holds %lld rows: need 4 x the largest --rows and < 2^31\n", pool_gib,
                 (long long)b.pool_rows);
    return 2;
  }
  CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&b.pool_dev), b.pool, 0));
  int lo_prio = 0, hi_prio = 0;
  CUDA_OK(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
  CUDA_OK(cudaStreamCreateWithFlags(&b.ns, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithPriority(&b.fs, cudaStreamNonBlocking, hi_prio));  // as the prefetch's stream
  FillPool<<<4 * b.sms, 256, 0, b.fs>>>(reinterpret_cast<uint64_t*>(b.pool_dev),
                                        static_cast<int64_t>(pool_bytes / 8), seed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(b.fs));

  // --- the ceiling ----------------------------------------------------------
  const size_t h2d_bytes = size_t{256} << 20;
  CUDA_OK(cudaMalloc(&b.hot, std::max(h2d_bytes, size_t(max_rows) * kRecordBytes)));  // also the memcpy's target
  const Stats h2d = harness::TimeLaunches(b.fs, 10, [&](int) {
    CUDA_OK(cudaMemcpyAsync(b.hot, b.pool, h2d_bytes, cudaMemcpyHostToDevice, b.fs));
  });
  const double h2d_gbs = h2d_bytes / (h2d.median_us * 1e3);
  std::printf("pool: %.2f GiB pinned (%lld rows of %lld B); ceiling: cudaMemcpy H2D 256 MiB pinned %.1f GB/s\n",
              pool_bytes / double(1ull << 30), (long long)b.pool_rows, (long long)kRecordBytes, h2d_gbs);

  // --- the neighbour --------------------------------------------------------
  b.nvec = static_cast<int64_t>(neighbour_gib * (1ull << 30)) / 16;
  uint4* nbuf = nullptr;
  CUDA_OK(cudaMalloc(&nbuf, b.nvec * 16));
  CUDA_OK(cudaMemset(nbuf, 0x3c, b.nvec * 16));
  b.nbuf = nbuf;
  CUDA_OK(cudaMalloc(&b.sink, 4));
  CUDA_OK(cudaMalloc(&b.stamps, 4 * sizeof(unsigned long long)));
  // The neighbour uses no shared memory; left to itself the driver may give its
  // SMs a carveout with little shared memory, and an SM only changes carveout
  // when idle, so the TMA and cp.async blocks (up to 144 KiB) would wait for
  // the neighbour to end. Shared memory first keeps room for them beside it.
  CUDA_OK(cudaFuncSetAttribute(NeighbourRead, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared));
  CUDA_OK(cudaFuncSetAttribute(TmaKernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * kRecordBytes));
  CUDA_OK(cudaFuncSetAttribute(TmaKernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, 32 * kRecordBytes));
  CUDA_OK(cudaFuncSetAttribute(TmaKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 * kRecordBytes));
  CUDA_OK(cudaFuncSetAttribute(CpAsyncKernel<8, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               4 * 8 * kCpAsyncThreads * 16));
  CUDA_OK(cudaFuncSetAttribute(CpAsyncKernel<8, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               8 * 8 * kCpAsyncThreads * 16));
  b.pass_us = harness::TimeLaunches(b.ns, 10, [&](int) { b.Neighbour(1, nullptr); }).median_us;
  std::printf("neighbour: %d x %d threads reading %.2f GiB: %.1f us a pass, %.0f GB/s alone\n\n",
              kNeighbourBlocksPerSm * b.sms, kNeighbourThreads, neighbour_gib, b.pass_us,
              b.nvec * 16.0 / (b.pass_us * 1e3));

  // --- the sweep ------------------------------------------------------------
  std::printf("| variant | blocks | warps | in flight KiB | rows | GB/s alone min / med / max | GB/s beside | "
              "neighbour x whole | neighbour x window | covered | fetch start us |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  std::vector<Result> results;
  bool all_ok = true;
  for (const int R : row_counts) {
    b.NewRows(rng, R, dev.prop.l2CacheSize);
    for (const Variant& v : AllVariants()) {
      if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& o) {
            return v.name.find(o) != std::string::npos;
          }))
        continue;
      Result res;
      const int grid = GridOf(v, b.sms);
      res.variant = v.name;
      res.blocks = grid;
      res.warps = grid * v.threads() / 32;
      res.rows = R;
      res.stages = v.stages;
      res.unroll = v.unroll;
      res.in_flight = v.in_flight_bytes(grid);
      res.ok = b.Check(v);
      if (res.ok) {
        b.TimeAlone(v, res);
        b.TimeBeside(v, res);
        std::printf("| %s | %d | %d | %.0f | %d | %.1f / %.1f / %.1f | %.1f | %.3f | %.3f | %.2f | %.1f |\n",
                    v.name.c_str(), grid, res.warps, res.in_flight / 1024.0, R, res.gbs_min, res.gbs_med,
                    res.gbs_max, res.gbs_beside, res.whole_ratio, res.window_slowdown, res.covered,
                    res.start_offset_us);
        std::fflush(stdout);
      }
      all_ok = all_ok && res.ok;
      results.push_back(res);
    }
  }

  WriteJson(json, dev, pool_bytes / double(1ull << 30), h2d_gbs, b, neighbour_gib, results, all_ok);
  std::fclose(json);
  std::printf("\nJSON: %s\n", out_path);
  CUDA_OK(cudaFree(b.rows_dev));
  CUDA_OK(cudaFree(b.slots_dev));
  CUDA_OK(cudaFree(nbuf));
  CUDA_OK(cudaFree(b.sink));
  CUDA_OK(cudaFree(b.stamps));
  CUDA_OK(cudaFree(b.hot));
  CUDA_OK(cudaFreeHost(b.pool));
  if (!all_ok) std::printf("some configuration FAILED its check\n");
  return all_ok ? 0 : 1;
}

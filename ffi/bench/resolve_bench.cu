// RESOLVE on the GPU, against the ceilings of the host link measured in the
// same run (docs/benchmarks.md).
//
// Ceilings: cudaMemcpy H2D of 1 GiB from pinned memory; D2D of 1 GiB (HBM);
// and, per configuration, a zero-copy gather of exactly the rows that
// configuration misses (same rows, same row size) by a plain warp-per-row
// kernel spread over many blocks.
// Configurations: k = 2048; B in {2048, 4096, 8192}; record 1152 B and 656 B;
// streams (batch x layers per call) in {1, 8, 64, 256}; miss rate in
// {0, 0.1%, 13%, 30%, 100%}. Before every timed call slot_record and lru are
// restored from pristine copies (outside the timed region), so exactly
// round(rate x k) of the k distinct selected ids miss in every stream; the
// cache is full (B records resident, the rest of them unselected). Pool:
// R = 16384 random non-zero records per stream, pinned. Each call is timed
// with CUDA events around the RESOLVE launches only; the median of --reps
// (default 60) calls after warm-up is reported, for the fused plan, the split
// plan and the no-IO call (fetch = false). Each timed call is queued behind a
// ~50 us spin kernel, so the host has enqueued the events and the launch
// before the GPU reaches them: the time is what the GPU spends, as in a
// jitted decode where the host runs ahead, not the host's launch latency.
// --host-bound drops the spin (then the host's launch cost is included).
// A second table sweeps the stream count at B = 4096, 1152 B, 13% to place
// the auto plan's threshold (kAutoSplitBelowStreams in ffi/resolve_cuda.h).
// --groups times only a layer's RESOLVE under G overlap groups
// (hisparse_jax/kit/overlap.py, G = 1, 2, 4): G calls, each over its group's
// streams by its stream range (resolve.h), against G whole-batch calls whose
// selections are -1 outside the group (the overlap groups before the range);
// without IO, and with the prefetch's copy (the fetch kernel with its 16
// blocks) after each call, on one stream. Defaults: S in {16, 64}, B = 4096,
// W = 1152, 13% misses (the lists below replace them).
//   build/resolve_bench results/groups.json --groups
//
// Build (repository root):
//   make -C ffi/bench resolve
// Run (about 1-2 minutes on an H200; prints Markdown, writes JSON):
//   mkdir -p results && build/resolve_bench results/resolve_bench.json
//   build/resolve_bench results/quick.json --quick     # a handful of configurations
// Subsets (comma-separated lists replace the defaults; --no-io times only the
// no-IO call and skips the link ceilings and the auto-threshold sweep):
//   build/resolve_bench results/no_io.json --no-io --hot-slots 2048,4096,8192 \
//       --streams 1,8,64,256 --miss 0,0.13 --record-bytes 1152
// A/B of the resolve block size: build with
//   make -C ffi/bench resolve -B EXTRA=-DHISPARSE_RESOLVE_SMALL_BLOCK_MAX_SLOTS=0
// for 1024-thread blocks everywhere (the default uses 512-thread blocks when
// streams > SMs and B <= 4096; the header line says which), or with
//   make -C ffi/bench resolve -B EXTRA=-DHISPARSE_RESOLVE_SMALL_BLOCKS_FROM_STREAMS=1
// for 512-thread blocks at every stream count up to B = 4096 (the header line
// does not know: it names the default).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "resolve.h"
#include "resolve_cuda.h"
#include "resolve_phase_clock.h"
#include "tests/harness.h"

namespace {

using harness::Spin;

using hisparse::ResolveBuffers;
using hisparse::ResolveDims;
using hisparse::ResolveLaunchPlan;

constexpr int64_t kTopK = 2048;
constexpr int64_t kPoolRecords = 16384;
constexpr int64_t kMaxPinnedBytes = int64_t{10} << 30;

std::string Num(double v, const char* fmt = "%.1f");

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------------------
// Kernels of the benchmark itself.

bool g_host_bound = false;  // --host-bound: no spin before timed calls
bool g_floor = false;       // --floor: also time an empty kernel of the resolve launch's shape
bool g_phases = false;      // --phases: phase stamps of one call (a -DHISPARSE_RESOLVE_PHASE_CLOCK build)
bool g_groups = false;      // --groups: only the overlap groups' table

void HoldGpu(cudaStream_t stream) {
  if (!g_host_bound) Spin<<<1, 1, 0, stream>>>(50000);
}

__global__ void FillNonZero(uint64_t* p, int64_t words, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = (i + seed) * 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    p[i] = (z ^ (z >> 31)) | 0x0101010101010101ull;  // no zero byte
  }
}

// The launch floor: a kernel that does nothing, launched like the resolve
// kernel (same grid, block and dynamic shared memory), timed the same way.
__global__ void EmptyKernel() {}
// The same for the cluster launch (two blocks per stream, resolve_cuda.h).
__global__ void __cluster_dims__(hisparse::kResolveClusterSize, 1, 1) EmptyClusterKernel() {}

// The zero-copy ceiling: one warp per row, 16 B per lane, loads before stores.
__global__ void __launch_bounds__(256) GatherRows(const uint8_t* __restrict__ pool,
                                                  uint8_t* __restrict__ hot,
                                                  const int64_t* __restrict__ src,
                                                  const int64_t* __restrict__ dst, int64_t rows,
                                                  int vectors) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int4* s = reinterpret_cast<const int4*>(pool + src[row]);
  int4* d = reinterpret_cast<int4*>(hot + dst[row]);
  for (int base = 0; base < vectors; base += 4 * 32) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * 32 + lane;
      if (i < vectors) v[u] = __ldg(s + i);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = base + u * 32 + lane;
      if (i < vectors) d[i] = v[u];
    }
  }
}

// ---------------------------------------------------------------------------
// Timing helpers.

struct Events {
  std::vector<cudaEvent_t> start, stop;
  explicit Events(int n) : start(n), stop(n) {
    for (int i = 0; i < n; ++i) {
      CUDA_OK(cudaEventCreate(&start[i]));
      CUDA_OK(cudaEventCreate(&stop[i]));
    }
  }
  ~Events() {
    for (size_t i = 0; i < start.size(); ++i) {
      cudaEventDestroy(start[i]);
      cudaEventDestroy(stop[i]);
    }
  }
  // Median of the per-rep elapsed times, in microseconds; their min and max
  // are kept in min_us and max_us (the spread of one configuration).
  double MedianMicros(int reps) {
    std::vector<double> us(reps);
    for (int i = 0; i < reps; ++i) {
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, start[i], stop[i]));
      us[i] = 1000.0 * ms;
    }
    min_us = *std::min_element(us.begin(), us.end());
    max_us = *std::max_element(us.begin(), us.end());
    return Median(us);
  }
  double min_us = NAN, max_us = NAN;
};

// ---------------------------------------------------------------------------
// Buffers shared by every configuration (sized for the largest).

struct Buffers {
  uint8_t* pool = nullptr;  // pinned [S, R, W], one layer
  size_t pool_bytes = 0;
  uint8_t* hot = nullptr;   // [S, B, W]
  int32_t *slot_record = nullptr, *lru = nullptr;                 // [S, B] working copies
  int32_t *pristine_record = nullptr, *pristine_lru = nullptr;    // [S, B]
  int32_t *selection = nullptr, *sealed = nullptr, *layer = nullptr;
  int32_t *slots = nullptr, *miss_records = nullptr, *miss_slots = nullptr;
  int32_t *misses = nullptr, *invalid = nullptr, *malformed = nullptr;
  int64_t *gather_src = nullptr, *gather_dst = nullptr;  // [S * k]
};

struct Config {
  int64_t hot_slots, record_bytes, streams;
  double miss_rate;
};

struct Result {
  Config config;
  int64_t misses_per_stream = 0;
  bool misses_exact = true;
  double us_fused = NAN, us_split = NAN, us_no_io = NAN;
  double us_no_io_min = NAN, us_no_io_max = NAN;  // spread of the no-IO reps
  double ceiling_gbps = NAN;
  double us_floor = NAN, us_floor_no_smem = NAN;  // --floor: empty kernels, median us
  double us_floor_cluster = NAN;                  // --floor: the same, two blocks per stream
  std::string phases;                             // --phases: one Markdown row
  ResolveLaunchPlan auto_plan = ResolveLaunchPlan::kAuto;
  int64_t rows() const { return misses_per_stream * config.streams; }
  double Gbps(double us) const {
    return rows() > 0 ? rows() * double(config.record_bytes) / (us * 1e3) : NAN;
  }
  double us_auto() const { return auto_plan == ResolveLaunchPlan::kSplit ? us_split : us_fused; }
};

// Host-side state of one configuration: every stream selects k distinct ids
// in random order; the first (k - misses) of them are resident, and the rest
// of the B slots hold unselected records, so the cache is full.
void BuildState(const Config& c, int64_t misses, std::mt19937_64& rng,
                std::vector<int32_t>& selection, std::vector<int32_t>& slot_record,
                std::vector<int32_t>& lru) {
  const int64_t S = c.streams, B = c.hot_slots, k = kTopK, R = kPoolRecords;
  selection.resize(S * k);
  slot_record.resize(S * B);
  lru.resize(S * B);
  std::vector<int32_t> ids(R), slots(B);
  for (int64_t s = 0; s < S; ++s) {
    std::iota(ids.begin(), ids.end(), 0);
    const int64_t need = k + (B - (k - misses));  // selected + unselected residents
    for (int64_t i = 0; i < need; ++i) {
      std::swap(ids[i], ids[std::uniform_int_distribution<int64_t>(i, R - 1)(rng)]);
    }
    std::copy(ids.begin(), ids.begin() + k, selection.begin() + s * k);
    // Residents: selected ids [0, k - misses) and unselected ids [k, need).
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    int64_t b = 0;
    for (int64_t i = 0; i < k - misses; ++i) slot_record[s * B + slots[b++]] = ids[i];
    for (int64_t i = k; i < need; ++i) slot_record[s * B + slots[b++]] = ids[i];
    std::shuffle(slots.begin(), slots.end(), rng);
    std::copy(slots.begin(), slots.end(), lru.begin() + s * B);
  }
}

ResolveBuffers Io(const Buffers& b) {
  return ResolveBuffers{b.pool,        b.selection,    b.sealed,     b.hot,
                        b.slot_record, b.lru,          b.slots,      b.miss_records,
                        b.miss_slots,  b.misses,       b.invalid,    b.malformed};
}

void Restore(const Buffers& b, const Config& c, cudaStream_t stream) {
  const size_t bytes = c.streams * c.hot_slots * sizeof(int32_t);
  CUDA_OK(cudaMemcpyAsync(b.slot_record, b.pristine_record, bytes, cudaMemcpyDeviceToDevice, stream));
  CUDA_OK(cudaMemcpyAsync(b.lru, b.pristine_lru, bytes, cudaMemcpyDeviceToDevice, stream));
}

// Median time of one RESOLVE call (restored state before each), microseconds.
double TimeResolve(const Buffers& b, const Config& c, ResolveLaunchPlan plan, bool fetch,
                   int reps, Events& ev, cudaStream_t stream) {
  const ResolveDims dims{1, c.streams, kTopK, c.hot_slots, kPoolRecords, c.record_bytes};
  const ResolveBuffers io = Io(b);
  for (int i = 0; i < 3; ++i) {  // warm-up
    Restore(b, c, stream);
    CUDA_OK(hisparse::LaunchResolve(dims, hisparse::AllStreams(dims), b.layer, io, fetch, plan, stream));
  }
  for (int i = 0; i < reps; ++i) {
    Restore(b, c, stream);
    HoldGpu(stream);
    CUDA_OK(cudaEventRecord(ev.start[i], stream));
    CUDA_OK(hisparse::LaunchResolve(dims, hisparse::AllStreams(dims), b.layer, io, fetch, plan, stream));
    CUDA_OK(cudaEventRecord(ev.stop[i], stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  return ev.MedianMicros(reps);
}

// The zero-copy ceiling for this configuration's rows, GB/s.
double TimeCeiling(const Buffers& b, const Config& c, int64_t rows, int reps, Events& ev,
                   cudaStream_t stream) {
  if (rows == 0) return NAN;
  const int vectors = static_cast<int>(c.record_bytes / 16);
  const unsigned grid = static_cast<unsigned>((rows + 7) / 8);
  for (int i = 0; i < 3; ++i)
    GatherRows<<<grid, 256, 0, stream>>>(b.pool, b.hot, b.gather_src, b.gather_dst, rows, vectors);
  CUDA_OK(cudaGetLastError());
  for (int i = 0; i < reps; ++i) {
    HoldGpu(stream);
    CUDA_OK(cudaEventRecord(ev.start[i], stream));
    GatherRows<<<grid, 256, 0, stream>>>(b.pool, b.hot, b.gather_src, b.gather_dst, rows, vectors);
    CUDA_OK(cudaEventRecord(ev.stop[i], stream));
  }
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(stream));
  const double us = ev.MedianMicros(reps);
  return rows * double(c.record_bytes) / (us * 1e3);
}

// Median us of an empty kernel with the resolve launch's grid and block, with
// `shared_bytes` of dynamic shared memory.
double TimeFloor(const Config& c, int64_t shared_bytes, int reps, Events& ev, cudaStream_t stream,
                 bool cluster = false) {
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const bool small = c.streams > sms && c.hot_slots <= hisparse::kResolveSmallBlockMaxSlots;
  const int threads = small ? hisparse::kResolveThreadsSmall : hisparse::kResolveThreads;
  CUDA_OK(cudaFuncSetAttribute(EmptyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(hisparse::kMaxResolveSharedBytes)));
  CUDA_OK(cudaFuncSetAttribute(EmptyClusterKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(hisparse::kMaxResolveSharedBytes)));
  const unsigned grid = static_cast<unsigned>(c.streams);
  const size_t smem = static_cast<size_t>(shared_bytes);
  auto launch = [&] {
    if (cluster) {
      EmptyClusterKernel<<<grid * hisparse::kResolveClusterSize, hisparse::kResolveThreads, smem,
                           stream>>>();
    } else {
      EmptyKernel<<<grid, threads, smem, stream>>>();
    }
  };
  for (int i = 0; i < 3; ++i) launch();
  for (int i = 0; i < reps; ++i) {
    HoldGpu(stream);
    CUDA_OK(cudaEventRecord(ev.start[i], stream));
    launch();
    CUDA_OK(cudaEventRecord(ev.stop[i], stream));
  }
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(stream));
  return ev.MedianMicros(reps);
}

// One untimed no-IO call behind the spin, then the median over streams of
// each phase of the resolve kernel (resolve_phase_clock.h) as a Markdown row:
// cycles from the previous mark reached, the block's total in cycles and ns,
// and the span from the first block's entry to the last block's exit in ns.
std::string PhaseRow(const Buffers& b, const Config& c, cudaStream_t stream) {
#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
  using namespace hisparse;
  const int64_t S = std::min<int64_t>(c.streams, kPhaseClockStreams);
  std::vector<uint64_t> st(S * kStampsPerStream);
  CUDA_OK(ReadResolvePhaseClock(st.data(), static_cast<int>(S)));  // clears them
  const ResolveDims dims{1, c.streams, kTopK, c.hot_slots, kPoolRecords, c.record_bytes};
  Restore(b, c, stream);
  HoldGpu(stream);
  CUDA_OK(hisparse::LaunchResolve(dims, hisparse::AllStreams(dims), b.layer, Io(b), false, ResolveLaunchPlan::kFused, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(ReadResolvePhaseClock(st.data(), static_cast<int>(S)));
  std::vector<std::vector<double>> delta(kMarkCount);
  std::vector<double> total_ns;
  uint64_t first = UINT64_MAX, last = 0;
  for (int64_t s = 0; s < S; ++s) {
    const uint64_t* t = st.data() + s * kStampsPerStream;
    uint64_t prev = t[kMarkEntry];
    for (int m = 1; m < kMarkCount; ++m) {
      if (t[m] == 0) continue;
      delta[m].push_back(double(t[m] - prev));
      prev = t[m];
    }
    delta[0].push_back(double(t[kMarkExit] - t[kMarkEntry]));
    total_ns.push_back(double(t[kStampExitNs] - t[kStampEntryNs]));
    first = std::min(first, t[kStampEntryNs]);
    last = std::max(last, t[kStampExitNs]);
  }
  std::string row = "| " + std::to_string(c.hot_slots) + " | " + std::to_string(c.streams) + " | " +
                    Num(100 * c.miss_rate, "%.3g") + "% |";
  for (int m = 1; m < kMarkCount; ++m) row += " " + Num(Median(delta[m]), "%.0f") + " |";
  row += " " + Num(Median(delta[0]), "%.0f") + " | " + Num(Median(total_ns), "%.0f") + " | " +
         Num(double(last - first), "%.0f") + " |";
  return row;
#else
  (void)b, (void)c, (void)stream;
  return "";
#endif
}

// no_io: time only the no-IO call (fused/split/ceiling stay NaN).
Result RunConfig(const Buffers& b, const Config& c, int reps, Events& ev, std::mt19937_64& rng,
                 cudaStream_t stream, bool no_io = false) {
  Result r;
  r.config = c;
  const int64_t S = c.streams, k = kTopK, B = c.hot_slots, W = c.record_bytes;
  r.misses_per_stream = std::llround(c.miss_rate * k);
  std::vector<int32_t> selection, slot_record, lru;
  BuildState(c, r.misses_per_stream, rng, selection, slot_record, lru);
  CUDA_OK(cudaMemcpy(b.selection, selection.data(), S * k * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b.pristine_record, slot_record.data(), S * B * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b.pristine_lru, lru.data(), S * B * 4, cudaMemcpyHostToDevice));
  // cudaMemcpy from pageable memory may return before its DMA lands, and `stream` does not
  // wait for the legacy stream: without this, Restore could copy a stale pristine state.
  CUDA_OK(cudaDeviceSynchronize());

  // One untimed call: check the miss count and take the miss plan for the ceiling.
  const ResolveDims dims{1, S, k, B, kPoolRecords, W};
  Restore(b, c, stream);
  CUDA_OK(hisparse::LaunchResolve(dims, hisparse::AllStreams(dims), b.layer, Io(b), !no_io, ResolveLaunchPlan::kSplit, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<int32_t> misses(S), miss_records(S * k), miss_slots(S * k);
  CUDA_OK(cudaMemcpy(misses.data(), b.misses, S * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(miss_records.data(), b.miss_records, S * k * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(miss_slots.data(), b.miss_slots, S * k * 4, cudaMemcpyDeviceToHost));
  std::vector<int64_t> src, dst;
  for (int64_t s = 0; s < S; ++s) {
    if (misses[s] != r.misses_per_stream) r.misses_exact = false;
    for (int64_t m = 0; m < misses[s]; ++m) {
      src.push_back(((s * kPoolRecords) + miss_records[s * k + m]) * W);
      dst.push_back(((s * B) + miss_slots[s * k + m]) * W);
    }
  }
  r.auto_plan = hisparse::ChooseResolvePlan(ResolveLaunchPlan::kAuto, S);
  if (no_io) {
    r.us_no_io = TimeResolve(b, c, ResolveLaunchPlan::kFused, false, reps, ev, stream);
    r.us_no_io_min = ev.min_us;
    r.us_no_io_max = ev.max_us;
    if (g_floor) {
      r.us_floor = TimeFloor(c, hisparse::ResolveSharedBytes(k, B), reps, ev, stream);
      r.us_floor_no_smem = TimeFloor(c, 0, reps, ev, stream);
      r.us_floor_cluster = TimeFloor(c, hisparse::ResolveSharedBytes(k, B), reps, ev, stream, true);
    }
    if (g_phases) r.phases = PhaseRow(b, c, stream);
    return r;
  }
  if (!src.empty()) {
    CUDA_OK(cudaMemcpy(b.gather_src, src.data(), src.size() * 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(b.gather_dst, dst.data(), dst.size() * 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());  // as after the state uploads: `stream` does not wait
  }
  r.ceiling_gbps = TimeCeiling(b, c, static_cast<int64_t>(src.size()), reps, ev, stream);
  r.us_fused = TimeResolve(b, c, ResolveLaunchPlan::kFused, true, reps, ev, stream);
  r.us_split = TimeResolve(b, c, ResolveLaunchPlan::kSplit, true, reps, ev, stream);
  r.us_no_io = TimeResolve(b, c, ResolveLaunchPlan::kFused, false, reps, ev, stream);
  r.us_no_io_min = ev.min_us;
  r.us_no_io_max = ev.max_us;
  return r;
}

// ---------------------------------------------------------------------------
// Overlap groups (--groups).

// The prefetch's fetch blocks (prefetch_cuda.h kPrefetchFetchBlocks; its code is not linked here).
constexpr int64_t kPrefetchBlocks = 16;

struct GroupRow {
  Config config;
  int groups = 1;
  double us_range_no_io = NAN, us_padded_no_io = NAN;  // a layer's G calls, no IO
  double us_range_copy = NAN, us_padded_copy = NAN;    // the same, each followed by its copy
};

// Median us of a layer's G calls (restored state before each layer): by stream range
// (`ranged`) or on `padded` (G selections [S, k], -1 outside group g); `copy`: each call's
// copy after it with the prefetch's blocks (resolve_handlers_cuda.cc's fork, on one stream).
double TimeGroups(const Buffers& b, const Config& c, int groups, bool ranged, bool copy,
                  const int32_t* padded, int reps, Events& ev, cudaStream_t stream) {
  const ResolveDims dims{1, c.streams, kTopK, c.hot_slots, kPoolRecords, c.record_bytes};
  const int64_t share = c.streams / groups;
  auto layer = [&] {
    for (int g = 0; g < groups; ++g) {
      ResolveBuffers io = Io(b);
      hisparse::StreamRange range = hisparse::AllStreams(dims);
      if (ranged) {
        range = {g * share, share};
      } else {
        io.selection = padded + g * c.streams * kTopK;
      }
      CUDA_OK(hisparse::LaunchResolve(dims, range, b.layer, io, false, ResolveLaunchPlan::kFused, stream));
      if (copy) CUDA_OK(hisparse::LaunchResolveFetch(dims, range, b.layer, io, kPrefetchBlocks, stream));
    }
  };
  for (int i = 0; i < 3; ++i) {  // warm-up
    Restore(b, c, stream);
    layer();
  }
  for (int i = 0; i < reps; ++i) {
    Restore(b, c, stream);
    HoldGpu(stream);
    CUDA_OK(cudaEventRecord(ev.start[i], stream));
    layer();
    CUDA_OK(cudaEventRecord(ev.stop[i], stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  return ev.MedianMicros(reps);
}

std::vector<GroupRow> RunGroups(const Buffers& b, const Config& c, int reps, Events& ev,
                                std::mt19937_64& rng, cudaStream_t stream) {
  const int64_t S = c.streams, k = kTopK, B = c.hot_slots;
  std::vector<int32_t> selection, slot_record, lru;
  BuildState(c, std::llround(c.miss_rate * k), rng, selection, slot_record, lru);
  CUDA_OK(cudaMemcpy(b.selection, selection.data(), S * k * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b.pristine_record, slot_record.data(), S * B * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b.pristine_lru, lru.data(), S * B * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());  // `stream` does not wait for the legacy stream
  std::vector<GroupRow> rows;
  for (int G : {1, 2, 4}) {
    if (S % G != 0) continue;
    std::vector<int32_t> padded(G * S * k, -1);
    for (int g = 0; g < G; ++g)
      for (int64_t s = g * (S / G); s < (g + 1) * (S / G); ++s)
        std::copy(selection.begin() + s * k, selection.begin() + (s + 1) * k, padded.begin() + (g * S + s) * k);
    int32_t* dev = nullptr;
    CUDA_OK(cudaMalloc(&dev, padded.size() * 4));
    CUDA_OK(cudaMemcpy(dev, padded.data(), padded.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    GroupRow r;
    r.config = c;
    r.groups = G;
    r.us_range_no_io = TimeGroups(b, c, G, true, false, dev, reps, ev, stream);
    r.us_padded_no_io = TimeGroups(b, c, G, false, false, dev, reps, ev, stream);
    r.us_range_copy = TimeGroups(b, c, G, true, true, dev, reps, ev, stream);
    r.us_padded_copy = TimeGroups(b, c, G, false, true, dev, reps, ev, stream);
    CUDA_OK(cudaFree(dev));
    std::printf("| %5lld | %4lld | %3lld | %6.3g%% | %d | %s | %s | %s | %s | %s | %s |\n",
                (long long)B, (long long)c.record_bytes, (long long)S, 100 * c.miss_rate, G,
                Num(r.us_range_no_io, "%.2f").c_str(), Num(r.us_padded_no_io, "%.2f").c_str(),
                Num(r.us_range_copy, "%.2f").c_str(), Num(r.us_padded_copy, "%.2f").c_str(),
                Num(r.us_range_copy - r.us_range_no_io, "%.2f").c_str(),
                Num(r.us_padded_copy - r.us_padded_no_io, "%.2f").c_str());
    std::fflush(stdout);
    rows.push_back(r);
  }
  return rows;
}

const char* PlanName(ResolveLaunchPlan p) {
  return p == ResolveLaunchPlan::kSplit ? "split" : p == ResolveLaunchPlan::kFused ? "fused" : "auto";
}

std::string Num(double v, const char* fmt) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// A JSON number, or null for NaN (JSON has no NaN).
std::string JsonNum(double v) { return std::isnan(v) ? std::string("null") : Num(v, "%.4f"); }

void PrintRow(const Result& r) {
  const Config& c = r.config;
  const double best = std::min(r.us_fused, r.us_split);
  std::printf("| %5lld | %4lld | %3lld | %6.3g%% | %5lld%s | %8s | %8s | %7s | %5s (%s) | %7s | %7s | %5s | %5s | %9s |\n",
              (long long)c.hot_slots, (long long)c.record_bytes, (long long)c.streams,
              100 * c.miss_rate, (long long)r.misses_per_stream, r.misses_exact ? "" : "!",
              Num(r.us_fused).c_str(), Num(r.us_split).c_str(), Num(r.us_no_io).c_str(),
              PlanName(r.auto_plan),
              std::isnan(r.us_fused) ? "-" : r.us_fused <= r.us_split ? "fused" : "split",
              Num(r.ceiling_gbps).c_str(), Num(r.Gbps(best)).c_str(),
              Num(r.Gbps(r.us_fused) / r.ceiling_gbps, "%.2f").c_str(),
              Num(r.Gbps(r.us_split) / r.ceiling_gbps, "%.2f").c_str(),
              Num(r.rows() / (best * 1e-6), "%.3g").c_str());
}

void PrintHeader() {
  std::printf("| B | W | S | miss | misses/stream | fused us | split us | no-IO us | auto (best) | "
              "ceiling GB/s | IO GB/s (best) | fused/ceil | split/ceil | misses/s (best) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void JsonResult(FILE* f, const Result& r, bool last) {
  const Config& c = r.config;
  auto num = JsonNum;
  std::fprintf(f,
               "    {\"top_k\": %lld, \"hot_slots\": %lld, \"record_bytes\": %lld, \"streams\": %lld, "
               "\"miss_rate\": %.4f, \"misses_per_stream\": %lld, \"misses_exact\": %s, "
               "\"us_fused\": %s, \"us_split\": %s, \"us_no_io\": %s, \"us_no_io_min\": %s, "
               "\"us_no_io_max\": %s, \"auto_plan\": \"%s\", "
               "\"us_auto\": %s, \"ceiling_gbps\": %s, \"io_gbps_fused\": %s, "
               "\"io_gbps_split\": %s, \"ceiling_fraction_fused\": %s, "
               "\"ceiling_fraction_split\": %s, \"misses_per_s_fused\": %s, "
               "\"misses_per_s_split\": %s}%s\n",
               (long long)kTopK, (long long)c.hot_slots, (long long)c.record_bytes,
               (long long)c.streams, c.miss_rate, (long long)r.misses_per_stream,
               r.misses_exact ? "true" : "false", num(r.us_fused).c_str(), num(r.us_split).c_str(),
               num(r.us_no_io).c_str(), num(r.us_no_io_min).c_str(), num(r.us_no_io_max).c_str(),
               PlanName(r.auto_plan), num(r.us_auto()).c_str(),
               num(r.ceiling_gbps).c_str(), num(r.Gbps(r.us_fused)).c_str(),
               num(r.Gbps(r.us_split)).c_str(), num(r.Gbps(r.us_fused) / r.ceiling_gbps).c_str(),
               num(r.Gbps(r.us_split) / r.ceiling_gbps).c_str(),
               num(r.rows() / (r.us_fused * 1e-6)).c_str(),
               num(r.rows() / (r.us_split * 1e-6)).c_str(), last ? "" : ",");
}

const Result* Find(const std::vector<Result>& results, int64_t B, int64_t W, int64_t S,
                   double rate) {
  for (const Result& r : results)
    if (r.config.hot_slots == B && r.config.record_bytes == W && r.config.streams == S &&
        std::fabs(r.config.miss_rate - rate) < 1e-9)
      return &r;
  return nullptr;
}

// "1,8,64" -> {1, 8, 64}; false when an item does not parse.
template <typename T>
bool ParseList(const char* text, std::vector<T>& out) {
  out.clear();
  std::string item;
  for (const char* p = text;; ++p) {
    if (*p != ',' && *p != '\0') {
      item += *p;
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0') return false;
    if (std::is_integral<T>::value && v != static_cast<double>(static_cast<T>(v))) return false;
    out.push_back(static_cast<T>(v));
    item.clear();
    if (*p == '\0') return true;
  }
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: %s OUT.json [--quick] [--reps N] [--no-io] [--no-sweep] [--host-bound] [--floor] [--phases]\n"
      "       [--groups]\n"
      "       [--hot-slots LIST]\n"
      "       [--streams LIST] [--miss LIST] [--record-bytes LIST]   (LIST: comma-separated)\n";
  if (argc < 2) {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  const char* json_path = argv[1];
  bool quick = false, no_io = false, sweep_on = true;
  int reps = 60;
  std::vector<int64_t> hot_slots_arg, streams_arg, record_bytes_arg;
  std::vector<double> rates_arg;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    bool ok = true;
    if (a == "--quick") {
      quick = true;
    } else if (a == "--host-bound") {
      g_host_bound = true;
    } else if (a == "--floor") {
      g_floor = true;
    } else if (a == "--phases") {
#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
      g_phases = true;
#else
      std::fprintf(stderr, "--phases needs a build with EXTRA=-DHISPARSE_RESOLVE_PHASE_CLOCK\n");
      return 2;
#endif
    } else if (a == "--no-io") {
      no_io = true;
      sweep_on = false;
    } else if (a == "--no-sweep") {
      sweep_on = false;
    } else if (a == "--groups") {
      g_groups = true;
      sweep_on = false;
    } else if (a == "--reps" && has_value) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--hot-slots" && has_value) {
      ok = ParseList(argv[++i], hot_slots_arg);
      for (int64_t v : hot_slots_arg) ok = ok && v >= kTopK && v <= 8192;
    } else if (a == "--streams" && has_value) {
      ok = ParseList(argv[++i], streams_arg);
      for (int64_t v : streams_arg) ok = ok && v >= 1 && v <= 256;
    } else if (a == "--miss" && has_value) {
      ok = ParseList(argv[++i], rates_arg);
      for (double v : rates_arg) ok = ok && v >= 0 && v <= 1;
    } else if (a == "--record-bytes" && has_value) {
      ok = ParseList(argv[++i], record_bytes_arg);
      for (int64_t v : record_bytes_arg) ok = ok && v > 0 && v % 16 == 0 && v <= 1152;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad argument %s (hot slots in [%lld, 8192], streams in [1, 256], "
                   "miss in [0, 1], record bytes a multiple of 16 up to 1152)\n",
                   a.c_str(), (long long)kTopK);
      std::fprintf(stderr, kUsage, argv[0]);
      return 2;
    }
  }
  const auto wall_start = std::chrono::steady_clock::now();
  const harness::DeviceInfo info = harness::QueryDevice();
  const cudaDeviceProp& prop = info.prop;
  const int runtime = info.runtime, driver = info.driver;
  std::printf("# RESOLVE benchmark\n\ndevice: %s (sm_%d%d, %d SMs), CUDA runtime %d, driver %d; "
              "k = %lld, R = %lld records per stream, %d reps (median)\n\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, runtime, driver,
              (long long)kTopK, (long long)kPoolRecords, reps);
  std::printf("resolve blocks: %d threads when streams > SMs and B <= %lld, else %d\n",
              hisparse::kResolveThreadsSmall, (long long)hisparse::kResolveSmallBlockMaxSlots,
              hisparse::kResolveThreads);
  {
    // Blocks per stream by stream count (k = 2048, B = 8192, this bench's pool).
    std::printf("blocks per stream (clusters), k = %lld, B = 8192:", (long long)kTopK);
    int prev = -1;
    for (int64_t S = 1; S <= 256; ++S) {
      const int blocks = hisparse::ResolveClusterBlocks(
          ResolveDims{1, S, kTopK, 8192, kPoolRecords, 1152});
      if (blocks != prev) std::printf(" %d from %lld streams;", blocks, (long long)S);
      prev = blocks;
    }
    std::printf("\n\n");
  }

  auto pick = [](const auto& arg, auto fallback) { return arg.empty() ? fallback : arg; };
  const std::vector<int64_t> hot_slots = pick(
      hot_slots_arg, quick || g_groups ? std::vector<int64_t>{4096} : std::vector<int64_t>{2048, 4096, 8192});
  const std::vector<int64_t> record_bytes =
      pick(record_bytes_arg, g_groups ? std::vector<int64_t>{1152} : std::vector<int64_t>{1152, 656});
  const std::vector<int64_t> streams = pick(
      streams_arg, g_groups ? std::vector<int64_t>{16, 64}
                            : quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 8, 64, 256});
  const std::vector<double> rates =
      pick(rates_arg, g_groups ? std::vector<double>{0.13}
                      : quick  ? std::vector<double>{0.0, 0.13, 0.30}
                               : std::vector<double>{0.0, 0.001, 0.13, 0.30, 1.0});
  const std::vector<int64_t> sweep_streams = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  const int64_t max_streams = 256, max_b = 8192, max_w = 1152;

  Buffers b;
  b.pool_bytes = max_streams * kPoolRecords * max_w;
  if (static_cast<int64_t>(b.pool_bytes) > kMaxPinnedBytes) {
    std::fprintf(stderr, "pool would exceed the pinned budget\n");
    return 2;
  }
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&b.pool), b.pool_bytes,
                        cudaHostAllocMapped | cudaHostAllocPortable));
  const int64_t cells = max_streams * max_b;
  CUDA_OK(cudaMalloc(&b.hot, cells * max_w));
  CUDA_OK(cudaMalloc(&b.slot_record, cells * 4));
  CUDA_OK(cudaMalloc(&b.lru, cells * 4));
  CUDA_OK(cudaMalloc(&b.pristine_record, cells * 4));
  CUDA_OK(cudaMalloc(&b.pristine_lru, cells * 4));
  CUDA_OK(cudaMalloc(&b.selection, max_streams * kTopK * 4));
  CUDA_OK(cudaMalloc(&b.slots, max_streams * kTopK * 4));
  CUDA_OK(cudaMalloc(&b.miss_records, max_streams * kTopK * 4));
  CUDA_OK(cudaMalloc(&b.miss_slots, max_streams * kTopK * 4));
  CUDA_OK(cudaMalloc(&b.misses, max_streams * 4));
  CUDA_OK(cudaMalloc(&b.invalid, max_streams * 4));
  CUDA_OK(cudaMalloc(&b.malformed, max_streams * 4));
  CUDA_OK(cudaMalloc(&b.sealed, max_streams * 4));
  CUDA_OK(cudaMalloc(&b.layer, 4));
  CUDA_OK(cudaMalloc(&b.gather_src, max_streams * kTopK * 8));
  CUDA_OK(cudaMalloc(&b.gather_dst, max_streams * kTopK * 8));
  CUDA_OK(cudaMemset(b.layer, 0, 4));
  {
    std::vector<int32_t> sealed(max_streams, static_cast<int32_t>(kPoolRecords));
    CUDA_OK(cudaMemcpy(b.sealed, sealed.data(), sealed.size() * 4, cudaMemcpyHostToDevice));
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FillNonZero<<<4 * prop.multiProcessorCount, 256, 0, stream>>>(
      reinterpret_cast<uint64_t*>(b.pool), b.pool_bytes / 8, 0x5eed);
  FillNonZero<<<4 * prop.multiProcessorCount, 256, 0, stream>>>(
      reinterpret_cast<uint64_t*>(b.hot), cells * max_w / 8, 0xb0b);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(stream));

  Events ev(std::max(reps, 10));
  // Link ceilings: 1 GiB H2D from pinned memory, 1 GiB D2D in HBM.
  const size_t gib = size_t{1} << 30;
  double h2d_gbps = NAN, d2d_gbps = NAN;
  if (!no_io && !g_groups) {
    for (int pass = 0; pass < 2; ++pass) {
      const int n = 5;
      for (int i = 0; i < n; ++i) {
        CUDA_OK(cudaEventRecord(ev.start[i], stream));
        if (pass == 0) {
          CUDA_OK(cudaMemcpyAsync(b.hot, b.pool, gib, cudaMemcpyHostToDevice, stream));
        } else {
          CUDA_OK(cudaMemcpyAsync(b.hot, b.hot + gib, gib, cudaMemcpyDeviceToDevice, stream));
        }
        CUDA_OK(cudaEventRecord(ev.stop[i], stream));
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      const double gbps = gib / (ev.MedianMicros(n) * 1e3);
      (pass == 0 ? h2d_gbps : d2d_gbps) = gbps;
    }
  }
  if (std::isnan(h2d_gbps))
    std::printf("ceilings: not measured (--no-io)\n\n");
  else
    std::printf("ceilings: cudaMemcpy H2D 1 GiB pinned: %.1f GB/s; D2D 1 GiB: %.1f GB/s "
                "(read + write counted once)\n\n",
                h2d_gbps, d2d_gbps);

  std::mt19937_64 rng(20240601);
  std::vector<Result> results;
  std::vector<GroupRow> group_rows;
  if (g_groups) {
    std::printf("## Overlap groups: a layer's RESOLVE as G calls, k = %lld (median us of the G calls)\n\n"
                "| B | W | S | miss | G | no IO, range | no IO, padded | with copy, range | with copy, padded | "
                "copy, range | copy, padded |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                (long long)kTopK);
    for (int64_t B : hot_slots)
      for (int64_t W : record_bytes)
        for (int64_t S : streams)
          for (double rate : rates)
            for (const GroupRow& r : RunGroups(b, Config{B, W, S, rate}, reps, ev, rng, stream))
              group_rows.push_back(r);
  } else {
    std::printf("## RESOLVE, k = %lld\n\n", (long long)kTopK);
    PrintHeader();
  }
  for (int64_t B : hot_slots)
    for (int64_t W : record_bytes)
      for (int64_t S : streams)
        for (double rate : rates) {
          if (g_groups) break;
          results.push_back(RunConfig(b, Config{B, W, S, rate}, reps, ev, rng, stream, no_io));
          PrintRow(results.back());
          std::fflush(stdout);
        }

  if (!g_groups)
    std::printf("\n## No-IO spread over the reps\n\n| B | W | S | miss | no-IO us min / median / max |\n"
                "|---|---|---|---|---|\n");
  for (const Result& r : results)
    std::printf("| %5lld | %4lld | %3lld | %6.3g%% | %s / %s / %s |\n", (long long)r.config.hot_slots,
                (long long)r.config.record_bytes, (long long)r.config.streams,
                100 * r.config.miss_rate, Num(r.us_no_io_min, "%.2f").c_str(),
                Num(r.us_no_io, "%.2f").c_str(), Num(r.us_no_io_max, "%.2f").c_str());

  if (g_floor) {
    std::printf("\n## Launch floor (--floor): an empty kernel with the resolve launch's grid and block\n\n"
                "| B | S | no-IO us | empty, resolve's shared memory, us | empty, no shared memory, us | "
                "empty, 2-block clusters, resolve's shared memory, us |\n"
                "|---|---|---|---|---|---|\n");
    for (const Result& r : results)
      std::printf("| %5lld | %3lld | %s | %s | %s | %s |\n", (long long)r.config.hot_slots,
                  (long long)r.config.streams, Num(r.us_no_io, "%.2f").c_str(),
                  Num(r.us_floor, "%.2f").c_str(), Num(r.us_floor_no_smem, "%.2f").c_str(),
                  Num(r.us_floor_cluster, "%.2f").c_str());
  }
  if (g_phases) {
    std::printf("\n## Resolve kernel phases (--phases): median over blocks of one no-IO call, SM cycles from "
                "the previous mark (resolve_phase_clock.h)\n\n"
                "| B | S | miss | bar 1 | bar 2 | bar 3 | lru | bar 4 | exit | block cycles | block ns | "
                "span ns |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Result& r : results) std::printf("%s\n", r.phases.c_str());
  }

  std::vector<Result> sweep;
  int64_t recommended = 0;
  if (sweep_on) {
    std::printf("\n## Auto threshold sweep: B = 4096, W = 1152, 13%% misses\n\n");
    PrintHeader();
    for (int64_t S : sweep_streams) {
      if (quick && S > 64) break;
      sweep.push_back(RunConfig(b, Config{4096, 1152, S, 0.13}, reps, ev, rng, stream));
      PrintRow(sweep.back());
      std::fflush(stdout);
    }
    // Smallest stream count from which fused is never slower than split.
    recommended = sweep.empty() ? 0 : sweep.back().config.streams * 2;
    for (auto it = sweep.rbegin(); it != sweep.rend(); ++it) {
      if (it->us_fused > it->us_split * 1.02) break;  // 2% tolerance: noise
      recommended = it->config.streams;
    }
    std::printf("\nfused is within 2%% of split from %lld streams on: kAutoSplitBelowStreams "
                "should be %lld (compiled: %lld)\n",
                (long long)recommended, (long long)recommended,
                (long long)hisparse::kAutoSplitBelowStreams);
  }

  // The targets of the issue (H200, 1152 B, k = 2048, B = 4096).
  std::printf("\n## Targets (B = 4096, W = 1152)\n\n");
  if (const Result* r = Find(results, 4096, 1152, 64, 0.13)) {
    std::printf("- no-IO overhead at 64 streams, the malformed-state check included: %.1f us per call "
                "(target <= 8)\n", r->us_no_io);
  }
  for (int64_t S : {64, 256}) {
    if (no_io) break;  // only the no-IO call was timed
    if (const Result* r = Find(results, 4096, 1152, S, 0.13)) {
      std::printf("- IO at %lld streams, 13%% misses: fused %.2f, split %.2f, auto (%s) %.2f of the "
                  "zero-copy ceiling %.1f GB/s (target >= 0.85)\n",
                  (long long)S, r->Gbps(r->us_fused) / r->ceiling_gbps,
                  r->Gbps(r->us_split) / r->ceiling_gbps, PlanName(r->auto_plan),
                  r->Gbps(r->us_auto()) / r->ceiling_gbps, r->ceiling_gbps);
    }
  }
  if (const Result* r = no_io ? nullptr : Find(results, 4096, 1152, 1, 0.30)) {
    std::printf("- IO with 1 stream, 30%% misses: fused %.2f, split %.2f, auto (%s) %.2f of the "
                "zero-copy ceiling %.1f GB/s (target >= 0.5)\n",
                r->Gbps(r->us_fused) / r->ceiling_gbps, r->Gbps(r->us_split) / r->ceiling_gbps,
                PlanName(r->auto_plan), r->Gbps(r->us_auto()) / r->ceiling_gbps, r->ceiling_gbps);
  }
  bool exact = true;
  for (const auto* list : {&results, &sweep})
    for (const Result& r : *list) exact = exact && r.misses_exact;
  if (!exact) std::printf("\nWARNING: rows marked ! did not have the requested miss count\n");

  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  std::printf("\nwall time %.1f s\n", wall_s);

  FILE* f = harness::OpenJson(json_path);
  std::fprintf(f,
               "{\n  \"device\": \"%s\", \"sm_count\": %d, \"cuda_runtime\": %d, \"cuda_driver\": %d,\n"
               "  \"top_k\": %lld, \"pool_records\": %lld, \"reps\": %d, \"wall_s\": %.1f,\n"
               "  \"ceilings\": {\"h2d_memcpy_1gib_gbps\": %s, \"d2d_memcpy_1gib_gbps\": %s},\n"
               "  \"auto_split_below_streams_compiled\": %lld, "
               "\"auto_split_below_streams_recommended\": %s,\n  \"configs\": [\n",
               prop.name, prop.multiProcessorCount, runtime, driver, (long long)kTopK,
               (long long)kPoolRecords, reps, wall_s, JsonNum(h2d_gbps).c_str(), JsonNum(d2d_gbps).c_str(),
               (long long)hisparse::kAutoSplitBelowStreams,
               sweep_on ? std::to_string(recommended).c_str() : "null");
  for (size_t i = 0; i < results.size(); ++i) JsonResult(f, results[i], i + 1 == results.size());
  std::fprintf(f, "  ],\n  \"auto_threshold_sweep\": [\n");
  for (size_t i = 0; i < sweep.size(); ++i) JsonResult(f, sweep[i], i + 1 == sweep.size());
  std::fprintf(f, "  ],\n  \"overlap_groups\": [\n");
  for (size_t i = 0; i < group_rows.size(); ++i) {
    const GroupRow& r = group_rows[i];
    std::fprintf(f,
                 "    {\"hot_slots\": %lld, \"record_bytes\": %lld, \"streams\": %lld, \"miss_rate\": %g, "
                 "\"groups\": %d, \"us_range_no_io\": %s, \"us_padded_no_io\": %s, \"us_range_copy\": %s, "
                 "\"us_padded_copy\": %s}%s\n",
                 (long long)r.config.hot_slots, (long long)r.config.record_bytes, (long long)r.config.streams,
                 r.config.miss_rate, r.groups, JsonNum(r.us_range_no_io).c_str(), JsonNum(r.us_padded_no_io).c_str(),
                 JsonNum(r.us_range_copy).c_str(), JsonNum(r.us_padded_copy).c_str(),
                 i + 1 == group_rows.size() ? "" : ",");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("wrote %s\n", json_path);

  cudaStreamDestroy(stream);
  cudaFreeHost(b.pool);
  for (void* p : {static_cast<void*>(b.hot), static_cast<void*>(b.slot_record),
                  static_cast<void*>(b.lru), static_cast<void*>(b.pristine_record),
                  static_cast<void*>(b.pristine_lru), static_cast<void*>(b.selection),
                  static_cast<void*>(b.slots), static_cast<void*>(b.miss_records),
                  static_cast<void*>(b.miss_slots), static_cast<void*>(b.misses),
                  static_cast<void*>(b.invalid), static_cast<void*>(b.malformed),
                  static_cast<void*>(b.sealed),
                  static_cast<void*>(b.layer), static_cast<void*>(b.gather_src),
                  static_cast<void*>(b.gather_dst)})
    cudaFree(p);
  return exact ? 0 : 1;
}

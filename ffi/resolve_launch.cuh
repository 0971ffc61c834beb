// The host side of RESOLVE and the pool write: device properties, the choice of
// kernel variant and launch plan, shared memory opt-in, and the launchers of
// resolve_cuda.h and pool_write_cuda.h. Included last by resolve_kernels.cu: the
// launchers instantiate the kernel templates, which live in that translation
// unit's anonymous namespace.
#ifndef HISPARSE_FFI_RESOLVE_LAUNCH_CUH_
#define HISPARSE_FFI_RESOLVE_LAUNCH_CUH_

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

// The cluster variants: k{Pair,Quad}Kernels[r][s] has 2^r lru items per lane
// in a part (ceil(B / cluster) <= 1024 x 2^r) and 2^s selection items per
// lane (k <= 1024 x 2^s).
template <int kCluster, int kRounds>
constexpr std::array<ResolveKernelFn, 3> ClusterSelectionVariants() {
  return {ResolveClusterKernel<kCluster, kRounds, 1>, ResolveClusterKernel<kCluster, kRounds, 2>,
          ResolveClusterKernel<kCluster, kRounds, 4>};
}
constexpr std::array<ResolveKernelFn, 3> kPairKernels[] = {
    ClusterSelectionVariants<2, 1>(), ClusterSelectionVariants<2, 2>(),
    ClusterSelectionVariants<2, 4>()};
constexpr std::array<ResolveKernelFn, 3> kQuadKernels[] = {ClusterSelectionVariants<4, 1>(),
                                                           ClusterSelectionVariants<4, 2>()};
static_assert(kResolveClusterSize == 2 && kResolveWideClusterSize == 4 &&
                  kResolveClusterMaxSlots <= 2 * 4 * kResolveThreads &&
                  kResolveClusterMaxSlots <= 4 * 2 * kResolveThreads &&
                  kResolveClusterMaxTopK <= 4 * kResolveThreads,
              "the pair and quad variants cover every cluster shape");

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
#ifdef HISPARSE_RESOLVE_SMALL_BLOCKS_FROM_STREAMS
  sms = HISPARSE_RESOLVE_SMALL_BLOCKS_FROM_STREAMS - 1;  // an A/B build (resolve_cuda.h)
#endif
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
    opt_in(kPairKernels);
    opt_in(kQuadKernels);
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

// Dynamic shared memory of a cluster resolve block: the table and region of
// SharedBytes, then hit_of_pos[k], the slot bitmap (B bits) and the record
// bitmap (R bits).
constexpr int64_t ClusterSharedBytes(int64_t top_k, int64_t hot_slots, int64_t pool_records) {
  return TableCapacity(top_k, hot_slots) * 8 + RegionInts(top_k, hot_slots) * 4 +
         RoundUp4(top_k) * 4 + SlotBitmapInts(hot_slots) * 4 + RecordBitmapInts(pool_records) * 4;
}

// How many clusters of `cluster_size` resolve blocks `device` runs at once
// (0: none), asked once per device: a cluster's blocks share a GPC, so this
// can be less than SMs / cluster_size (e.g. 32 quads on 132 SMs when GPCs
// hold 16 or 18 SMs), and more streams than this would run in two waves. A
// 1024-thread block at 64 registers fills an SM whatever its shared memory,
// so one query per size covers every shape.
int MaxActiveClusters(int cluster_size, int device) {
  static std::atomic<int> counts[kMaxDevices][2] = {};  // [device][pair, quad], + 1
  if (device < 0 || device >= kMaxDevices) return 0;
  const int which = cluster_size == kResolveWideClusterSize ? 1 : 0;
  int n = counts[device][which].load(std::memory_order_relaxed);
  if (n == 0) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(cluster_size));
    config.blockDim = dim3(kResolveThreads);
    config.dynamicSmemBytes = 32 * 1024;  // within the default limit: no opt-in needed here
    int clusters = 0;
    const ResolveKernelFn kernel = which == 1 ? kQuadKernels[0][0] : kPairKernels[0][0];
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < 0) {
      (void)cudaGetLastError();  // not sticky; clear it so the launch reports its own
      clusters = 0;
    }
    n = clusters + 1;
    counts[device][which].store(n, std::memory_order_relaxed);  // every racer stores the same
  }
  return n - 1;
}

// CTAs per stream of a launch of `streams` streams (resolve_cuda.h): 1
// (ResolveKernel), or 2 or 4 (ResolveClusterKernel) when the shape allows it
// and all the streams' clusters run at once.
int ClusterSize(const ResolveDims& d, int64_t streams, int device) {
  // Opt-in (-DHISPARSE_RESOLVE_CLUSTER): the cluster kernel's blocks read each
  // other's shared memory after a CTA fence and a relaxed cluster arrive, which
  // the H200 honours (the checker's every cluster case) but the PTX memory
  // model does not promise; RESOLVE must be exact, and the gain (B > 4096
  // only) does not yet pay for that doubt.
#if defined(HISPARSE_RESOLVE_NO_CLUSTER) || !defined(HISPARSE_RESOLVE_CLUSTER)
  (void)d, (void)streams, (void)device;
  return 1;
#else
  if (d.hot_slots <= kResolveClusterMinSlots || d.hot_slots > kResolveClusterMaxSlots ||
      d.top_k > kResolveClusterMaxTopK ||
      !UsesRecordBitmap(d.top_k, d.hot_slots, d.pool_records) ||
      ClusterSharedBytes(d.top_k, d.hot_slots, d.pool_records) > kMaxResolveSharedBytes)
    return 1;
#ifndef HISPARSE_RESOLVE_NO_WIDE_CLUSTER
  if (streams <= MaxActiveClusters(kResolveWideClusterSize, device))
    return kResolveWideClusterSize;
#endif
  if (streams <= MaxActiveClusters(kResolveClusterSize, device)) return kResolveClusterSize;
  return 1;
#endif
}

// Whether `range` is a stream range of `d` (CheckStreamRange's conditions).
bool InRange(const ResolveDims& d, StreamRange range) {
  return range.begin >= 0 && range.count >= 0 && range.begin <= d.streams &&
         range.count <= d.streams - range.begin;
}

// The outputs of an empty range: every row as padding leaves it (resolve.h), in six memsets
// (int32 -1 is all ones). Only a launch of no stream gets here: with streams to resolve, their
// blocks fill the other rows themselves (FillOutsideRange).
cudaError_t PadEveryRow(const ResolveDims& d, const ResolveBuffers& io, cudaStream_t stream) {
  const size_t picks = static_cast<size_t>(d.streams * d.top_k) * sizeof(int32_t);
  const size_t rows = static_cast<size_t>(d.streams) * sizeof(int32_t);
  for (int32_t* p : {io.slots, io.miss_records, io.miss_slots}) {
    if (picks == 0) break;
    if (cudaError_t err = cudaMemsetAsync(p, 0xff, picks, stream); err != cudaSuccess) return err;
  }
  for (int32_t* p : {io.misses, io.invalid, io.malformed}) {
    if (cudaError_t err = cudaMemsetAsync(p, 0, rows, stream); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t Fail(cudaError_t err, const char* kernel, const char** failed_kernel) {
  if (err != cudaSuccess && failed_kernel != nullptr) *failed_kernel = kernel;
  return err;
}

}  // namespace

#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
cudaError_t ReadResolvePhaseClock(uint64_t* host, int streams) {
  if (streams < 0 || streams > kPhaseClockStreams) return cudaErrorInvalidValue;
  const size_t bytes = size_t(streams) * kStampsPerStream * sizeof(uint64_t);
  cudaError_t err = cudaMemcpyFromSymbol(host, g_resolve_phase_clock, bytes);
  if (err != cudaSuccess) return err;
  static const uint64_t zeros[kPhaseClockStreams * kStampsPerStream] = {};
  return cudaMemcpyToSymbol(g_resolve_phase_clock, zeros, sizeof(zeros));
}
#endif

int ResolveClusterBlocks(const ResolveDims& dims) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  return ClusterSize(dims, dims.streams, device);
}

int64_t ResolveSharedBytes(int64_t top_k, int64_t hot_slots) {
  return SharedBytes(top_k, hot_slots);
}

ResolveLaunchPlan ChooseResolvePlan(ResolveLaunchPlan plan, int64_t streams) {
  if (plan != ResolveLaunchPlan::kAuto) return plan;
  return streams < kAutoSplitBelowStreams ? ResolveLaunchPlan::kSplit : ResolveLaunchPlan::kFused;
}

cudaError_t LaunchResolve(const ResolveDims& d, StreamRange range, const int32_t* layer,
                          const ResolveBuffers& io, bool fetch, ResolveLaunchPlan plan,
                          cudaStream_t stream, const char** failed_kernel) {
  constexpr const char* kResolveName = "hisparse resolve kernel";
  if (d.top_k < 0 || d.top_k > kMaxResolveTopK || d.hot_slots < d.top_k ||
      d.hot_slots > kMaxResolveHotSlots || d.record_bytes <= 0 || d.record_bytes % 8 != 0 ||
      d.pool_records < 0 || d.pool_records > INT32_MAX || d.streams < 0 ||
      d.streams > INT32_MAX || d.layers < 0 || !InRange(d, range))
    return Fail(cudaErrorInvalidValue, kResolveName, failed_kernel);
  if (d.streams == 0) return cudaSuccess;
  if (range.count == 0) return Fail(PadEveryRow(d, io, stream), kResolveName, failed_kernel);

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  const int cluster_size = ClusterSize(d, range.count, device);
  const bool cluster = cluster_size > 1;
  const int64_t shared_bytes = cluster
                                   ? ClusterSharedBytes(d.top_k, d.hot_slots, d.pool_records)
                                   : ResolveSharedBytes(d.top_k, d.hot_slots);
  if (cluster || shared_bytes + kResolveStaticSharedBytes > kLargeSharedBytes) {
    err = OptInSharedMemory(device);
    if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  }

  const bool vec16 = d.record_bytes % 16 == 0 && Aligned(io.host_pool, 16) && Aligned(io.hot, 16);
  if (!vec16 && !(Aligned(io.host_pool, 8) && Aligned(io.hot, 8)))
    return Fail(cudaErrorMisalignedAddress, kResolveName, failed_kernel);
  const int vector = vec16 ? 16 : 8;
  const bool split = ChooseResolvePlan(plan, range.count) == ResolveLaunchPlan::kSplit;

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
  a.stream_begin = range.begin;
  a.stream_count = range.count;
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
  a.record_bitmap = UsesRecordBitmap(d.top_k, d.hot_slots, d.pool_records);
  const int64_t record_check_ints =
      a.record_bitmap ? RecordBitmapInts(d.pool_records) : held_capacity / 2;
  a.check_vectors = static_cast<int32_t>((SlotBitmapInts(d.hot_slots) + record_check_ints) / 4);
  a.hit_offset = 0;
  a.record_offset = 0;
  if (cluster) {  // [table][region][hit_of_pos][slot bitmap][record bitmap], cleared from hit_of_pos
    a.hit_offset = static_cast<int32_t>((capacity * 2 + RegionInts(d.top_k, d.hot_slots)) * 4);
    a.check_offset = a.hit_offset + static_cast<int32_t>(RoundUp4(d.top_k) * 4);
    a.record_offset = a.check_offset + static_cast<int32_t>(SlotBitmapInts(d.hot_slots) * 4);
    a.check_vectors = static_cast<int32_t>(
        (RoundUp4(d.top_k) + SlotBitmapInts(d.hot_slots) + RecordBitmapInts(d.pool_records)) / 4);
  }
  a.copy_vector = vector;
  a.row_batch = RowBatch(d.record_bytes / vector, kFusedCopyUnroll);
  a.fused_fetch = fetch && !split;
  if (cluster) {
    // lru positions of one CTA at most
    const int64_t part_b = (d.hot_slots + cluster_size - 1) / cluster_size;
    const int r = CeilLog2((part_b + kResolveThreads - 1) / kResolveThreads);
    const int s = CeilLog2((d.top_k + kResolveThreads - 1) / kResolveThreads);
    const ResolveKernelFn kernel = cluster_size == kResolveWideClusterSize ? kQuadKernels[r][s]
                                                                           : kPairKernels[r][s];
    kernel<<<static_cast<unsigned>(range.count * cluster_size), kResolveThreads,
             static_cast<size_t>(shared_bytes), stream>>>(a);
  } else {
    const ResolveVariant variant =
        ResolveKernelFor(d.top_k, d.hot_slots, range.count, SmCount(device));
    variant.kernel<<<static_cast<unsigned>(range.count), variant.threads,
                     static_cast<size_t>(shared_bytes), stream>>>(a);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return Fail(err, kResolveName, failed_kernel);
  if (!fetch || !split || d.top_k == 0) return cudaSuccess;
  return LaunchResolveFetch(d, range, layer, io, int64_t{kFetchBlocksPerSm} * SmCount(device),
                            stream, failed_kernel);
}

cudaError_t LaunchResolveFetch(const ResolveDims& d, StreamRange range, const int32_t* layer,
                               const ResolveBuffers& io, int64_t max_blocks, cudaStream_t stream,
                               const char** failed_kernel) {
  constexpr const char* kFetchName = "hisparse fetch kernel";
  if (max_blocks < 1 || d.streams > INT32_MAX || !InRange(d, range))
    return Fail(cudaErrorInvalidValue, kFetchName, failed_kernel);
  if (range.count == 0 || d.top_k == 0) return cudaSuccess;
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
  f.stream_begin = range.begin;
  f.record_bytes = d.record_bytes;
  f.top_k = static_cast<int32_t>(d.top_k);
  f.hot_slots = static_cast<int32_t>(d.hot_slots);
  f.pool_records = static_cast<int32_t>(d.pool_records);
  f.row_batch = RowBatch(d.record_bytes / vector, kFetchCopyUnroll);
  // Enough blocks in all to keep the link busy, but no more per stream than
  // k misses at one row per warp could use. Only the range's streams have a
  // copy to make, so they share all the blocks (a group of G gets what the
  // whole batch would, not 1/G of it).
  const int64_t wanted = (max_blocks + range.count - 1) / range.count;
  const int64_t useful = (d.top_k + kFetchWarps - 1) / kFetchWarps;
  const int64_t chunks = wanted < useful ? wanted : useful;
  if (chunks * range.count > INT32_MAX)
    return Fail(cudaErrorInvalidValue, kFetchName, failed_kernel);
  f.chunks = static_cast<int32_t>(chunks);
  const unsigned grid = static_cast<unsigned>(chunks * range.count);
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

#endif  // HISPARSE_FFI_RESOLVE_LAUNCH_CUH_

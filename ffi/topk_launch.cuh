// The host side of TOP-K: device properties, the choice of kernel and cluster,
// and LaunchTopk (topk_cuda.h). Included last by topk_kernels.cu: the launchers
// instantiate the kernel templates, which live in that translation unit's
// anonymous namespace.
#ifndef HISPARSE_FFI_TOPK_LAUNCH_CUH_
#define HISPARSE_FFI_TOPK_LAUNCH_CUH_

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "topk_cuda.h"

namespace hisparse {
namespace {

// ---------------------------------------------------------------------------
// Host side.

using StreamingKernelFn = void (*)(TopkArgs);
constexpr int kStreamingClusters[] = {1, 2, 4, 8};
constexpr StreamingKernelFn kStreamingKernels[] = {TopkStreamingKernel<1>, TopkStreamingKernel<2>,
                                                   TopkStreamingKernel<4>, TopkStreamingKernel<8>};
static_assert(kTopkMaxCluster == 8, "kStreamingKernels instantiates clusters up to 8 blocks");
static_assert(kTopkMaxRecords + int64_t{kTopkMaxCluster} * kTileIds < INT32_MAX,
              "ids, slices and bitmap bits stay in int32");

using ResidentKernelFn = void (*)(ResidentArgs);
// Every size up to 8 (not only powers of two: 17 rows of 131K run 6 blocks
// per row in one wave where 8 would take two), and 16.
constexpr int kResidentClusters[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
constexpr int kResidentSizes = 9;
constexpr ResidentKernelFn kResidentKernels[] = {
    TopkResidentKernel<1>, TopkResidentKernel<2>, TopkResidentKernel<3>,
    TopkResidentKernel<4>, TopkResidentKernel<5>, TopkResidentKernel<6>,
    TopkResidentKernel<7>, TopkResidentKernel<8>, TopkResidentKernel<16>};
static_assert(sizeof(kResidentClusters) / sizeof(int) == kResidentSizes &&
                  sizeof(kResidentKernels) / sizeof(ResidentKernelFn) == kResidentSizes,
              "one kernel per resident cluster size");
static_assert(kTopkResidentMaxCluster == 16, "kResidentKernels instantiates clusters up to 16 blocks");
static_assert(kTopkMaxRecords + kTopkResidentMaxSlice < INT32_MAX, "ids stay in int32");

template <size_t N>
int IndexOf(const int (&sizes)[N], int cluster) {
  for (size_t i = 0; i < N; ++i)
    if (sizes[i] == cluster) return static_cast<int>(i);
  return -1;
}

int64_t SharedBytes(int capacity) { return kHistogramBytes + int64_t{capacity} * 8; }

// What the launcher learns about a device once: the kernels' shared-memory
// opt-in, the SM count, and how many clusters of each resident size run at
// once (0: that size cannot run there).
struct DeviceSetup {
  cudaError_t error = cudaSuccess;
  int sms = 132;
  int resident_clusters[kResidentSizes] = {};
};

// The launch of `grid` blocks of `threads` in clusters of `cluster` blocks
// along x; the config points at `attribute` (the cluster dimension), which
// must outlive it.
cudaLaunchConfig_t ClusterLaunchConfig(unsigned grid, int threads, size_t shared_bytes, int cluster,
                                       cudaStream_t stream, cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid, 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// How many resident clusters of `cluster` blocks the device runs at once; 0
// when it cannot run them (its failure is cleared, not reported).
int ResidentActiveClusters(int index, int sms) {
  const ResidentKernelFn fn = kResidentKernels[index];
  const int cluster = kResidentClusters[index];
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kResidentSharedBytes)) != cudaSuccess ||
      (cluster > 8 &&
       cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    (void)cudaGetLastError();
    return 0;
  }
  int active = 0;
  cudaError_t err;
  if (cluster == 1) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&active, fn, kTopkResidentThreads,
                                                        static_cast<size_t>(kResidentSharedBytes));
    active *= sms;
  } else {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterLaunchConfig(static_cast<unsigned>(cluster), kTopkResidentThreads,
                            static_cast<size_t>(kResidentSharedBytes), cluster, /*stream=*/nullptr, attribute);
    err = cudaOccupancyMaxActiveClusters(&active, fn, &config);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return active;
}

// Host-side setup of `device`, once per device (the first launch may be under
// CUDA-graph capture: no stream work here).
const DeviceSetup* SetUp(int device) {
  static std::once_flag once[kMaxDevices];
  static DeviceSetup setups[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::call_once(once[device], [device] {
    DeviceSetup& s = setups[device];
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0)
      s.sms = sms;
    for (StreamingKernelFn fn : kStreamingKernels) {
      const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(SharedBytes(kTopkCandidates)));
      if (s.error == cudaSuccess) s.error = e;
    }
    for (int i = 0; i < kResidentSizes; ++i) s.resident_clusters[i] = ResidentActiveClusters(i, s.sms);
  });
  return &setups[device];
}

bool ValidDims(const TopkDims& d) {
  return d.rows >= 0 && d.records >= 0 && d.records <= kTopkMaxRecords && d.top_k >= 0 &&
         d.top_k <= d.records;
}

bool ValidOptions(const TopkLaunchOptions& o) {
  switch (o.kernel) {
    case TopkKernelKind::kAuto:
      return o.cluster == 0 && o.candidates == -1;
    case TopkKernelKind::kStreaming:
      return (o.cluster == 0 || IndexOf(kStreamingClusters, o.cluster) >= 0) && o.candidates >= -1 &&
             o.candidates <= kTopkCandidates;
    case TopkKernelKind::kResident:
      return (o.cluster == 0 || IndexOf(kResidentClusters, o.cluster) >= 0) &&
             (o.candidates == -1 ||
              (o.candidates >= 0 && o.candidates <= kTopkResidentCandidates && o.candidates % 4 == 0));
  }
  return false;
}

int StreamingCluster(const TopkDims& d, int sms) {
  for (int cluster = kTopkMaxCluster; cluster > 1; cluster /= 2) {
    if (d.rows * cluster <= sms && d.records >= cluster * kTopkMinSliceRecords) return cluster;
  }
  return 1;
}

int64_t ResidentSlice(int64_t records, int cluster) {
  // Aligned slices: room for block 0's lead of up to 3 positions before the row's first id.
  const int64_t positions = records + (kAlignedSlices ? 3 : 0);
  const int64_t per_block = (positions + cluster - 1) / cluster;
  return std::max<int64_t>(kStepIds, (per_block + kStepIds - 1) / kStepIds * kStepIds);
}

bool ResidentRuns(const TopkDims& d, int index, const DeviceSetup& s) {
  return index >= 0 && ResidentSlice(d.records, kResidentClusters[index]) <= kTopkResidentMaxSlice &&
         s.resident_clusters[index] >= 1;
}

// The most blocks per row that run in one wave with at least
// kTopkResidentMinSlice ids each, else the fewest whose slice fits; 0 when
// no size fits.
int ResidentCluster(const TopkDims& d, const DeviceSetup& s) {
  int one_wave = 0, fewest = 0;
  for (int i = kResidentSizes - 1; i >= 0; --i) {
    if (!ResidentRuns(d, i, s)) continue;
    const int cluster = kResidentClusters[i];
    fewest = cluster;
    if (one_wave == 0 && d.rows <= s.resident_clusters[i] &&
        (cluster == 1 || ResidentSlice(d.records, cluster) >= kTopkResidentMinSlice))
      one_wave = cluster;
  }
  return one_wave != 0 ? one_wave : fewest;
}

TopkLaunchPlan PlanFor(const TopkDims& d, const TopkLaunchOptions& o, const DeviceSetup& s) {
  if (!ValidDims(d) || !ValidOptions(o)) return {};
  if (o.kernel != TopkKernelKind::kStreaming) {
    int cluster = 0;
    if (o.cluster == 0) {
      cluster = ResidentCluster(d, s);
    } else if (ResidentRuns(d, IndexOf(kResidentClusters, o.cluster), s)) {
      cluster = o.cluster;
    }
    if (cluster != 0 || o.kernel == TopkKernelKind::kResident) return {TopkKernelKind::kResident, cluster};
  }
  return {TopkKernelKind::kStreaming, o.cluster != 0 ? o.cluster : StreamingCluster(d, s.sms)};
}

cudaError_t Fail(cudaError_t err, const char* kernel, const char** failed_kernel) {
  if (err != cudaSuccess && failed_kernel != nullptr) *failed_kernel = kernel;
  return err;
}

// Launches `fn` on rows x cluster blocks in clusters of `cluster`.
template <typename Args>
cudaError_t LaunchClusters(void (*fn)(Args), const Args& args, int64_t rows, int cluster, int threads,
                           size_t shared_bytes, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(rows * cluster);
  if (cluster == 1) {
    fn<<<grid, threads, shared_bytes, stream>>>(args);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = ClusterLaunchConfig(grid, threads, shared_bytes, cluster, stream, attribute);
  cudaError_t err = cudaLaunchKernelEx(&config, fn, args);
  if (err == cudaSuccess) err = cudaGetLastError();
  return err;
}

}  // namespace

TopkLaunchPlan TopkPlan(const TopkDims& dims, const TopkLaunchOptions& options) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {};
  const DeviceSetup* setup = SetUp(device);
  if (setup == nullptr || setup->error != cudaSuccess) return {};
  return PlanFor(dims, options, *setup);
}

cudaError_t LaunchTopk(const TopkDims& d, const TopkBuffers& io, uint32_t* workspace,
                       cudaStream_t stream, const TopkLaunchOptions& options,
                       const char** failed_kernel) {
  constexpr const char* kName = "hisparse topk kernel";
  constexpr const char* kStreamingName = "hisparse topk streaming kernel";
  constexpr const char* kResidentName = "hisparse topk resident kernel";
  if (!ValidDims(d) || !ValidOptions(options)) return Fail(cudaErrorInvalidValue, kName, failed_kernel);
  if (d.rows == 0 || d.top_k == 0) return cudaSuccess;

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return Fail(err, kName, failed_kernel);
  const DeviceSetup* setup = SetUp(device);
  if (setup == nullptr) return Fail(cudaErrorInvalidDevice, kName, failed_kernel);
  if (setup->error != cudaSuccess) return Fail(setup->error, kName, failed_kernel);
  const TopkLaunchPlan plan = PlanFor(d, options, *setup);
  const int index = plan.kernel == TopkKernelKind::kResident ? IndexOf(kResidentClusters, plan.cluster)
                                                             : IndexOf(kStreamingClusters, plan.cluster);
  if (plan.cluster == 0 || index < 0) return Fail(cudaErrorInvalidConfiguration, kName, failed_kernel);
  if (d.rows > INT32_MAX / plan.cluster) return Fail(cudaErrorInvalidValue, kName, failed_kernel);
  const bool vec4 = reinterpret_cast<uintptr_t>(io.scores) % 16 == 0 && d.records % 4 == 0;

  if (plan.kernel == TopkKernelKind::kResident) {
    ResidentArgs a;
    a.scores = io.scores;
    a.sealed = io.sealed;
    a.selected = io.selected;
    a.records = static_cast<int32_t>(d.records);
    a.top_k = static_cast<int32_t>(d.top_k);
    a.slice = static_cast<int32_t>(ResidentSlice(d.records, plan.cluster));
    a.region = ResidentRegion(a.slice);
    a.capacity = options.candidates < 0 ? a.region : options.candidates;
    a.vec4 = vec4;
    return Fail(LaunchClusters(kResidentKernels[index], a, d.rows, plan.cluster, kTopkResidentThreads,
                               static_cast<size_t>(kResidentSharedBytes), stream),
                kResidentName, failed_kernel);
  }

  TopkArgs a;
  a.scores = io.scores;
  a.sealed = io.sealed;
  a.selected = io.selected;
  a.workspace = workspace;
  a.records = static_cast<int32_t>(d.records);
  a.top_k = static_cast<int32_t>(d.top_k);
  const int64_t per_block = (d.records + plan.cluster - 1) / plan.cluster;
  a.slice = static_cast<int32_t>((per_block + kTileIds - 1) / kTileIds * kTileIds);
  a.bitmap_words = static_cast<int32_t>(TopkWorkspaceWords(d.records) / 2);
  a.capacity = options.candidates < 0 ? kTopkCandidates : options.candidates;
  a.vec4 = vec4;
  return Fail(LaunchClusters(kStreamingKernels[index], a, d.rows, plan.cluster, kTopkThreads,
                             static_cast<size_t>(SharedBytes(a.capacity)), stream),
              kStreamingName, failed_kernel);
}

#ifdef HISPARSE_TOPK_TRACE
cudaError_t LaunchTopkEmptyResident(const TopkDims& d, cudaStream_t stream, const TopkLaunchOptions& options,
                                    TopkFloorShape shape) {
  constexpr ResidentKernelFn kEmpty[] = {
      TopkResidentEmptyKernel<1>, TopkResidentEmptyKernel<2>, TopkResidentEmptyKernel<3>,
      TopkResidentEmptyKernel<4>, TopkResidentEmptyKernel<5>, TopkResidentEmptyKernel<6>,
      TopkResidentEmptyKernel<7>, TopkResidentEmptyKernel<8>, TopkResidentEmptyKernel<16>};
  static_assert(sizeof(kEmpty) / sizeof(ResidentKernelFn) == kResidentSizes, "one empty kernel per cluster size");
  if (!ValidDims(d) || !ValidOptions(options) || d.rows == 0 || d.top_k == 0) return cudaErrorInvalidValue;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  const DeviceSetup* setup = SetUp(device);
  if (setup == nullptr || setup->error != cudaSuccess) return cudaErrorInvalidDevice;
  const TopkLaunchPlan plan = PlanFor(d, options, *setup);
  const int index = IndexOf(kResidentClusters, plan.cluster);
  if (plan.kernel != TopkKernelKind::kResident || index < 0) return cudaErrorInvalidConfiguration;
  const bool clusters = shape == TopkFloorShape::kPlanned || shape == TopkFloorShape::kNoSharedMemory;
  const bool shared = shape == TopkFloorShape::kPlanned || shape == TopkFloorShape::kNoClusters;
  // Without clusters: the one-block kernel over as many blocks, launched plainly.
  const ResidentKernelFn fn = clusters ? kEmpty[index] : kEmpty[0];
  const int cluster = clusters ? plan.cluster : 1;
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kResidentSharedBytes));
  if (err == cudaSuccess && cluster > 8)
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  return LaunchClusters(fn, ResidentArgs{}, d.rows * plan.cluster / cluster, cluster, kTopkResidentThreads,
                        shared ? static_cast<size_t>(kResidentSharedBytes) : size_t{0}, stream);
}

cudaError_t TopkReadTrace(unsigned long long* ns, int blocks) {
  const size_t n = static_cast<size_t>(std::min(blocks, kTopkTraceBlocks));
  return cudaMemcpyFromSymbol(ns, g_topk_trace_ns, n * kTopkTraceSlots * sizeof(unsigned long long));
}
cudaError_t TopkClearTrace() {
  static unsigned long long zeros[kTopkTraceBlocks * kTopkTraceSlots] = {};
  return cudaMemcpyToSymbol(g_topk_trace_ns, zeros, sizeof(zeros));
}
#endif

}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_LAUNCH_CUH_

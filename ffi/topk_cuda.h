// TOP-K on a CUDA device: the launcher on raw pointers, no XLA types. Both
// kernels (topk_kernels.cu) are bit-identical to topk_cpu.cc for every input
// the contract of topk.h allows.
//
// Two kernels, one launch either way, no host synchronization:
//  - resident: a cluster of C blocks per row (C in {1, 2, ..., 8, 16}; 16 is
//    the non-portable cluster size, used where the device schedules it),
//    one 1024-thread block per SM. Each block copies its slice of the row
//    (at most kTopkResidentMaxSlice ids) into shared memory once; every later
//    pass reads shared memory. The bucket of the k-th largest key is
//    estimated from a sample, confirmed by exact counts, and only the ids at
//    or above it are histogrammed further and compacted.
//  - streaming: a cluster of C blocks per row (C in {1, 2, 4, 8}) that reads
//    the scores from global memory at every pass; for rows too long for the
//    resident kernel (R > 16 x kTopkResidentMaxSlice).
// Auto picks the resident kernel whenever a row fits in 16 blocks' shared
// memory, with the most blocks per row that run in one wave (rows <= the
// device's active clusters of that size) while each block keeps at least
// kTopkResidentMinSlice ids; when no size fits in one wave (many rows), the
// fewest blocks per row whose slice fits, in waves. The device's SM count
// and active-cluster limits are queried once per device, on the first
// launch, and cached (no runtime query per call, CUDA-graph capture safe).
#ifndef HISPARSE_FFI_TOPK_CUDA_H_
#define HISPARSE_FFI_TOPK_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "topk.h"

namespace hisparse {

// Streaming kernel: threads of one block; two blocks share an SM (registers
// <= 64 per thread).
inline constexpr int kTopkThreads = 512;
// Streaming kernel: candidates one block can hold in shared memory (key and
// id each): once the bucket holding the k-th largest key has at most this
// many ids in every block of a row, the remaining digits are resolved from
// shared memory and the scores are not read again.
inline constexpr int kTopkCandidates = 8192;
// Streaming kernel: largest cluster (the portable limit of sm_90) and the
// fewest ids a block of a multi-block row keeps.
inline constexpr int kTopkMaxCluster = 8;
inline constexpr int64_t kTopkMinSliceRecords = 8192;

// Resident kernel: threads of one block (one block per SM), the most ids one
// block holds in shared memory, the fewest ids a block of a multi-block row
// keeps under the automatic plan, the candidates (ids at or above the bucket
// of the k-th largest key) one block may gather with the largest slice (a
// smaller slice leaves room for up to twice as many), and the largest cluster.
inline constexpr int kTopkResidentThreads = 1024;
inline constexpr int64_t kTopkResidentMaxSlice = 32768;
inline constexpr int64_t kTopkResidentMinSlice = 4096;
inline constexpr int kTopkResidentCandidates = 4096;
inline constexpr int kTopkResidentMaxCluster = 16;

// Largest R either kernel takes (its id arithmetic is int32 with headroom).
inline constexpr int64_t kTopkMaxRecords = int64_t{1} << 30;

enum class TopkKernelKind { kAuto, kStreaming, kResident };

// Overrides of the automatic plan, for the standalone check and benchmarks.
struct TopkLaunchOptions {
  TopkKernelKind kernel = TopkKernelKind::kAuto;
  // Blocks per row: 0 = the kernel's automatic choice; else streaming 1, 2,
  // 4, 8, resident 1 to 8 or 16. Must be 0 when kernel is kAuto.
  int cluster = 0;
  // Candidate capacity per block: -1 = the kernel's default (kTopkCandidates;
  // resident: kTopkResidentCandidates, more where the slice leaves room),
  // else 0 up to kTopkCandidates (resident: kTopkResidentCandidates, a
  // multiple of 4). 0 disables the candidate lists: every pass then reads
  // all ids (the streaming kernel re-reads global memory).
  int candidates = -1;
};

// What LaunchTopk runs for given sizes and options; cluster 0 when nothing
// can run them (sizes outside the limits, invalid options, a resident slice
// above kTopkResidentMaxSlice, or a cluster size the device cannot schedule).
struct TopkLaunchPlan {
  TopkKernelKind kernel = TopkKernelKind::kAuto;
  int cluster = 0;  // blocks per row
};

// The plan LaunchTopk uses on the current device.
TopkLaunchPlan TopkPlan(const TopkDims& dims, const TopkLaunchOptions& options = {});

// Selects every row (topk.h, rules 1-3). `workspace` is device memory of
// dims.rows x TopkWorkspaceWords(R) uint32 the streaming kernel may overwrite
// (no initialization needed; the resident kernel leaves it alone). Enqueues
// one kernel on `stream` (none when k or rows is 0); no allocation, no
// synchronization, no read of device data on the host. Returns the first
// error; `failed_kernel`, when not null, then names the kernel. Requires
// dims to pass CheckTopk and R <= kTopkMaxRecords.
cudaError_t LaunchTopk(const TopkDims& dims, const TopkBuffers& io, uint32_t* workspace,
                       cudaStream_t stream, const TopkLaunchOptions& options = {},
                       const char** failed_kernel = nullptr);

#ifdef HISPARSE_TOPK_TRACE
// The trace build (diagnosis only): the resident kernel's phase stamps of its last launch,
// [blocks][kTopkTraceSlots] ns of %globaltimer, 0 where a block did not reach a phase.
inline constexpr int kTopkTraceSlots = 16;
cudaError_t TopkReadTrace(unsigned long long* ns, int blocks);
cudaError_t TopkClearTrace();
// The launch floor: an empty kernel in the resident plan's launch shape for `dims` (grid,
// clusters, threads, shared memory), or the same grid and threads without the clusters, without
// the dynamic shared memory or without both (which part of the launch costs the time); an error
// where the plan is not the resident kernel.
enum class TopkFloorShape { kPlanned, kNoClusters, kNoSharedMemory, kNeither };
cudaError_t LaunchTopkEmptyResident(const TopkDims& dims, cudaStream_t stream, const TopkLaunchOptions& options = {},
                                    TopkFloorShape shape = TopkFloorShape::kPlanned);
#endif

}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_CUDA_H_

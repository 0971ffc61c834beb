// What TOP-K's kernels and their launchers share (topk_kernels.cu is the one
// translation unit that includes it): constants, cluster primitives, the key
// of a score and the loads of a lane's ids.
#ifndef HISPARSE_FFI_TOPK_DEVICE_CUH_
#define HISPARSE_FFI_TOPK_DEVICE_CUH_

#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "topk_cuda.h"

namespace hisparse {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxDevices = 64;

// Cluster primitives; a cluster of one is a plain block (no cluster launch).
template <int kCluster>
struct Cluster {
  static __device__ __forceinline__ unsigned Rank() {
    if constexpr (kCluster == 1) {
      return 0;
    } else {
      return cg::this_cluster().block_rank();
    }
  }
  // Barrier over the cluster's threads; shared-memory writes before it are
  // visible to every block of the cluster after it.
  static __device__ __forceinline__ void Sync() {
    if constexpr (kCluster == 1) {
      __syncthreads();
    } else {
      cg::this_cluster().sync();
    }
  }
  // Sync split in two: Arrive once this block reads no peer's shared memory
  // any more, Wait before it exits (a block's shared memory must outlive its
  // peers' reads of it). Work between the two overlaps the barrier.
  static __device__ __forceinline__ void Arrive() {
    if constexpr (kCluster > 1) (void)cg::this_cluster().barrier_arrive();
  }
  static __device__ __forceinline__ void Wait() {
    if constexpr (kCluster > 1) cg::this_cluster().barrier_wait();
  }
  // `p` in the shared memory of block `rank` of the cluster.
  template <typename T>
  static __device__ __forceinline__ T* Map(T* p, unsigned rank) {
    if constexpr (kCluster == 1) {
      return p;
    } else {
      return cg::this_cluster().map_shared_rank(p, rank);
    }
  }
};

// Inclusive prefix sum of v over the warp's lanes (lane 0 first); warp-collective.
__device__ __forceinline__ unsigned long long WarpInclusiveSum(unsigned long long v, int lane) {
  unsigned long long inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const unsigned long long x = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += x;
  }
  return inclusive;
}

// Diagnosis only, never in a shipped build: -DHISPARSE_TOPK_TRACE makes thread 0 of each block of
// the resident kernel stamp %globaltimer (ns, comparable across blocks) at its phases;
// topk_bench prints where a launch's time goes (TopkReadTrace).
#ifdef HISPARSE_TOPK_TRACE
constexpr int kTopkTraceBlocks = 1024;
__device__ unsigned long long g_topk_trace_ns[kTopkTraceBlocks][kTopkTraceSlots];
__device__ __forceinline__ void TopkStamp(int slot) {
  if (threadIdx.x != 0 || blockIdx.x >= kTopkTraceBlocks) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_topk_trace_ns[blockIdx.x][slot] = t;
}
#else
__device__ __forceinline__ void TopkStamp(int) {}
#endif

__device__ __forceinline__ uint32_t KeyOf(float score) {
  return TopkOrderedKey(__float_as_uint(score));
}

// Adds 1 to hist[bin] for every active lane; warp-collective. Shared-memory
// atomics on one address serialize, so a warp whose active lanes share one
// bin (ties, quantized scores, a narrow bucket) adds its count once.
__device__ __forceinline__ void HistogramAdd(uint32_t* hist, uint32_t bin, bool active, int lane) {
  const unsigned lanes = __ballot_sync(kFullMask, active);
  if (lanes == 0) return;
  const int leader = __ffs(lanes) - 1;
  const uint32_t leader_bin = __shfl_sync(kFullMask, bin, leader);
  if (__all_sync(kFullMask, !active || bin == leader_bin)) {
    if (lane == leader) atomicAdd(&hist[leader_bin], static_cast<uint32_t>(__popc(lanes)));
  } else if (active) {
    atomicAdd(&hist[bin], 1u);
  }
}

// A lane's 4 consecutive ids: their keys and which lie in the range.
struct Quad {
  uint32_t key[4];
  unsigned valid;  // bit j: id first + j lies below `end`
};

__device__ __forceinline__ Quad LoadQuad(const float* row, int first, int end, bool vec4) {
  Quad q;
  if (vec4 && first + 3 < end) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(row + first));
    q.key[0] = KeyOf(v.x);
    q.key[1] = KeyOf(v.y);
    q.key[2] = KeyOf(v.z);
    q.key[3] = KeyOf(v.w);
    q.valid = 0xfu;
    return q;
  }
  q.valid = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool in = first + j < end;
    q.key[j] = in ? KeyOf(__ldg(row + first + j)) : 0u;
    q.valid |= in ? 1u << j : 0u;
  }
  return q;
}

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_DEVICE_CUH_

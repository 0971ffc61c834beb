// Warpgroup MMA primitives shared by the sm_90a kernels (indexer_wgmma.cuh,
// sparse_attention_wgmma.cuh): the shared-memory matrix descriptor and the
// wgmma fences. Included at the top of a kernel file, outside its namespaces.
#ifndef HISPARSE_FFI_WGMMA_CUH_
#define HISPARSE_FFI_WGMMA_CUH_

#include <cstdint>

namespace hisparse::wgmma {

// A shared-memory matrix descriptor, no swizzle: start, leading (K-direction) and stride
// (M/N-direction) byte offsets between core matrices, in 16 bytes (PTX "Matrix Descriptor").
__device__ __forceinline__ uint64_t Descriptor(uint32_t address, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3ffff) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void Fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void Commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WaitAll() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// A new definition of an operand register: after the wait that lands it (no read of it moves
// above the wait), or before the fence that hands it to wgmma (no write of it moves below the
// fence, where ptxas would inject a warpgroup.arrive of its own). CUTLASS's warpgroup_fence_operand.
__device__ __forceinline__ void Keep(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void Keep(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
#endif

}  // namespace hisparse::wgmma

#endif  // HISPARSE_FFI_WGMMA_CUH_

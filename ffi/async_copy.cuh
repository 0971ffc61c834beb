// The Hopper copy engine (TMA bulk copies, global -> shared) and the shared-memory mbarriers that
// hand its bytes over, shared by the kernels that stream through shared memory
// (sparse_attention_kernels.cu, sparse_attention_wgmma.cuh, grouped_matmul_stream.cuh). sm_90
// instructions: callers compile them under __CUDA_ARCH__ >= 900 only. Included at the top of a
// kernel file, outside its anonymous namespace.
#ifndef HISPARSE_FFI_ASYNC_COPY_CUH_
#define HISPARSE_FFI_ASYNC_COPY_CUH_

#include <cstdint>

namespace hisparse {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
}
// One arrival that also expects `bytes` more of the copies completing on `bar` this phase.
__device__ __forceinline__ void MbarArriveExpectTx(unsigned long long* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}
// One arrival of this thread (a consumer that has read a buffer to its end).
__device__ __forceinline__ void MbarArrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
// Spins until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void MbarWait(unsigned long long* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared by the TMA engine,
// completing on `bar`: one instruction for a whole row, where 16-byte loads take one per piece.
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
// The same copy with an L2 eviction policy (createpolicy).
__device__ __forceinline__ void BulkCopyHint(void* dst, const void* src, uint32_t bytes, unsigned long long* bar,
                                             uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar)), "l"(policy)
      : "memory");
}
// Generic-proxy accesses of this thread (zero fills; reads ordered before it by a barrier) before
// the async proxy's next writes of the same shared memory.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace hisparse

#endif  // HISPARSE_FFI_ASYNC_COPY_CUH_

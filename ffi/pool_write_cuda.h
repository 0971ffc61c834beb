// The pool write on a CUDA device: its launcher on raw pointers, no XLA types.
// The kernel lives with RESOLVE's fetch kernel (resolve_fetch_kernels.cuh,
// compiled in resolve_kernels.cu), whose record copy it shares.
#ifndef HISPARSE_FFI_POOL_WRITE_CUDA_H_
#define HISPARSE_FFI_POOL_WRITE_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pool_write.h"

namespace hisparse {

// host_pool[l, s, start[s] + i] = records[l, s, i] for i < min(count[s], n)
// (count < 0 writes nothing); rows outside [0, R) are skipped. records is in
// device memory, start and count are device arrays [S], host_pool is pinned
// host memory (UVA pointer). One warp per row.
cudaError_t LaunchPoolWrite(const PoolWriteDims& dims, const uint8_t* records,
                            const int32_t* start, const int32_t* count, uint8_t* host_pool,
                            cudaStream_t stream, const char** failed_kernel = nullptr);

}  // namespace hisparse

#endif  // HISPARSE_FFI_POOL_WRITE_CUDA_H_

// XLA FFI handler of the pool write for platform "CUDA": check, carry the pool
// when XLA did not donate it, then enqueue the kernel (pool_write_cuda.h). It
// only enqueues work on XLA's stream, so it is marked kCmdBufferCompatible.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "pool_write.h"
#include "pool_write_checks.h"
#include "pool_write_cuda.h"

namespace hisparse {
namespace {

ffi::Error PoolWriteCudaImpl(cudaStream_t stream, ffi::AnyBuffer pool_in, ffi::AnyBuffer records,
                             ffi::AnyBuffer start, ffi::AnyBuffer count,
                             ffi::Result<ffi::AnyBuffer> pool) {
  constexpr const char* op = "hisparse_pool_write";
  auto dims = CheckPoolWrite(pool_in, records, start, count);
  if (dims.has_error()) return dims.error();
  if (auto err = Carry(op, "host_pool", pool_in, pool, stream); err.failure())
    return err;
  const char* failed_kernel = "hisparse pool write kernel";
  const cudaError_t err =
      LaunchPoolWrite(*dims, static_cast<const uint8_t*>(records.untyped_data()),
                      static_cast<const int32_t*>(start.untyped_data()),
                      static_cast<const int32_t*>(count.untyped_data()),
                      static_cast<uint8_t*>(pool->untyped_data()), stream, &failed_kernel);
  return LaunchResult(op, failed_kernel, err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparsePoolWriteCuda, hisparse::PoolWriteCudaImpl,
                             hisparse::BindPoolWriteOperands);

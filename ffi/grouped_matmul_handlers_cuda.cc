// XLA FFI handler of "hisparse_grouped_matmul" for platform "CUDA": check the
// operands, then enqueue the kernel of grouped_matmul_kernels.cu. It only
// enqueues work on XLA's stream (group_sizes stay on the device, read by the
// kernel), so it is marked kCmdBufferCompatible. There is no CPU handler: on
// CPU the op runs its XLA reference (hisparse_jax/grouped_matmul.py).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "grouped_matmul.h"
#include "grouped_matmul_checks.h"
#include "grouped_matmul_cuda.h"

#if defined(HISPARSE_GROUPED_MATMUL_TILE_ROWS) && HISPARSE_GROUPED_MATMUL_TILE_ROWS != 0
#error "HISPARSE_GROUPED_MATMUL_TILE_ROWS is for the standalone checker and benchmark: the custom call's weights are row-major"
#endif

namespace hisparse {
namespace {

ffi::Error GroupedMatmulCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                                 ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer> y) {
  auto dims = CheckGroupedMatmul(x, w, scale, group_sizes, y->element_type(), y->dimensions());
  if (dims.has_error()) return dims.error();
  const GroupedMatmulBuffers io = GroupedMatmulIo(x, w, scale, group_sizes, y);
  // XLA aligns buffers to far more than this; a misaligned view would fault in the 16-byte loads.
  if (!Aligned(io.x, 16) || !Aligned(io.w, 16))
    return ffi::Error::InvalidArgument("hisparse_grouped_matmul: x and w must be 16-byte aligned");
  const cudaError_t err = LaunchGroupedMatmul(*dims, io, stream);
  return LaunchResult("hisparse_grouped_matmul", "kernel", err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseGroupedMatmulCuda, hisparse::GroupedMatmulCudaImpl,
                             hisparse::BindGroupedMatmulOperands);

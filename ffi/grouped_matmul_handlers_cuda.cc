// XLA FFI handlers of "hisparse_grouped_matmul" and of its pair for platform
// "CUDA": check the operands, then enqueue the kernel of
// grouped_matmul_kernels.cu (the pair: both launches, side by side, through
// LaunchGroupedMatmulPair). They only enqueue work (group_sizes stay on the
// device, read by the kernel; the pair's side stream forks from XLA's stream and
// joins it again within the call), so both are marked kCmdBufferCompatible.
// There is no CPU handler: on CPU the ops run their XLA reference
// (hisparse_jax/grouped_matmul.py).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "grouped_matmul.h"
#include "grouped_matmul_checks.h"
#include "grouped_matmul_cuda.h"

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

ffi::Error GroupedMatmulPairCudaImpl(cudaStream_t stream, ffi::AnyBuffer x0, ffi::AnyBuffer w0, ffi::AnyBuffer scale0,
                                     ffi::AnyBuffer group_sizes0, ffi::AnyBuffer x1, ffi::AnyBuffer w1,
                                     ffi::AnyBuffer scale1, ffi::AnyBuffer group_sizes1,
                                     ffi::Result<ffi::AnyBuffer> y0, ffi::Result<ffi::AnyBuffer> y1) {
  auto first = CheckGroupedMatmul(x0, w0, scale0, group_sizes0, y0->element_type(), y0->dimensions());
  if (first.has_error()) return ffi::Error::InvalidArgument("hisparse_grouped_matmul_pair (first matmul): " + first.error().message());
  auto second = CheckGroupedMatmul(x1, w1, scale1, group_sizes1, y1->element_type(), y1->dimensions());
  if (second.has_error()) return ffi::Error::InvalidArgument("hisparse_grouped_matmul_pair (second matmul): " + second.error().message());
  const GroupedMatmulBuffers io0 = GroupedMatmulIo(x0, w0, scale0, group_sizes0, y0);
  const GroupedMatmulBuffers io1 = GroupedMatmulIo(x1, w1, scale1, group_sizes1, y1);
  if (!Aligned(io0.x, 16) || !Aligned(io0.w, 16) || !Aligned(io1.x, 16) || !Aligned(io1.w, 16))
    return ffi::Error::InvalidArgument("hisparse_grouped_matmul_pair: x and w must be 16-byte aligned");
  const cudaError_t err = LaunchGroupedMatmulPair(*first, io0, *second, io1, stream);
  return LaunchResult("hisparse_grouped_matmul_pair", "kernels", err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseGroupedMatmulCuda, hisparse::GroupedMatmulCudaImpl,
                             hisparse::BindGroupedMatmulOperands);
HISPARSE_DEFINE_CUDA_HANDLER(HisparseGroupedMatmulPairCuda, hisparse::GroupedMatmulPairCudaImpl,
                             hisparse::BindGroupedMatmulPairOperands);

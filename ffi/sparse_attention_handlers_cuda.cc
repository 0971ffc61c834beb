// XLA FFI handler of "hisparse_sparse_attention" for platform "CUDA": check the operands, then
// enqueue the kernels of sparse_attention_kernels.cu. It only enqueues work on XLA's stream (the
// indices stay on the device), so it is marked kCmdBufferCompatible. The per-chunk partials go to
// a second output the Python op drops (a workspace XLA allocates and can reuse). There is no CPU
// handler: on CPU the op runs its XLA reference (hisparse_jax/sparse_attention.py).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"
#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "sparse_attention.h"
#include "sparse_attention_checks.h"
#include "sparse_attention_cuda.h"

namespace hisparse {
namespace {

ffi::Error SparseAttentionCudaImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer source, ffi::AnyBuffer layer,
                                   ffi::AnyBuffer index,
                                   ffi::AnyBuffer tail, ffi::AnyBuffer tail_valid, ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> workspace, float scale) {
  auto shape = CheckSparseAttention(q, source, layer, index, tail, tail_valid, out->dimensions(), out->element_type(),
                                    workspace->dimensions(), workspace->element_type());
  if (shape.has_error()) return shape.error();
  // cp.async moves 16-byte pieces: every row of q, source and tail starts 16-byte aligned when the
  // buffer does (1152-B rows); XLA aligns buffers to far more.
  if (!Aligned(q.untyped_data(), 16) || !Aligned(source.untyped_data(), 16) || !Aligned(tail.untyped_data(), 16))
    return ffi::Error::InvalidArgument("hisparse_sparse_attention: q, source and tail must be 16-byte aligned");
  const cudaError_t err = LaunchSparseAttention(
      *shape, scale, static_cast<const uint16_t*>(q.untyped_data()), static_cast<const uint16_t*>(source.untyped_data()),
      static_cast<const int32_t*>(layer.untyped_data()), static_cast<const int32_t*>(index.untyped_data()), static_cast<const uint16_t*>(tail.untyped_data()),
      static_cast<const uint8_t*>(tail_valid.untyped_data()), static_cast<float*>(out->untyped_data()),
      static_cast<float*>(workspace->untyped_data()), stream);
  return LaunchResult("hisparse_sparse_attention", "kernels", err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseSparseAttentionCuda, hisparse::SparseAttentionCudaImpl,
                             hisparse::BindSparseAttentionOperands);

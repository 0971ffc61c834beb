// Stream and buffer plumbing shared by the handlers for platform "CUDA".
#ifndef HISPARSE_FFI_COMMON_HANDLERS_CUDA_H_
#define HISPARSE_FFI_COMMON_HANDLERS_CUDA_H_

#include <cuda_runtime_api.h>

#include <string>

#include "common_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// A binding that starts with XLA's CUDA stream; every CUDA handler takes it first.
inline auto BindWithStream() {
  return xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>();
}

// Defines the exported handler `symbol` for platform "CUDA": `impl` bound to
// XLA's stream, then to the op's operands (`bind_operands`, a Bind*Operands),
// and safe to record into a command buffer (a CUDA graph).
#define HISPARSE_DEFINE_CUDA_HANDLER(symbol, impl, bind_operands)                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, impl, bind_operands(::hisparse::BindWithStream()), \
                                {xla::ffi::Traits::kCmdBufferCompatible})

// Without donation XLA hands a handler fresh output buffers: starts `out` from
// `in` (nothing when they are one buffer). Stream-ordered; cudaMemcpyDefault
// lets UVA pick the direction, so the same call carries device state and the
// pinned host pool.
inline xla::ffi::Error Carry(const char* op, const char* name, xla::ffi::AnyBuffer in,
                             xla::ffi::Result<xla::ffi::AnyBuffer>& out, cudaStream_t stream) {
  if (in.untyped_data() == out->untyped_data() || in.size_bytes() == 0)
    return xla::ffi::Error::Success();
  const cudaError_t err = cudaMemcpyAsync(out->untyped_data(), in.untyped_data(), in.size_bytes(),
                                          cudaMemcpyDefault, stream);
  if (err != cudaSuccess) return CudaError(op, std::string("copying ") + name + " to its output", err);
  return xla::ffi::Error::Success();
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_COMMON_HANDLERS_CUDA_H_

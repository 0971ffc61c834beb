// CUDA errors as XLA errors, shared by every CUDA handler: one wording for
// every failed runtime call and kernel launch.
#ifndef HISPARSE_FFI_COMMON_CUDA_H_
#define HISPARSE_FFI_COMMON_CUDA_H_

#include <cuda_runtime_api.h>

#include <string>

#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Internal "OP: WHAT failed: cudaErrorName (its text)".
inline xla::ffi::Error CudaError(const char* op, const std::string& what, cudaError_t err) {
  return xla::ffi::Error::Internal(std::string(op) + ": " + what + " failed: " +
                                   cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Success, or "OP: launching the KERNEL failed: ..." when `err` is an error.
inline xla::ffi::Error LaunchResult(const char* op, const char* kernel, cudaError_t err) {
  if (err != cudaSuccess) return CudaError(op, std::string("launching the ") + kernel, err);
  return xla::ffi::Error::Success();
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_COMMON_CUDA_H_

// What the CUDA RESOLVE handler (handlers_cuda.cc) shares with the prefetch
// handlers (prefetch_handlers_cuda.cc).
#ifndef HISPARSE_FFI_HANDLERS_CUDA_H_
#define HISPARSE_FFI_HANDLERS_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace hisparse {

// An Internal error "OP: WHAT failed: cudaErrorName (its text)".
xla::ffi::Error CudaError(const char* op, const std::string& what, cudaError_t err);

// Without donation XLA hands a handler fresh output buffers: starts `out` from
// `in` (nothing when they are one buffer). Stream-ordered; cudaMemcpyDefault
// lets UVA pick the direction, so the same call carries device state and the
// pinned host pool.
xla::ffi::Error Carry(const char* op, const char* name, xla::ffi::AnyBuffer in,
                      xla::ffi::Result<xla::ffi::AnyBuffer>& out, cudaStream_t stream);

// Checks RESOLVE's operands, carries the state and enqueues RESOLVE on
// `stream`. prefetch_slot < 0: RESOLVE itself. prefetch_slot >= 0: the
// prefetch variant (prefetch.h): the decision on `stream`, the copy (with
// fetch) forked onto the prefetch stream and recorded under the slot.
xla::ffi::Error ResolveCudaLaunch(
    cudaStream_t stream, xla::ffi::AnyBuffer pool, xla::ffi::AnyBuffer selection,
    xla::ffi::AnyBuffer sealed, xla::ffi::AnyBuffer layer, xla::ffi::AnyBuffer hot_in,
    xla::ffi::AnyBuffer slot_record_in, xla::ffi::AnyBuffer lru_in,
    xla::ffi::Result<xla::ffi::AnyBuffer> slots, xla::ffi::Result<xla::ffi::AnyBuffer> miss_records,
    xla::ffi::Result<xla::ffi::AnyBuffer> miss_slots, xla::ffi::Result<xla::ffi::AnyBuffer> misses,
    xla::ffi::Result<xla::ffi::AnyBuffer> invalid, xla::ffi::Result<xla::ffi::AnyBuffer> malformed,
    xla::ffi::Result<xla::ffi::AnyBuffer> hot, xla::ffi::Result<xla::ffi::AnyBuffer> slot_record,
    xla::ffi::Result<xla::ffi::AnyBuffer> lru, bool fetch, int32_t launch, int64_t prefetch_slot);

}  // namespace hisparse

#endif  // HISPARSE_FFI_HANDLERS_CUDA_H_

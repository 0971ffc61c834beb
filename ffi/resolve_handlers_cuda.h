// What the CUDA RESOLVE handler (resolve_handlers_cuda.cc) shares with the
// prefetch handlers (prefetch_handlers_cuda.cc).
#ifndef HISPARSE_FFI_RESOLVE_HANDLERS_CUDA_H_
#define HISPARSE_FFI_RESOLVE_HANDLERS_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "resolve_checks.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Checks RESOLVE's operands and stream range, carries the state and enqueues
// RESOLVE of the range's streams on `stream`. prefetch_slot < 0: RESOLVE
// itself. prefetch_slot >= 0: the prefetch variant (prefetch.h): the decision
// on `stream`, the copy (with fetch) forked onto the prefetch stream and
// recorded under the slot.
xla::ffi::Error ResolveCudaLaunch(cudaStream_t stream, ResolveOperands& ops, bool fetch,
                                  int32_t launch, int64_t stream_begin, int64_t stream_count,
                                  int64_t prefetch_slot);

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_HANDLERS_CUDA_H_

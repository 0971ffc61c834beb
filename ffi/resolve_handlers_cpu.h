// The CPU RESOLVE handler's body, shared by RESOLVE (resolve_handlers_cpu.cc)
// and the prefetch variant (prefetch_handlers_cpu.cc), which on CPU resolves
// the same way.
#ifndef HISPARSE_FFI_RESOLVE_HANDLERS_CPU_H_
#define HISPARSE_FFI_RESOLVE_HANDLERS_CPU_H_

#include <cstdint>

#include "resolve_checks.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Checks the operands and the stream range (errors prefixed with `op`),
// carries the state when XLA did not donate it, then resolves on the calling
// thread. `launch` is CUDA's, unused here.
xla::ffi::Error ResolveCpuImpl(const char* op, ResolveOperands& ops, bool fetch, int32_t launch,
                               int64_t stream_begin, int64_t stream_count);

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_HANDLERS_CPU_H_

// Buffer plumbing shared by the handlers for platform "cpu".
#ifndef HISPARSE_FFI_COMMON_HANDLERS_CPU_H_
#define HISPARSE_FFI_COMMON_HANDLERS_CPU_H_

#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Without donation XLA hands a handler fresh output buffers: starts `out`
// from `in` (nothing when they are one buffer).
inline void CarryCpu(xla::ffi::AnyBuffer in, xla::ffi::Result<xla::ffi::AnyBuffer>& out) {
  if (in.untyped_data() != out->untyped_data())
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_COMMON_HANDLERS_CPU_H_

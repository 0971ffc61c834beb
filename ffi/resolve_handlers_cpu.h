// The CPU RESOLVE handler's body, shared by RESOLVE (handlers_cpu.cc) and the
// prefetch variant (prefetch_handlers_cpu.cc), which on CPU resolves the same way.
#ifndef HISPARSE_FFI_HANDLERS_CPU_H_
#define HISPARSE_FFI_HANDLERS_CPU_H_

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace hisparse {

xla::ffi::Error ResolveCpuImpl(
    xla::ffi::AnyBuffer pool, xla::ffi::AnyBuffer selection, xla::ffi::AnyBuffer sealed,
    xla::ffi::AnyBuffer layer, xla::ffi::AnyBuffer hot_in, xla::ffi::AnyBuffer slot_record_in,
    xla::ffi::AnyBuffer lru_in, xla::ffi::Result<xla::ffi::AnyBuffer> slots,
    xla::ffi::Result<xla::ffi::AnyBuffer> miss_records, xla::ffi::Result<xla::ffi::AnyBuffer> miss_slots,
    xla::ffi::Result<xla::ffi::AnyBuffer> misses, xla::ffi::Result<xla::ffi::AnyBuffer> invalid,
    xla::ffi::Result<xla::ffi::AnyBuffer> malformed, xla::ffi::Result<xla::ffi::AnyBuffer> hot,
    xla::ffi::Result<xla::ffi::AnyBuffer> slot_record, xla::ffi::Result<xla::ffi::AnyBuffer> lru,
    bool fetch, int32_t launch);

}  // namespace hisparse

#endif  // HISPARSE_FFI_HANDLERS_CPU_H_

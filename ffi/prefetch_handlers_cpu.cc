// XLA FFI handlers of the prefetch calls (prefetch.h) for platform "cpu":
// nothing runs on another stream here, so the resolve copies in place and the
// join only hands its operands on.
#include <cstring>

#include "handlers_cpu.h"
#include "prefetch_checks.h"

namespace hisparse {
namespace {

ffi::Error ResolvePrefetchCpuImpl(ffi::AnyBuffer pool, ffi::AnyBuffer selection, ffi::AnyBuffer sealed,
                                  ffi::AnyBuffer layer, ffi::AnyBuffer hot_in,
                                  ffi::AnyBuffer slot_record_in, ffi::AnyBuffer lru_in,
                                  ffi::Result<ffi::AnyBuffer> slots,
                                  ffi::Result<ffi::AnyBuffer> miss_records,
                                  ffi::Result<ffi::AnyBuffer> miss_slots,
                                  ffi::Result<ffi::AnyBuffer> misses,
                                  ffi::Result<ffi::AnyBuffer> invalid,
                                  ffi::Result<ffi::AnyBuffer> malformed,
                                  ffi::Result<ffi::AnyBuffer> hot,
                                  ffi::Result<ffi::AnyBuffer> slot_record,
                                  ffi::Result<ffi::AnyBuffer> lru, bool fetch, int32_t launch,
                                  int64_t prefetch_slot) {
  if (auto err = CheckPrefetchSlot("hisparse_resolve_prefetch", prefetch_slot); err.failure())
    return err;
  return ResolveCpuImpl(pool, selection, sealed, layer, hot_in, slot_record_in, lru_in, slots,
                        miss_records, miss_slots, misses, invalid, malformed, hot, slot_record, lru,
                        fetch, launch);
}

ffi::Error PrefetchJoinCpuImpl(ffi::AnyBuffer hot_in, ffi::AnyBuffer misses_in,
                               ffi::AnyBuffer miss_records, ffi::AnyBuffer miss_slots,
                               ffi::AnyBuffer layer, ffi::AnyBuffer /*after*/,
                               ffi::Result<ffi::AnyBuffer> hot, ffi::Result<ffi::AnyBuffer> misses,
                               int64_t prefetch_slot) {
  if (auto err = CheckPrefetchJoin(hot_in, misses_in, miss_records, miss_slots, layer, hot, misses,
                                   prefetch_slot);
      err.failure())
    return err;
  // Without donation XLA hands us fresh output buffers: start them from the inputs.
  for (auto [in, out] : {std::pair{hot_in, &hot}, {misses_in, &misses}}) {
    if (in.untyped_data() != (*out)->untyped_data())
      std::memcpy((*out)->untyped_data(), in.untyped_data(), in.size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparseResolvePrefetchCpu, hisparse::ResolvePrefetchCpuImpl,
                              hisparse::WithPrefetchSlot(hisparse::BindResolveOperands(xla::ffi::Ffi::Bind())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparsePrefetchJoinCpu, hisparse::PrefetchJoinCpuImpl,
                              hisparse::BindPrefetchJoinOperands(xla::ffi::Ffi::Bind()));

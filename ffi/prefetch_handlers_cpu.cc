// XLA FFI handlers of the prefetch calls (prefetch.h) for platform "cpu":
// nothing runs on another stream here, so the resolve copies in place and the
// join only hands its operands on.
#include <cstdint>

#include "common_handlers_cpu.h"
#include "prefetch_checks.h"
#include "resolve_checks.h"
#include "resolve_handlers_cpu.h"

namespace hisparse {
namespace {

ffi::Error ResolvePrefetchCpuImpl(ResolveOperands& ops, bool fetch, int32_t launch,
                                  int64_t stream_begin, int64_t stream_count, int64_t prefetch_slot) {
  constexpr const char* op = "hisparse_resolve_prefetch";
  if (auto err = CheckPrefetchSlot(op, prefetch_slot); err.failure()) return err;
  return ResolveCpuImpl(op, ops, fetch, launch, stream_begin, stream_count);
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
  CarryCpu(hot_in, hot);
  CarryCpu(misses_in, misses);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HisparseResolvePrefetchCpu, hisparse::WithResolveOperands(hisparse::ResolvePrefetchCpuImpl),
    hisparse::WithPrefetchSlot(hisparse::BindResolveOperands(xla::ffi::Ffi::Bind())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparsePrefetchJoinCpu, hisparse::PrefetchJoinCpuImpl,
                              hisparse::BindPrefetchJoinOperands(xla::ffi::Ffi::Bind()));

// XLA FFI handler of RESOLVE for platform "cpu": check, then run the
// raw-pointer code of resolve_cpu.cc.
#include "resolve_handlers_cpu.h"

#include "common_handlers_cpu.h"
#include "resolve.h"
#include "resolve_checks.h"

namespace hisparse {

ffi::Error ResolveCpuImpl(const char* op, ResolveOperands& ops, bool fetch,
                          int32_t /*launch: CUDA only*/, int64_t stream_begin, int64_t stream_count) {
  auto dims = CheckResolve(ops);
  if (dims.has_error()) return dims.error();
  auto range = CheckStreamRange(op, *dims, stream_begin, stream_count);
  if (range.has_error()) return range.error();
  CarryCpu(ops.hot_in, ops.hot);
  CarryCpu(ops.slot_record_in, ops.slot_record);
  CarryCpu(ops.lru_in, ops.lru);
  const int32_t layer_index = *static_cast<const int32_t*>(ops.layer.untyped_data());
  ResolveCpu(*dims, *range, layer_index, ResolveIo(ops), fetch);
  return ffi::Error::Success();
}

namespace {

ffi::Error ResolveOnlyCpuImpl(ResolveOperands& ops, bool fetch, int32_t launch, int64_t stream_begin,
                              int64_t stream_count) {
  return ResolveCpuImpl("hisparse_resolve", ops, fetch, launch, stream_begin, stream_count);
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparseResolveCpu,
                              hisparse::WithResolveOperands(hisparse::ResolveOnlyCpuImpl),
                              hisparse::BindResolveOperands(xla::ffi::Ffi::Bind()));

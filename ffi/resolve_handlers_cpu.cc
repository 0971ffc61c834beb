// XLA FFI handlers for platform "cpu": check, then run the raw-pointer code.
#include <cstring>

#include "ffi_checks.h"
#include "handlers_cpu.h"
#include "resolve.h"

namespace hisparse {

ffi::Error ResolveCpuImpl(ffi::AnyBuffer pool, ffi::AnyBuffer selection, ffi::AnyBuffer sealed,
                          ffi::AnyBuffer layer, ffi::AnyBuffer hot_in,
                          ffi::AnyBuffer slot_record_in, ffi::AnyBuffer lru_in,
                          ffi::Result<ffi::AnyBuffer> slots,
                          ffi::Result<ffi::AnyBuffer> miss_records,
                          ffi::Result<ffi::AnyBuffer> miss_slots,
                          ffi::Result<ffi::AnyBuffer> misses,
                          ffi::Result<ffi::AnyBuffer> invalid,
                          ffi::Result<ffi::AnyBuffer> malformed, ffi::Result<ffi::AnyBuffer> hot,
                          ffi::Result<ffi::AnyBuffer> slot_record,
                          ffi::Result<ffi::AnyBuffer> lru, bool fetch,
                          int32_t /*launch: CUDA only*/) {
  auto dims = CheckResolve(pool, selection, sealed, layer, hot_in, slot_record_in, lru_in);
  if (dims.has_error()) return dims.error();
  // Without donation XLA hands us fresh output buffers: start them from the inputs.
  auto carry = [](ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer>& out) {
    if (in.untyped_data() != out->untyped_data())
      std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
  };
  carry(hot_in, hot);
  carry(slot_record_in, slot_record);
  carry(lru_in, lru);
  const int32_t layer_index = *static_cast<const int32_t*>(layer.untyped_data());
  ResolveCpu(*dims, layer_index,
             ResolveIo(pool, selection, sealed, slots, miss_records, miss_slots, misses,
                       invalid, malformed, hot, slot_record, lru),
             fetch);
  return ffi::Error::Success();
}

namespace {

ffi::Error PoolWriteCpuImpl(ffi::AnyBuffer pool_in, ffi::AnyBuffer records,
                            ffi::AnyBuffer start, ffi::AnyBuffer count,
                            ffi::Result<ffi::AnyBuffer> pool) {
  auto dims = CheckPoolWrite(pool_in, records, start, count);
  if (dims.has_error()) return dims.error();
  if (pool_in.untyped_data() != pool->untyped_data())
    std::memcpy(pool->untyped_data(), pool_in.untyped_data(), pool_in.size_bytes());
  PoolWriteCpu(*dims, static_cast<const uint8_t*>(records.untyped_data()),
               static_cast<const int32_t*>(start.untyped_data()),
               static_cast<const int32_t*>(count.untyped_data()),
               static_cast<uint8_t*>(pool->untyped_data()));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparseResolveCpu, hisparse::ResolveCpuImpl,
                              hisparse::BindResolveOperands(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparsePoolWriteCpu, hisparse::PoolWriteCpuImpl,
                              hisparse::BindPoolWriteOperands(xla::ffi::Ffi::Bind()));

// XLA FFI handler of the pool write for platform "cpu": check, carry the pool
// when XLA did not donate it, then run pool_write_cpu.cc.
#include <cstdint>

#include "common_handlers_cpu.h"
#include "pool_write.h"
#include "pool_write_checks.h"

namespace hisparse {
namespace {

ffi::Error PoolWriteCpuImpl(ffi::AnyBuffer pool_in, ffi::AnyBuffer records,
                            ffi::AnyBuffer start, ffi::AnyBuffer count,
                            ffi::Result<ffi::AnyBuffer> pool) {
  auto dims = CheckPoolWrite(pool_in, records, start, count);
  if (dims.has_error()) return dims.error();
  CarryCpu(pool_in, pool);
  PoolWriteCpu(*dims, static_cast<const uint8_t*>(records.untyped_data()),
               static_cast<const int32_t*>(start.untyped_data()),
               static_cast<const int32_t*>(count.untyped_data()),
               static_cast<uint8_t*>(pool->untyped_data()));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparsePoolWriteCpu, hisparse::PoolWriteCpuImpl,
                              hisparse::BindPoolWriteOperands(xla::ffi::Ffi::Bind()));

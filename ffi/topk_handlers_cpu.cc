// XLA FFI handler of TOP-K for platform "cpu": check, then run topk_cpu.cc.
// The workspace output is the CUDA kernels' scratch; the CPU leaves it alone.
#include "topk.h"
#include "topk_checks.h"

namespace hisparse {
namespace {

ffi::Error TopkCpuImpl(ffi::AnyBuffer scores, ffi::AnyBuffer sealed,
                       ffi::Result<ffi::AnyBuffer> selected,
                       ffi::Result<ffi::AnyBuffer> workspace, int64_t k) {
  auto dims = CheckTopk(scores, sealed, selected, workspace, k);
  if (dims.has_error()) return dims.error();
  TopkCpu(*dims, TopkIo(scores, sealed, selected));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparseTopkCpu, hisparse::TopkCpuImpl,
                              hisparse::BindTopkOperands(xla::ffi::Ffi::Bind()));

// XLA FFI handler of MoE ROUTE for platform "cpu": check, then run
// moe_route_cpu.cc.
#include "moe_route.h"
#include "moe_route_checks.h"

namespace hisparse {
namespace {

ffi::Error MoeRouteCpuImpl(ffi::AnyBuffer scores, ffi::Result<ffi::AnyBuffer> chosen,
                           ffi::Result<ffi::AnyBuffer> weights, ffi::Result<ffi::AnyBuffer> order,
                           ffi::Result<ffi::AnyBuffer> inverse,
                           ffi::Result<ffi::AnyBuffer> group_sizes, int64_t k, int64_t experts,
                           float scaling) {
  auto dims = CheckMoeRoute(scores, chosen, weights, order, inverse, group_sizes, k, experts, scaling);
  if (dims.has_error()) return dims.error();
  MoeRouteCpu(*dims, MoeRouteIo(scores, chosen, weights, order, inverse, group_sizes));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparseMoeRouteCpu, hisparse::MoeRouteCpuImpl,
                              hisparse::BindMoeRouteOperands(xla::ffi::Ffi::Bind()));

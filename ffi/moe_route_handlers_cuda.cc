// XLA FFI handler of MoE ROUTE for platform "CUDA": check, refuse sizes
// outside the kernel's limits, then enqueue the one kernel of
// moe_route_kernels.cu. It only enqueues work on XLA's stream, so it is
// marked kCmdBufferCompatible.
#include <cuda_runtime_api.h>

#include <string>

#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "moe_route.h"
#include "moe_route_checks.h"
#include "moe_route_cuda.h"

namespace hisparse {
namespace {

ffi::Error OutsideLimit(const char* what, int64_t value, int64_t limit) {
  return ffi::Error::InvalidArgument(std::string("hisparse_moe_route: ") + what + " = " +
                                     std::to_string(value) + " exceeds the CUDA kernel's limit of " +
                                     std::to_string(limit) +
                                     "; route with implementation='reference'");
}

ffi::Error MoeRouteCudaImpl(cudaStream_t stream, ffi::AnyBuffer scores,
                            ffi::Result<ffi::AnyBuffer> chosen, ffi::Result<ffi::AnyBuffer> weights,
                            ffi::Result<ffi::AnyBuffer> order, ffi::Result<ffi::AnyBuffer> inverse,
                            ffi::Result<ffi::AnyBuffer> group_sizes, int64_t k, int64_t experts,
                            float scaling) {
  auto dims = CheckMoeRoute(scores, chosen, weights, order, inverse, group_sizes, k, experts, scaling);
  if (dims.has_error()) return dims.error();
  if (dims->tokens * dims->top_k > kMoeRouteMaxPairs)
    return OutsideLimit("pairs T x k", dims->tokens * dims->top_k, kMoeRouteMaxPairs);
  if (dims->scores > kMoeRouteMaxScores) return OutsideLimit("scores N", dims->scores, kMoeRouteMaxScores);
  if (dims->experts > kMoeRouteMaxExperts)
    return OutsideLimit("experts E", dims->experts, kMoeRouteMaxExperts);
  const cudaError_t err =
      LaunchMoeRoute(*dims, MoeRouteIo(scores, chosen, weights, order, inverse, group_sizes), stream);
  return LaunchResult("hisparse_moe_route", "hisparse moe route kernel", err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseMoeRouteCuda, hisparse::MoeRouteCudaImpl,
                             hisparse::BindMoeRouteOperands);

// MoE ROUTE operand checks shared by the CPU and CUDA handlers, and the
// operand list both bind. The Python API checks the same things first with
// friendlier messages; these keep a direct jax.ffi.ffi_call from handing a
// kernel buffers it would read or write out of bounds.
#ifndef HISPARSE_FFI_MOE_ROUTE_CHECKS_H_
#define HISPARSE_FFI_MOE_ROUTE_CHECKS_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"  // DimsString, Mismatch
#include "moe_route.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Validates the ROUTE operands and derives their sizes.
inline ffi::ErrorOr<MoeRouteDims> CheckMoeRoute(ffi::AnyBuffer scores,
                                                ffi::Result<ffi::AnyBuffer> chosen,
                                                ffi::Result<ffi::AnyBuffer> weights,
                                                ffi::Result<ffi::AnyBuffer> order,
                                                ffi::Result<ffi::AnyBuffer> inverse,
                                                ffi::Result<ffi::AnyBuffer> group_sizes,
                                                int64_t k, int64_t experts, float scaling) {
  constexpr const char* op = "hisparse_moe_route";
  if (scores.element_type() != ffi::DataType::F32)
    return Mismatch(op, "scores", "must be float32 (cast the router's scores first)");
  if (chosen->element_type() != ffi::DataType::S32) return Mismatch(op, "chosen", "must be int32");
  if (weights->element_type() != ffi::DataType::F32)
    return Mismatch(op, "weights", "must be float32");
  if (order->element_type() != ffi::DataType::S32) return Mismatch(op, "order", "must be int32");
  if (inverse->element_type() != ffi::DataType::S32)
    return Mismatch(op, "inverse", "must be int32");
  if (group_sizes->element_type() != ffi::DataType::S32)
    return Mismatch(op, "group_sizes", "must be int32");
  const auto sc = scores.dimensions();
  if (sc.size() != 2) return Mismatch(op, "scores", DimsString(sc) + " must be [T, N]");
  const int64_t T = sc[0], N = sc[1];
  if (N < 1 || N > INT32_MAX)
    return Mismatch(op, "scores", "N = " + std::to_string(N) + " must lie in [1, 2^31 - 1]");
  if (k < 1 || k > N)
    return Mismatch(op, "k", "= " + std::to_string(k) + " must lie in [1, N = " + std::to_string(N) + "]");
  if (experts < 1 || experts > INT32_MAX)
    return Mismatch(op, "experts", "= " + std::to_string(experts) + " must lie in [1, 2^31 - 1]");
  if (!std::isfinite(scaling))
    return Mismatch(op, "scaling", "must be a finite float32");
  if (T > INT32_MAX / k)
    return Mismatch(op, "scores", "T x k = " + std::to_string(T) + " x " + std::to_string(k) +
                                      " pairs must fit in int32");
  const int64_t P = T * k;
  const auto ch = chosen->dimensions(), we = weights->dimensions();
  if (ch.size() != 2 || ch[0] != T || ch[1] != k)
    return Mismatch(op, "chosen", DimsString(ch) + " must be [T, k] = [" + std::to_string(T) + ", " +
                                      std::to_string(k) + "]");
  if (we.size() != 2 || we[0] != T || we[1] != k)
    return Mismatch(op, "weights", DimsString(we) + " must be [T, k] = [" + std::to_string(T) + ", " +
                                       std::to_string(k) + "]");
  const auto od = order->dimensions(), in = inverse->dimensions(), gs = group_sizes->dimensions();
  if (od.size() != 1 || od[0] != P)
    return Mismatch(op, "order", DimsString(od) + " must be [T x k] = [" + std::to_string(P) + "]");
  if (in.size() != 1 || in[0] != P)
    return Mismatch(op, "inverse", DimsString(in) + " must be [T x k] = [" + std::to_string(P) + "]");
  if (gs.size() != 1 || gs[0] != experts)
    return Mismatch(op, "group_sizes", DimsString(gs) + " must be [experts] = [" +
                                           std::to_string(experts) + "]");
  MoeRouteDims d;
  d.tokens = T;
  d.scores = N;
  d.top_k = k;
  d.experts = experts;
  d.scaling = scaling;
  return d;
}

inline MoeRouteBuffers MoeRouteIo(ffi::AnyBuffer scores, ffi::Result<ffi::AnyBuffer> chosen,
                                  ffi::Result<ffi::AnyBuffer> weights,
                                  ffi::Result<ffi::AnyBuffer> order,
                                  ffi::Result<ffi::AnyBuffer> inverse,
                                  ffi::Result<ffi::AnyBuffer> group_sizes) {
  MoeRouteBuffers io;
  io.scores = static_cast<const float*>(scores.untyped_data());
  io.chosen = static_cast<int32_t*>(chosen->untyped_data());
  io.weights = static_cast<float*>(weights->untyped_data());
  io.order = static_cast<int32_t*>(order->untyped_data());
  io.inverse = static_cast<int32_t*>(inverse->untyped_data());
  io.group_sizes = static_cast<int32_t*>(group_sizes->untyped_data());
  return io;
}

// The operand list of the target, shared by the CPU and CUDA bindings so the
// ABI cannot drift between platforms (hisparse_jax/moe_route.py builds the call).
template <typename Binding>
auto BindMoeRouteOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // scores      [T, N] float32
      .template Ret<ffi::AnyBuffer>()                       // chosen      [T, k] int32
      .template Ret<ffi::AnyBuffer>()                       // weights     [T, k] float32
      .template Ret<ffi::AnyBuffer>()                       // order       [T x k] int32
      .template Ret<ffi::AnyBuffer>()                       // inverse     [T x k] int32
      .template Ret<ffi::AnyBuffer>()                       // group_sizes [E] int32
      .template Attr<int64_t>("k")                          // choices a token
      .template Attr<int64_t>("experts")                    // E, local experts
      .template Attr<float>("scaling");                     // the weights' factor
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_MOE_ROUTE_CHECKS_H_

// TOP-K operand checks shared by the CPU and CUDA handlers, and the operand
// list both bind. The Python API checks the same things first with friendlier
// messages; these keep a direct jax.ffi.ffi_call from handing a kernel
// buffers it would read or write out of bounds.
#ifndef HISPARSE_FFI_TOPK_CHECKS_H_
#define HISPARSE_FFI_TOPK_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"  // DimsString, Mismatch, Product, SameDims
#include "topk.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Validates the TOP-K operands and derives their sizes. Stream dims are the
// leading dims of `scores` (all but the last).
inline ffi::ErrorOr<TopkDims> CheckTopk(ffi::AnyBuffer scores, ffi::AnyBuffer sealed,
                                        ffi::Result<ffi::AnyBuffer> selected,
                                        ffi::Result<ffi::AnyBuffer> workspace, int64_t k) {
  constexpr const char* op = "hisparse_topk";
  if (scores.element_type() != ffi::DataType::F32)
    return Mismatch(op, "scores", "must be float32 (cast other float dtypes first)");
  if (sealed.element_type() != ffi::DataType::S32) return Mismatch(op, "sealed", "must be int32");
  if (selected->element_type() != ffi::DataType::S32)
    return Mismatch(op, "selected", "must be int32");
  if (workspace->element_type() != ffi::DataType::U32)
    return Mismatch(op, "workspace", "must be uint32");
  const auto sc = scores.dimensions();
  if (sc.size() < 1) return Mismatch(op, "scores", "must be [*streams, R], got a scalar");
  const size_t ns = sc.size() - 1;
  const auto se = sealed.dimensions();
  if (se.size() != ns || !SameDims(se, 0, sc, 0, ns))
    return Mismatch(op, "sealed", DimsString(se) + " must have the stream dims of scores " +
                                      DimsString(sc));
  const int64_t R = sc[ns];
  if (R > INT32_MAX) return Mismatch(op, "scores", "R = " + std::to_string(R) + " must fit in int32");
  if (k < 0 || k > R)
    return Mismatch(op, "k", "= " + std::to_string(k) + " must lie in [0, R = " +
                                 std::to_string(R) + "]");
  const auto out = selected->dimensions();
  if (out.size() != ns + 1 || !SameDims(out, 0, sc, 0, ns) || out[ns] != k)
    return Mismatch(op, "selected", DimsString(out) + " must be [*streams, k] with k = " +
                                        std::to_string(k));
  const auto ws = workspace->dimensions();
  if (ws.size() != ns + 1 || !SameDims(ws, 0, sc, 0, ns) || ws[ns] != TopkWorkspaceWords(R))
    return Mismatch(op, "workspace", DimsString(ws) + " must be [*streams, " +
                                         std::to_string(TopkWorkspaceWords(R)) + "]");
  TopkDims d;
  d.rows = Product(sc, 0, ns);
  d.records = R;
  d.top_k = k;
  return d;
}

inline TopkBuffers TopkIo(ffi::AnyBuffer scores, ffi::AnyBuffer sealed,
                          ffi::Result<ffi::AnyBuffer> selected) {
  TopkBuffers io;
  io.scores = static_cast<const float*>(scores.untyped_data());
  io.sealed = static_cast<const int32_t*>(sealed.untyped_data());
  io.selected = static_cast<int32_t*>(selected->untyped_data());
  return io;
}

// The operand list of the target, shared by the CPU and CUDA bindings so the
// ABI cannot drift between platforms (hisparse_jax/topk.py builds the call).
template <typename Binding>
auto BindTopkOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // scores    [*S, R] float32
      .template Arg<ffi::AnyBuffer>()                       // sealed    [*S] int32
      .template Ret<ffi::AnyBuffer>()                       // selected  [*S, k] int32
      .template Ret<ffi::AnyBuffer>()                       // workspace [*S, TopkWorkspaceWords(R)] uint32
      .template Attr<int64_t>("k");                         // k, the last dim of selected
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_TOPK_CHECKS_H_

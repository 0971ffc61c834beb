// Shape and dtype checks of "hisparse_grouped_matmul" (grouped_matmul.h). The
// Python API (hisparse_jax/grouped_matmul.py) checks the same things first,
// with the fix in its messages; these keep a direct jax.ffi.ffi_call from
// handing the kernel buffers it would read out of bounds.
#ifndef HISPARSE_FFI_GROUPED_MATMUL_CHECKS_H_
#define HISPARSE_FFI_GROUPED_MATMUL_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "grouped_matmul.h"
#include "common_checks.h"  // DimsString, Mismatch
#include "xla/ffi/api/ffi.h"

namespace hisparse {

namespace grouped_matmul_checks {

inline ffi::Unexpected<ffi::Error> Invalid(const std::string& message) {
  return ffi::Error::InvalidArgument("hisparse_grouped_matmul: " + message);
}

}  // namespace grouped_matmul_checks

// Validates the operands in a fixed order (dtypes, then shapes, then the size
// limits of grouped_matmul.h) and derives their sizes.
inline ffi::ErrorOr<GroupedMatmulDims> CheckGroupedMatmul(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                                                          ffi::AnyBuffer group_sizes, ffi::DataType y_type,
                                                          ffi::AnyBuffer::Dimensions y_dims) {
  using grouped_matmul_checks::Invalid;
  GroupedMatmulDims d;
  if (x.element_type() != ffi::DataType::BF16) return Invalid("x must be bfloat16");
  const std::optional<GroupedWeightType> weight_type = KindOf<GroupedWeightType>(
      w.element_type(),
      {{ffi::DataType::BF16, GroupedWeightType::kBf16}, {ffi::DataType::F8E4M3FN, GroupedWeightType::kFp8E4m3}});
  if (!weight_type) return Invalid("w must be bfloat16 or float8_e4m3fn");
  d.weight_type = *weight_type;
  if (scale.element_type() != ffi::DataType::F32) return Invalid("scale must be float32");
  if (group_sizes.element_type() != ffi::DataType::S32) return Invalid("group_sizes must be int32");
  if (y_type != ffi::DataType::F32) return Invalid("y must be float32");

  const auto xd = x.dimensions(), wd = w.dimensions(), sd = scale.dimensions(), gd = group_sizes.dimensions();
  if (xd.size() != 2) return Invalid("x " + DimsString(xd) + " must be [M, K]");
  d.rows = xd[0];
  d.k = xd[1];
  if (wd.size() != 3 || wd[2] != d.k) return Invalid("w " + DimsString(wd) + " must be [E, N, K] with K of x " + DimsString(xd));
  d.experts = wd[0];
  d.n = wd[1];
  if (sd.size() != 2 || sd[0] != d.experts || sd[1] != d.n)
    return Invalid("scale " + DimsString(sd) + " must be [E, N] of w " + DimsString(wd));
  if (gd.size() != 1 || gd[0] != d.experts)
    return Invalid("group_sizes " + DimsString(gd) + " must be [E] of w " + DimsString(wd));
  if (y_dims.size() != 2 || y_dims[0] != d.rows || y_dims[1] != d.n)
    return Invalid("y " + DimsString(y_dims) + " must be [M, N] of x " + DimsString(xd) + " and w " + DimsString(wd));
  if (const char* error = GroupedMatmulSizeError(d); error[0] != '\0') return Invalid(error);
  return d;
}

inline GroupedMatmulBuffers GroupedMatmulIo(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer scale,
                                            ffi::AnyBuffer group_sizes, ffi::Result<ffi::AnyBuffer>& y) {
  GroupedMatmulBuffers io;
  io.x = x.untyped_data();
  io.w = w.untyped_data();
  io.scale = static_cast<const float*>(scale.untyped_data());
  io.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  io.y = static_cast<float*>(y->untyped_data());
  return io;
}

// The operand list of the target (the Python side names it in hisparse_jax/targets.py).
template <typename Binding>
auto BindGroupedMatmulOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x           [M, K] bf16, rows sorted by group
      .template Arg<ffi::AnyBuffer>()                       // w           [E, N, K] bf16 or f8e4m3fn
      .template Arg<ffi::AnyBuffer>()                       // scale       [E, N] f32
      .template Arg<ffi::AnyBuffer>()                       // group_sizes [E] int32 (device data)
      .template Ret<ffi::AnyBuffer>();                      // y           [M, N] f32, 0 past the groups
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_GROUPED_MATMUL_CHECKS_H_

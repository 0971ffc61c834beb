// Shape and dtype checks of "hisparse_sparse_attention" (sparse_attention.h). The Python API
// (hisparse_jax/sparse_attention.py) checks the same things first, with the fix in its messages;
// these keep a direct jax.ffi.ffi_call from handing the kernels buffers they would overrun.
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_CHECKS_H_
#define HISPARSE_FFI_SPARSE_ATTENTION_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"  // DimsString
#include "sparse_attention.h"
#include "sparse_attention_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

namespace sparse_attention_checks {

inline ffi::Unexpected<ffi::Error> Invalid(const std::string& message) {
  return ffi::Error::InvalidArgument("hisparse_sparse_attention: " + message);
}

}  // namespace sparse_attention_checks

// Validates the operands (dtypes, then shapes, then the contract's limits) and derives the shape.
inline ffi::ErrorOr<SparseAttentionShape> CheckSparseAttention(ffi::AnyBuffer q, ffi::AnyBuffer source,
                                                              ffi::AnyBuffer layer, ffi::AnyBuffer index, ffi::AnyBuffer tail,
                                                              ffi::AnyBuffer tail_valid, ffi::AnyBuffer::Dimensions out,
                                                              ffi::DataType out_type, ffi::AnyBuffer::Dimensions ws,
                                                              ffi::DataType ws_type) {
  using sparse_attention_checks::Invalid;
  constexpr int64_t W = kSparseAttentionWidth;
  if (q.element_type() != ffi::DataType::BF16) return Invalid("q must be bfloat16");
  if (source.element_type() != ffi::DataType::BF16) return Invalid("source must be bfloat16");
  if (tail.element_type() != ffi::DataType::BF16) return Invalid("tail must be bfloat16");
  if (index.element_type() != ffi::DataType::S32) return Invalid("index must be int32");
  if (layer.element_type() != ffi::DataType::S32 || layer.dimensions().size() != 0)
    return Invalid("layer must be an int32 scalar");
  if (tail_valid.element_type() != ffi::DataType::PRED) return Invalid("tail_valid must be bool");
  if (out_type != ffi::DataType::F32 || ws_type != ffi::DataType::F32)
    return Invalid("out and workspace must be float32");
  const auto qd = q.dimensions(), sd = source.dimensions(), id = index.dimensions(), td = tail.dimensions(),
             vd = tail_valid.dimensions();
  SparseAttentionShape s;
  if (qd.size() != 3 || qd[2] != W) return Invalid("q " + DimsString(qd) + " must be [b, H, 576]");
  s.batch = qd[0];
  s.heads = qd[1];
  // [b, N, P, 576], or [L, b, N, P, 576]: every layer's hot buffer, stacked.
  const size_t lead = sd.size() == 5 ? 1 : 0;
  if ((sd.size() != 4 && sd.size() != 5) || sd[lead] != s.batch || sd[lead + 3] != W)
    return Invalid("source " + DimsString(sd) + " must be [b, N, P, 576] or [L, b, N, P, 576] with b of q " +
                   DimsString(qd));
  s.layers = lead ? sd[0] : 1;
  s.records = sd[lead + 1];
  s.page = sd[lead + 2];
  if (id.size() != 2 || id[0] != s.batch) return Invalid("index " + DimsString(id) + " must be [b, k]");
  s.top_k = id[1];
  if (td.size() != 3 || td[0] != s.batch || td[1] != s.page || td[2] != W)
    return Invalid("tail " + DimsString(td) + " must be [b, P, 576] with P of source " + DimsString(sd));
  if (vd.size() != 2 || vd[0] != s.batch || vd[1] != s.page)
    return Invalid("tail_valid " + DimsString(vd) + " must be [b, P]");
  if (out.size() != 3 || out[0] != s.batch || out[1] != s.heads || out[2] != kSparseAttentionValueWidth)
    return Invalid("out " + DimsString(out) + " must be [b, H, 512]");
  if (const char* e = SparseAttentionShapeError(s)) return Invalid(e);
  if (ws.size() != 1 || ws[0] * 4 != SparseAttentionWorkspaceBytes(s))
    return Invalid("workspace " + DimsString(ws) + " must be [b * H * 16 * 514] float32");
  return s;
}

// The operand list of the target (the Python side names it in hisparse_jax/targets.py).
template <typename Binding>
auto BindSparseAttentionOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // q          [b, H, 576] bf16
      .template Arg<ffi::AnyBuffer>()                       // source     [(L,) b, N, P, 576] bf16
      .template Arg<ffi::AnyBuffer>()                       // layer      [] int32 (device)
      .template Arg<ffi::AnyBuffer>()                       // index      [b, k] int32 (-1: none)
      .template Arg<ffi::AnyBuffer>()                       // tail       [b, P, 576] bf16
      .template Arg<ffi::AnyBuffer>()                       // tail_valid [b, P] bool
      .template Ret<ffi::AnyBuffer>()                       // out        [b, H, 512] f32
      .template Ret<ffi::AnyBuffer>()                       // workspace  [b * H * 16 * 514] f32
      .template Attr<float>("scale");
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_CHECKS_H_

// Shape and dtype checks of "hisparse_index_scores" (indexer.h). The Python
// API (hisparse_jax/indexer.py) checks the same things first, with the fix in
// its messages; these keep a direct jax.ffi.ffi_call from handing the kernel
// buffers it would read out of bounds.
#ifndef HISPARSE_FFI_INDEXER_CHECKS_H_
#define HISPARSE_FFI_INDEXER_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "indexer.h"
#include "common_checks.h"  // DimsString, Mismatch
#include "xla/ffi/api/ffi.h"

namespace hisparse {

namespace indexer_checks {

inline ffi::Unexpected<ffi::Error> Invalid(const char* operand, const std::string& detail) {
  return Mismatch("hisparse_index_scores", operand, detail);
}

}  // namespace indexer_checks

// Validates the operands in a fixed order (dtypes, then shapes, then the size
// limits of indexer.h) and derives their sizes. key_scale is [b, T] float32
// with float8_e4m3fn keys and an empty float32 [0] with bfloat16 keys.
inline ffi::ErrorOr<IndexerDims> CheckIndexScores(ffi::AnyBuffer query, ffi::AnyBuffer weights,
                                                  ffi::AnyBuffer keys, ffi::AnyBuffer key_scale,
                                                  ffi::AnyBuffer lengths, ffi::DataType scores_type,
                                                  ffi::AnyBuffer::Dimensions scores_dims) {
  using indexer_checks::Invalid;
  IndexerDims d;
  const std::optional<IndexQueryType> query_type = KindOf<IndexQueryType>(
      query.element_type(), {{ffi::DataType::BF16, IndexQueryType::kBf16}, {ffi::DataType::F32, IndexQueryType::kF32}});
  if (!query_type) return Invalid("q", "must be bfloat16 or float32");
  d.query_type = *query_type;
  const std::optional<IndexKeyType> key_type = KindOf<IndexKeyType>(
      keys.element_type(), {{ffi::DataType::BF16, IndexKeyType::kBf16}, {ffi::DataType::F8E4M3FN, IndexKeyType::kFp8E4m3}});
  if (!key_type) return Invalid("keys", "must be bfloat16 or float8_e4m3fn");
  d.key_type = *key_type;
  if (weights.element_type() != ffi::DataType::F32) return Invalid("weights", "must be float32");
  if (key_scale.element_type() != ffi::DataType::F32) return Invalid("key_scale", "must be float32");
  if (lengths.element_type() != ffi::DataType::S32) return Invalid("lengths", "must be int32");
  if (scores_type != ffi::DataType::F32) return Invalid("scores", "must be float32");

  const auto q = query.dimensions(), w = weights.dimensions(), k = keys.dimensions();
  const auto s = key_scale.dimensions(), n = lengths.dimensions();
  if (q.size() != 3) return Invalid("q", DimsString(q) + " must be [b, H, d]");
  d.rows = q[0];
  d.heads = q[1];
  d.dim = q[2];
  if (w.size() != 2 || w[0] != d.rows || w[1] != d.heads)
    return Invalid("weights", DimsString(w) + " must be [b, H] of q " + DimsString(q));
  if (k.size() != 3 || k[0] != d.rows || k[2] != d.dim)
    return Invalid("keys", DimsString(k) + " must be [b, T, d] with b and d of q " + DimsString(q));
  d.tokens = k[1];
  if (d.key_type == IndexKeyType::kFp8E4m3) {
    if (s.size() != 2 || s[0] != d.rows || s[1] != d.tokens)
      return Invalid("key_scale", DimsString(s) + " must be [b, T] of keys " + DimsString(k));
  } else if (s.size() != 1 || s[0] != 0) {
    return Invalid("key_scale", DimsString(s) + " must be an empty [0] with bfloat16 keys");
  }
  if (n.size() != 1 || n[0] != d.rows) return Invalid("lengths", DimsString(n) + " must be [b] of q " + DimsString(q));
  if (scores_dims.size() != 2 || scores_dims[0] != d.rows || scores_dims[1] != d.tokens)
    return Invalid("scores", DimsString(scores_dims) + " must be [b, T] of keys " + DimsString(k));
  if (const char* error = IndexerSizeError(d); error[0] != '\0')
    return ffi::Unexpected<ffi::Error>(
        ffi::Error::InvalidArgument(std::string("hisparse_index_scores: ") + error));
  return d;
}

inline IndexerBuffers IndexScoresIo(const IndexerDims& d, ffi::AnyBuffer query, ffi::AnyBuffer weights,
                                    ffi::AnyBuffer keys, ffi::AnyBuffer key_scale, ffi::AnyBuffer lengths,
                                    ffi::Result<ffi::AnyBuffer>& scores) {
  IndexerBuffers io;
  io.query = query.untyped_data();
  io.weights = static_cast<const float*>(weights.untyped_data());
  io.keys = keys.untyped_data();
  io.key_scale = d.key_type == IndexKeyType::kFp8E4m3 ? static_cast<const float*>(key_scale.untyped_data())
                                                      : nullptr;
  io.lengths = static_cast<const int32_t*>(lengths.untyped_data());
  io.scores = static_cast<float*>(scores->untyped_data());
  return io;
}

// The operand list of the target (the Python side names it in hisparse_jax/targets.py).
template <typename Binding>
auto BindIndexScoresOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // q         [b, H, d] bf16 or f32
      .template Arg<ffi::AnyBuffer>()                       // weights   [b, H] f32
      .template Arg<ffi::AnyBuffer>()                       // keys      [b, T, d] bf16 or f8e4m3fn
      .template Arg<ffi::AnyBuffer>()                       // key_scale [b, T] f32 (fp8 keys) or [0]
      .template Arg<ffi::AnyBuffer>()                       // lengths   [b] int32
      .template Ret<ffi::AnyBuffer>();                      // scores    [b, T] f32, -inf from lengths[b]
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_INDEXER_CHECKS_H_

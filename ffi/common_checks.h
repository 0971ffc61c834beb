// The pieces every op's operand check (OP_checks.h) is made of: the error of
// a mismatched operand and the dims arithmetic on XLA's buffers.
#ifndef HISPARSE_FFI_COMMON_CHECKS_H_
#define HISPARSE_FFI_COMMON_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

namespace ffi = xla::ffi;

// InvalidArgument "OP: WHAT DETAIL".
inline ffi::Unexpected<ffi::Error> Mismatch(const char* op, const char* what,
                                            const std::string& detail) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + what + " " + detail);
}

// Product of dims[begin, end).
inline int64_t Product(ffi::AnyBuffer::Dimensions dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

// Whether a[a0, a0 + n) == b[b0, b0 + n) (false when either is too short).
inline bool SameDims(ffi::AnyBuffer::Dimensions a, size_t a0, ffi::AnyBuffer::Dimensions b,
                     size_t b0, size_t n) {
  if (a.size() < a0 + n || b.size() < b0 + n) return false;
  for (size_t i = 0; i < n; ++i)
    if (a[a0 + i] != b[b0 + i]) return false;
  return true;
}

// The kind an operand's dtype stands for in `kinds` (dtype, kind pairs);
// std::nullopt when its dtype is none of them.
template <typename Kind>
std::optional<Kind> KindOf(ffi::DataType dtype, std::initializer_list<std::pair<ffi::DataType, Kind>> kinds) {
  for (const auto& [type, kind] : kinds)
    if (type == dtype) return kind;
  return std::nullopt;
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_COMMON_CHECKS_H_

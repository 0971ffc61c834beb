// Operand lists and checks of the prefetch calls (prefetch.h), shared by the
// CPU and CUDA handlers.
#ifndef HISPARSE_FFI_PREFETCH_CHECKS_H_
#define HISPARSE_FFI_PREFETCH_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"  // DimsString, SameDims
#include "prefetch.h"
#include "resolve_checks.h"  // BindResolveOperands
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// RESOLVE's operand list (BindResolveOperands(...), passed in as a temporary:
// bindings only move as temporaries) and the slot that pairs the call with its
// join.
template <typename Binding>
auto WithPrefetchSlot(Binding resolve_operands) {
  return std::move(resolve_operands).template Attr<int64_t>("prefetch_slot");
}

template <typename Binding>
auto BindPrefetchJoinOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()    // hot          [L, *S, B, ...rec]
      .template Arg<ffi::AnyBuffer>()              // misses       [*S] int32
      .template Arg<ffi::AnyBuffer>()              // miss_records [*S, k] int32 (read by the copy)
      .template Arg<ffi::AnyBuffer>()              // miss_slots   [*S, k] int32 (read by the copy)
      .template Arg<ffi::AnyBuffer>()              // layer        [] int32 (read by the copy)
      .template Arg<ffi::AnyBuffer>()              // after        any: orders the join, never read
      .template Ret<ffi::AnyBuffer>()              // hot          (result 0 aliases operand 0)
      .template Ret<ffi::AnyBuffer>()              // misses       (result 1 aliases operand 1)
      .template Attr<int64_t>("prefetch_slot");
}

inline ffi::Error CheckPrefetchSlot(const char* op, int64_t slot) {
  if (slot < 0)
    return ffi::Error::InvalidArgument(std::string(op) + ": prefetch_slot " + std::to_string(slot) +
                                       " must be >= 0");
  return ffi::Error::Success();
}

inline ffi::Error CheckPrefetchJoin(ffi::AnyBuffer hot, ffi::AnyBuffer misses,
                                    ffi::AnyBuffer miss_records, ffi::AnyBuffer miss_slots,
                                    ffi::AnyBuffer layer, ffi::Result<ffi::AnyBuffer>& hot_out,
                                    ffi::Result<ffi::AnyBuffer>& misses_out, int64_t slot) {
  constexpr const char* op = "hisparse_prefetch_join";
  if (auto err = CheckPrefetchSlot(op, slot); err.failure()) return err;
  for (auto [buf, name] : {std::pair{misses, "misses"}, {miss_records, "miss_records"},
                           {miss_slots, "miss_slots"}, {layer, "layer"}}) {
    if (buf.element_type() != ffi::DataType::S32)
      return ffi::Error::InvalidArgument(std::string(op) + ": " + name + " must be int32");
  }
  const auto m = misses.dimensions(), r = miss_records.dimensions();
  if (r.size() != m.size() + 1 || !SameDims(r, 0, m, 0, m.size()) ||
      miss_slots.dimensions().size() != r.size() || !SameDims(miss_slots.dimensions(), 0, r, 0, r.size()))
    return ffi::Error::InvalidArgument(std::string(op) + ": miss_records " + DimsString(r) +
                                       " and miss_slots must be [*streams, k] with misses [*streams] " +
                                       DimsString(m));
  if (layer.dimensions().size() != 0)
    return ffi::Error::InvalidArgument(std::string(op) + ": layer must be a scalar");
  if (hot_out->size_bytes() != hot.size_bytes() || misses_out->size_bytes() != misses.size_bytes() ||
      hot_out->element_type() != hot.element_type())
    return ffi::Error::InvalidArgument(std::string(op) + ": results must match hot and misses");
  return ffi::Error::Success();
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_PREFETCH_CHECKS_H_

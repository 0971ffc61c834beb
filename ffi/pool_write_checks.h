// The pool write's operand list and its shape and dtype checks, shared by the
// CPU and CUDA handlers (the Python side names the operands in
// hisparse_jax/targets.py).
#ifndef HISPARSE_FFI_POOL_WRITE_CHECKS_H_
#define HISPARSE_FFI_POOL_WRITE_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"
#include "pool_write.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// Validates the pool write operands and derives their sizes.
inline ffi::ErrorOr<PoolWriteDims> CheckPoolWrite(ffi::AnyBuffer pool, ffi::AnyBuffer records,
                                                 ffi::AnyBuffer start, ffi::AnyBuffer count) {
  constexpr const char* op = "hisparse_pool_write";
  if (start.element_type() != ffi::DataType::S32 || count.element_type() != ffi::DataType::S32)
    return Mismatch(op, "start/count", "must be int32");
  if (records.element_type() != pool.element_type())
    return Mismatch(op, "records", "must have the dtype of host_pool");
  const auto st = start.dimensions(), c = count.dimensions();
  const size_t ns = st.size();
  if (c.size() != ns || !SameDims(c, 0, st, 0, ns))
    return Mismatch(op, "count", "must have the dims of start " + DimsString(st));
  const auto p = pool.dimensions(), x = records.dimensions();
  if (p.size() < ns + 2 || !SameDims(p, 1, st, 0, ns))
    return Mismatch(op, "host_pool", DimsString(p) + " must be [L, *streams, R, ...record]");
  if (x.size() != p.size() || x[0] != p[0] || !SameDims(x, 1, st, 0, ns) ||
      !SameDims(x, ns + 2, p, ns + 2, p.size() - ns - 2))
    return Mismatch(op, "records", DimsString(x) + " must be [L, *streams, n, ...record of host_pool]");
  PoolWriteDims d;
  d.layers = p[0];
  d.streams = Product(st, 0, ns);
  d.rows = x[ns + 1];
  d.pool_records = p[ns + 1];
  d.record_bytes = Product(p, ns + 2, p.size()) * ffi::ByteWidth(pool.element_type());
  if (d.record_bytes <= 0 || d.record_bytes % 8 != 0)
    return Mismatch(op, "record", "bytes must be a positive multiple of 8");
  return d;
}

template <typename Binding>
auto BindPoolWriteOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()    // host_pool [L, *S, R, ...rec] pinned host
      .template Arg<ffi::AnyBuffer>()              // records   [L, *S, n, ...rec]
      .template Arg<ffi::AnyBuffer>()              // start     [*S] int32
      .template Arg<ffi::AnyBuffer>()              // count     [*S] int32
      .template Ret<ffi::AnyBuffer>();             // host_pool (aliases operand 0)
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_POOL_WRITE_CHECKS_H_

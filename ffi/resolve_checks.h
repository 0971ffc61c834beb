// Shape and dtype checks shared by the CPU and CUDA handlers. The Python API
// checks the same things first with friendlier messages; these keep a direct
// jax.ffi.ffi_call from handing a kernel buffers it would read out of bounds.
#ifndef HISPARSE_FFI_FFI_CHECKS_H_
#define HISPARSE_FFI_FFI_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "resolve.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

namespace ffi = xla::ffi;

inline std::string DimsString(ffi::AnyBuffer::Dimensions dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

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

inline bool SameDims(ffi::AnyBuffer::Dimensions a, size_t a0, ffi::AnyBuffer::Dimensions b,
                     size_t b0, size_t n) {
  if (a.size() < a0 + n || b.size() < b0 + n) return false;
  for (size_t i = 0; i < n; ++i)
    if (a[a0 + i] != b[b0 + i]) return false;
  return true;
}

// Validates the RESOLVE operands and derives their sizes. Stream dims are the
// leading dims of `selection` (all but the last), so no reshape of the host
// pool is ever needed on the Python side.
inline ffi::ErrorOr<ResolveDims> CheckResolve(ffi::AnyBuffer pool, ffi::AnyBuffer selection,
                                             ffi::AnyBuffer sealed, ffi::AnyBuffer layer,
                                             ffi::AnyBuffer hot, ffi::AnyBuffer slot_record,
                                             ffi::AnyBuffer lru) {
  constexpr const char* op = "hisparse_resolve";
  for (auto [buf, name] : {std::pair{selection, "selection"}, {sealed, "sealed"},
                           {layer, "layer"}, {slot_record, "slot_record"}, {lru, "lru"}}) {
    if (buf.element_type() != ffi::DataType::S32) return Mismatch(op, name, "must be int32");
  }
  if (pool.element_type() != hot.element_type())
    return Mismatch(op, "hot", "must have the dtype of host_pool");
  const auto sel = selection.dimensions();
  if (sel.size() < 1) return Mismatch(op, "selection", "must be [*streams, k]");
  const size_t ns = sel.size() - 1;
  if (!SameDims(sealed.dimensions(), 0, sel, 0, ns) || sealed.dimensions().size() != ns)
    return Mismatch(op, "sealed", "must have the stream dims of selection " + DimsString(sel));
  if (layer.dimensions().size() != 0) return Mismatch(op, "layer", "must be a scalar");
  const auto p = pool.dimensions(), h = hot.dimensions();
  const auto r = slot_record.dimensions(), u = lru.dimensions();
  if (p.size() < ns + 2 || !SameDims(p, 1, sel, 0, ns))
    return Mismatch(op, "host_pool", DimsString(p) + " must be [L, *streams, R, ...record]");
  if (r.size() != ns + 2 || r[0] != p[0] || !SameDims(r, 1, sel, 0, ns))
    return Mismatch(op, "slot_record", DimsString(r) + " must be [L, *streams, B]");
  if (!SameDims(u, 0, r, 0, r.size()) || u.size() != r.size())
    return Mismatch(op, "lru", DimsString(u) + " must match slot_record " + DimsString(r));
  if (h.size() != p.size() || !SameDims(h, 0, r, 0, r.size()) ||
      !SameDims(h, ns + 2, p, ns + 2, p.size() - ns - 2))
    return Mismatch(op, "hot", DimsString(h) + " must be [L, *streams, B, ...record of host_pool]");
  ResolveDims d;
  d.layers = p[0];
  d.streams = Product(sel, 0, ns);
  d.top_k = sel[ns];
  d.hot_slots = r[ns + 1];
  d.pool_records = p[ns + 1];
  d.record_bytes = Product(p, ns + 2, p.size()) * ffi::ByteWidth(pool.element_type());
  if (d.hot_slots < d.top_k)
    return Mismatch(op, "hot_slots", "B must be >= k");
  if (d.record_bytes <= 0 || d.record_bytes % 8 != 0)
    return Mismatch(op, "record", "bytes must be a positive multiple of 8");
  if (d.pool_records > INT32_MAX || d.hot_slots > INT32_MAX)
    return Mismatch(op, "host_pool", "records and slots must fit in int32");
  return d;
}

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

inline ResolveBuffers ResolveIo(ffi::AnyBuffer pool, ffi::AnyBuffer selection,
                                ffi::AnyBuffer sealed, ffi::Result<ffi::AnyBuffer> slots,
                                ffi::Result<ffi::AnyBuffer> miss_records,
                                ffi::Result<ffi::AnyBuffer> miss_slots,
                                ffi::Result<ffi::AnyBuffer> misses,
                                ffi::Result<ffi::AnyBuffer> invalid,
                                ffi::Result<ffi::AnyBuffer> malformed,
                                ffi::Result<ffi::AnyBuffer> hot,
                                ffi::Result<ffi::AnyBuffer> slot_record,
                                ffi::Result<ffi::AnyBuffer> lru) {
  auto i32 = [](ffi::Result<ffi::AnyBuffer>& b) {
    return static_cast<int32_t*>(b->untyped_data());
  };
  ResolveBuffers io;
  io.host_pool = static_cast<const uint8_t*>(pool.untyped_data());
  io.selection = static_cast<const int32_t*>(selection.untyped_data());
  io.sealed = static_cast<const int32_t*>(sealed.untyped_data());
  io.hot = static_cast<uint8_t*>(hot->untyped_data());
  io.slot_record = i32(slot_record);
  io.lru = i32(lru);
  io.slots = i32(slots);
  io.miss_records = i32(miss_records);
  io.miss_slots = i32(miss_slots);
  io.misses = i32(misses);
  io.invalid = i32(invalid);
  io.malformed = i32(malformed);
  return io;
}

// The operand lists of the two targets, shared by the CPU and CUDA bindings so
// the ABI cannot drift between platforms (the Python side names them in
// hisparse_jax/_targets.py).
template <typename Binding>
auto BindResolveOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()    // host_pool   [L, *S, R, ...rec] pinned host
      .template Arg<ffi::AnyBuffer>()              // selection   [*S, k] int32
      .template Arg<ffi::AnyBuffer>()              // sealed      [*S] int32
      .template Arg<ffi::AnyBuffer>()              // layer       [] int32
      .template Arg<ffi::AnyBuffer>()              // hot         [L, *S, B, ...rec]
      .template Arg<ffi::AnyBuffer>()              // slot_record [L, *S, B] int32
      .template Arg<ffi::AnyBuffer>()              // lru         [L, *S, B] int32
      .template Ret<ffi::AnyBuffer>()              // slots       [*S, k] int32
      .template Ret<ffi::AnyBuffer>()              // miss_records[*S, k] int32
      .template Ret<ffi::AnyBuffer>()              // miss_slots  [*S, k] int32
      .template Ret<ffi::AnyBuffer>()              // misses      [*S] int32
      .template Ret<ffi::AnyBuffer>()              // invalid     [*S] int32
      .template Ret<ffi::AnyBuffer>()              // malformed   [*S] int32, 1 = state malformed
      .template Ret<ffi::AnyBuffer>()              // hot         (result 6 aliases operand 4)
      .template Ret<ffi::AnyBuffer>()              // slot_record (result 7 aliases operand 5)
      .template Ret<ffi::AnyBuffer>()              // lru         (result 8 aliases operand 6)
      .template Attr<bool>("fetch")                // false: skip the record copy (benchmarks)
      .template Attr<int32_t>("launch");           // CUDA launch plan, see ResolveLaunchPlan
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

#endif  // HISPARSE_FFI_FFI_CHECKS_H_

// RESOLVE's operands as XLA binds them (one struct, one operand list, shared
// by the CPU, CUDA and prefetch handlers so the ABI cannot drift between
// them) and their shape and dtype checks. The Python API checks the same
// things first with friendlier messages; these keep a direct
// jax.ffi.ffi_call from handing a kernel buffers it would read out of bounds.
#ifndef HISPARSE_FFI_RESOLVE_CHECKS_H_
#define HISPARSE_FFI_RESOLVE_CHECKS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "common_checks.h"
#include "resolve.h"
#include "xla/ffi/api/ffi.h"

namespace hisparse {

// The 16 buffers of one RESOLVE call, in binding order (BindResolveOperands;
// the Python side names them in hisparse_jax/targets.py). `*_in` are the
// state operands, aliased to the results of the same name.
struct ResolveOperands {
  ffi::AnyBuffer pool;            // host_pool   [L, *S, R, ...rec] pinned host
  ffi::AnyBuffer selection;       // selection   [*S, k] int32
  ffi::AnyBuffer sealed;          // sealed      [*S] int32
  ffi::AnyBuffer layer;           // layer       [] int32
  ffi::AnyBuffer hot_in;          // hot         [L, *S, B, ...rec]
  ffi::AnyBuffer slot_record_in;  // slot_record [L, *S, B] int32
  ffi::AnyBuffer lru_in;          // lru         [L, *S, B] int32
  ffi::Result<ffi::AnyBuffer> slots;         // [*S, k] int32
  ffi::Result<ffi::AnyBuffer> miss_records;  // [*S, k] int32
  ffi::Result<ffi::AnyBuffer> miss_slots;    // [*S, k] int32
  ffi::Result<ffi::AnyBuffer> misses;        // [*S] int32
  ffi::Result<ffi::AnyBuffer> invalid;       // [*S] int32
  ffi::Result<ffi::AnyBuffer> malformed;     // [*S] int32, 1 = state malformed
  ffi::Result<ffi::AnyBuffer> hot;           // result 6 aliases operand 4
  ffi::Result<ffi::AnyBuffer> slot_record;   // result 7 aliases operand 5
  ffi::Result<ffi::AnyBuffer> lru;           // result 8 aliases operand 6
};

// RESOLVE's operand list, then its attributes: 7 buffers in, 9 out, fetch
// (false: skip the record copy, for benchmarks), launch (the CUDA launch
// plan, see ResolveLaunchPlan), stream_begin and stream_count (the streams
// resolved, resolve.h "Stream range"; Python passes 0 and S for every stream).
template <typename Binding>
auto BindResolveOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>().template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>().template Ret<ffi::AnyBuffer>()
      .template Attr<bool>("fetch")
      .template Attr<int32_t>("launch")
      .template Attr<int64_t>("stream_begin")
      .template Attr<int64_t>("stream_count");
}

// Adapts `body(lead..., ResolveOperands&, attrs...)` to the flat argument list
// a BindResolveOperands binding calls its handler with. `Lead` are the
// binding's leading context types (cudaStream_t on CUDA, none on CPU).
template <typename... Lead, typename Body>
auto WithResolveOperands(Body body) {
  using Buf = ffi::AnyBuffer;
  using Out = ffi::Result<ffi::AnyBuffer>;
  return [body](Lead... lead, Buf pool, Buf selection, Buf sealed, Buf layer, Buf hot_in,
                Buf slot_record_in, Buf lru_in, Out slots, Out miss_records, Out miss_slots,
                Out misses, Out invalid, Out malformed, Out hot, Out slot_record, Out lru,
                auto... attrs) -> ffi::Error {
    ResolveOperands ops{pool,  selection,  sealed,     layer,   hot_in,  slot_record_in,
                        lru_in, slots,     miss_records, miss_slots, misses, invalid,
                        malformed, hot,    slot_record,  lru};
    return body(lead..., ops, attrs...);
  };
}

// Validates the RESOLVE operands and derives their sizes. Stream dims are the
// leading dims of `selection` (all but the last), so no reshape of the host
// pool is ever needed on the Python side.
inline ffi::ErrorOr<ResolveDims> CheckResolve(const ResolveOperands& ops) {
  constexpr const char* op = "hisparse_resolve";
  const ffi::AnyBuffer pool = ops.pool, selection = ops.selection, sealed = ops.sealed,
                       layer = ops.layer, hot = ops.hot_in, slot_record = ops.slot_record_in,
                       lru = ops.lru_in;
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

// The stream range of a call of `dims` (resolve.h "Stream range"), or the
// error naming the attribute at fault and what would be in range.
inline ffi::ErrorOr<StreamRange> CheckStreamRange(const char* op, const ResolveDims& dims,
                                                  int64_t begin, int64_t count) {
  const std::string streams = std::to_string(dims.streams);
  if (begin < 0)
    return Mismatch(op, "stream_begin", std::to_string(begin) + " must be >= 0 (the first stream resolved)");
  if (count < 0)
    return Mismatch(op, "stream_count", std::to_string(count) + " must be >= 0 (0 resolves no stream)");
  if (begin > dims.streams || count > dims.streams - begin)
    return Mismatch(op, "stream_begin + stream_count",
                    std::to_string(begin) + " + " + std::to_string(count) + " exceeds the " + streams +
                        " streams of selection; pick a range inside [0, " + streams + ")");
  return StreamRange{begin, count};
}

// The raw pointers of RESOLVE's buffers (resolve.h), results in place of the
// state operands they alias.
inline ResolveBuffers ResolveIo(ResolveOperands& ops) {
  auto i32 = [](ffi::Result<ffi::AnyBuffer>& b) {
    return static_cast<int32_t*>(b->untyped_data());
  };
  ResolveBuffers io;
  io.host_pool = static_cast<const uint8_t*>(ops.pool.untyped_data());
  io.selection = static_cast<const int32_t*>(ops.selection.untyped_data());
  io.sealed = static_cast<const int32_t*>(ops.sealed.untyped_data());
  io.hot = static_cast<uint8_t*>(ops.hot->untyped_data());
  io.slot_record = i32(ops.slot_record);
  io.lru = i32(ops.lru);
  io.slots = i32(ops.slots);
  io.miss_records = i32(ops.miss_records);
  io.miss_slots = i32(ops.miss_slots);
  io.misses = i32(ops.misses);
  io.invalid = i32(ops.invalid);
  io.malformed = i32(ops.malformed);
  return io;
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_CHECKS_H_

// XLA FFI handlers for platform "CUDA": check, carry the aliased state when
// XLA did not donate it, then enqueue the kernels of resolve_kernels.cu.
// Handlers only enqueue work on XLA's stream (the layer index stays on the
// device, read by the kernels), so they are marked kCmdBufferCompatible.
// (The prefetch variant, prefetch_handlers_cuda.cc, forks its copy onto a
// stream of its own and is not.)
#include <cuda_runtime_api.h>

#include <string>
#include <tuple>

#include "ffi_checks.h"
#include "handlers_cuda.h"
#include "prefetch_cuda.h"
#include "resolve.h"
#include "resolve_cuda.h"

namespace hisparse {

ffi::Error CudaError(const char* op, const std::string& what, cudaError_t err) {
  return ffi::Error::Internal(std::string(op) + ": " + what + " failed: " +
                              cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

ffi::Error Carry(const char* op, const char* name, ffi::AnyBuffer in,
                 ffi::Result<ffi::AnyBuffer>& out, cudaStream_t stream) {
  if (in.untyped_data() == out->untyped_data() || in.size_bytes() == 0)
    return ffi::Error::Success();
  const cudaError_t err =
      cudaMemcpyAsync(out->untyped_data(), in.untyped_data(), in.size_bytes(), cudaMemcpyDefault, stream);
  if (err != cudaSuccess) return CudaError(op, std::string("copying ") + name + " to its output", err);
  return ffi::Error::Success();
}

namespace {

// What the CUDA kernels add to CheckResolve.
ffi::Error CheckCudaLimits(const ResolveDims& d, int32_t launch) {
  auto invalid = [](const char* what, const std::string& detail) {
    return ffi::Error::InvalidArgument(std::string("hisparse_resolve: ") + what + " " + detail);
  };
  if (d.top_k > kMaxResolveTopK)
    return invalid("selection", "k = " + std::to_string(d.top_k) +
                                    " exceeds the CUDA kernel's limit of " +
                                    std::to_string(kMaxResolveTopK));
  if (d.hot_slots > kMaxResolveHotSlots)
    return invalid("slot_record", "B = " + std::to_string(d.hot_slots) +
                                      " exceeds the CUDA kernel's limit of " +
                                      std::to_string(kMaxResolveHotSlots));
  if (d.streams > INT32_MAX) return invalid("selection", "has more than 2^31 - 1 streams");
  if (launch < static_cast<int32_t>(ResolveLaunchPlan::kAuto) ||
      launch > static_cast<int32_t>(ResolveLaunchPlan::kSplit))
    return invalid("launch", std::to_string(launch) + " is not 0 (auto), 1 (fused) or 2 (split)");
  return ffi::Error::Success();
}

}  // namespace

ffi::Error ResolveCudaLaunch(cudaStream_t stream, ffi::AnyBuffer pool, ffi::AnyBuffer selection,
                           ffi::AnyBuffer sealed, ffi::AnyBuffer layer, ffi::AnyBuffer hot_in,
                           ffi::AnyBuffer slot_record_in, ffi::AnyBuffer lru_in,
                           ffi::Result<ffi::AnyBuffer> slots,
                           ffi::Result<ffi::AnyBuffer> miss_records,
                           ffi::Result<ffi::AnyBuffer> miss_slots,
                           ffi::Result<ffi::AnyBuffer> misses,
                           ffi::Result<ffi::AnyBuffer> invalid,
                           ffi::Result<ffi::AnyBuffer> malformed, ffi::Result<ffi::AnyBuffer> hot,
                           ffi::Result<ffi::AnyBuffer> slot_record,
                           ffi::Result<ffi::AnyBuffer> lru, bool fetch, int32_t launch,
                           int64_t prefetch_slot) {
  const char* op = prefetch_slot < 0 ? "hisparse_resolve" : "hisparse_resolve_prefetch";
  auto dims = CheckResolve(pool, selection, sealed, layer, hot_in, slot_record_in, lru_in);
  if (dims.has_error()) return dims.error();
  if (auto err = CheckCudaLimits(*dims, launch); err.failure()) return err;

  for (auto [in, out, name] : {std::tuple{hot_in, &hot, "hot"},
                               {slot_record_in, &slot_record, "slot_record"},
                               {lru_in, &lru, "lru"}}) {
    if (auto err = Carry(op, name, in, *out, stream); err.failure())
      return err;
  }
  const char* failed_kernel = "hisparse resolve kernel";
  const auto* layer_index = static_cast<const int32_t*>(layer.untyped_data());
  const ResolveBuffers io = ResolveIo(pool, selection, sealed, slots, miss_records, miss_slots, misses,
                                      invalid, malformed, hot, slot_record, lru);
  const bool fork = prefetch_slot >= 0 && fetch;
  cudaError_t err = LaunchResolve(*dims, layer_index, io, fetch && !fork,
                                  static_cast<ResolveLaunchPlan>(launch), stream, &failed_kernel);
  if (err == cudaSuccess && fork) {
    // The decision stays on XLA's stream; the copy reads the miss plan it wrote.
    const ResolveDims d = *dims;
    err = ForkPrefetch(stream, prefetch_slot, [&](cudaStream_t side) {
      return LaunchResolveFetch(d, layer_index, io, PrefetchFetchBlocks(), side, &failed_kernel);
    });
  }
  if (err != cudaSuccess) return CudaError(op, std::string("launching the ") + failed_kernel, err);
  return ffi::Error::Success();
}

namespace {

ffi::Error ResolveCudaImpl(cudaStream_t stream, ffi::AnyBuffer pool, ffi::AnyBuffer selection,
                           ffi::AnyBuffer sealed, ffi::AnyBuffer layer, ffi::AnyBuffer hot_in,
                           ffi::AnyBuffer slot_record_in, ffi::AnyBuffer lru_in,
                           ffi::Result<ffi::AnyBuffer> slots,
                           ffi::Result<ffi::AnyBuffer> miss_records,
                           ffi::Result<ffi::AnyBuffer> miss_slots,
                           ffi::Result<ffi::AnyBuffer> misses,
                           ffi::Result<ffi::AnyBuffer> invalid,
                           ffi::Result<ffi::AnyBuffer> malformed, ffi::Result<ffi::AnyBuffer> hot,
                           ffi::Result<ffi::AnyBuffer> slot_record,
                           ffi::Result<ffi::AnyBuffer> lru, bool fetch, int32_t launch) {
  return ResolveCudaLaunch(stream, pool, selection, sealed, layer, hot_in, slot_record_in, lru_in,
                           slots, miss_records, miss_slots, misses, invalid, malformed, hot,
                           slot_record, lru, fetch, launch, /*prefetch_slot=*/-1);
}

ffi::Error PoolWriteCudaImpl(cudaStream_t stream, ffi::AnyBuffer pool_in, ffi::AnyBuffer records,
                             ffi::AnyBuffer start, ffi::AnyBuffer count,
                             ffi::Result<ffi::AnyBuffer> pool) {
  constexpr const char* op = "hisparse_pool_write";
  auto dims = CheckPoolWrite(pool_in, records, start, count);
  if (dims.has_error()) return dims.error();
  if (auto err = Carry(op, "host_pool", pool_in, pool, stream); err.failure())
    return err;
  const char* failed_kernel = "hisparse pool write kernel";
  const cudaError_t err =
      LaunchPoolWrite(*dims, static_cast<const uint8_t*>(records.untyped_data()),
                      static_cast<const int32_t*>(start.untyped_data()),
                      static_cast<const int32_t*>(count.untyped_data()),
                      static_cast<uint8_t*>(pool->untyped_data()), stream, &failed_kernel);
  if (err != cudaSuccess) return CudaError(op, std::string("launching the ") + failed_kernel, err);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HisparseResolveCuda, hisparse::ResolveCudaImpl,
    hisparse::BindResolveOperands(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HisparsePoolWriteCuda, hisparse::PoolWriteCudaImpl,
    hisparse::BindPoolWriteOperands(
        xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});

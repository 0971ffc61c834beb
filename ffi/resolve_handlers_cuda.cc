// XLA FFI handler of RESOLVE for platform "CUDA": check, carry the aliased
// state when XLA did not donate it, then enqueue the kernels of
// resolve_kernels.cu. It only enqueues work on XLA's stream (the layer index
// stays on the device, read by the kernels), so it is marked
// kCmdBufferCompatible.
// (The prefetch variant, prefetch_handlers_cuda.cc, forks its copy onto a
// stream of its own and is not.)
#include "resolve_handlers_cuda.h"

#include <cuda_runtime_api.h>

#include <string>
#include <tuple>

#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "prefetch_cuda.h"
#include "resolve.h"
#include "resolve_checks.h"
#include "resolve_cuda.h"

namespace hisparse {
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

ffi::Error ResolveCudaLaunch(cudaStream_t stream, ResolveOperands& ops, bool fetch,
                             int32_t launch, int64_t stream_begin, int64_t stream_count,
                             int64_t prefetch_slot) {
  const char* op = prefetch_slot < 0 ? "hisparse_resolve" : "hisparse_resolve_prefetch";
  auto dims = CheckResolve(ops);
  if (dims.has_error()) return dims.error();
  if (auto err = CheckCudaLimits(*dims, launch); err.failure()) return err;
  auto checked_range = CheckStreamRange(op, *dims, stream_begin, stream_count);
  if (checked_range.has_error()) return checked_range.error();
  const StreamRange range = *checked_range;

  for (auto [in, out, name] : {std::tuple{ops.hot_in, &ops.hot, "hot"},
                               {ops.slot_record_in, &ops.slot_record, "slot_record"},
                               {ops.lru_in, &ops.lru, "lru"}}) {
    if (auto err = Carry(op, name, in, *out, stream); err.failure())
      return err;
  }
  const char* failed_kernel = "hisparse resolve kernel";
  const auto* layer_index = static_cast<const int32_t*>(ops.layer.untyped_data());
  const ResolveBuffers io = ResolveIo(ops);
  const bool fork = prefetch_slot >= 0 && fetch;
  cudaError_t err = LaunchResolve(*dims, range, layer_index, io, fetch && !fork,
                                  static_cast<ResolveLaunchPlan>(launch), stream, &failed_kernel);
  if (err == cudaSuccess && fork) {
    // The decision stays on XLA's stream; the copy reads the miss plan it wrote, the range's
    // streams only, with all of the copy's blocks.
    const ResolveDims d = *dims;
    err = ForkPrefetch(stream, prefetch_slot, ops.hot->untyped_data(), [&](cudaStream_t side) {
      return LaunchResolveFetch(d, range, layer_index, io, PrefetchFetchBlocks(), side, &failed_kernel);
    });
  }
  return LaunchResult(op, failed_kernel, err);
}

namespace {

ffi::Error ResolveCudaImpl(cudaStream_t stream, ResolveOperands& ops, bool fetch, int32_t launch,
                           int64_t stream_begin, int64_t stream_count) {
  return ResolveCudaLaunch(stream, ops, fetch, launch, stream_begin, stream_count,
                           /*prefetch_slot=*/-1);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseResolveCuda,
                             hisparse::WithResolveOperands<cudaStream_t>(hisparse::ResolveCudaImpl),
                             hisparse::BindResolveOperands);

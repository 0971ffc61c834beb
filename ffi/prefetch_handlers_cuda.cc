// XLA FFI handlers of the prefetch calls (prefetch.h) for platform "CUDA".
// Not kCmdBufferCompatible: the resolve forks its copy onto the prefetch
// stream and a later call joins it, which no single captured graph can hold.
#include <cuda_runtime_api.h>

#include <tuple>

#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "prefetch_checks.h"
#include "prefetch_cuda.h"
#include "resolve_checks.h"
#include "resolve_handlers_cuda.h"

namespace hisparse {
namespace {

ffi::Error ResolvePrefetchCudaImpl(cudaStream_t stream, ResolveOperands& ops, bool fetch,
                                   int32_t launch, int64_t stream_begin, int64_t stream_count,
                                   int64_t prefetch_slot) {
  if (auto err = CheckPrefetchSlot("hisparse_resolve_prefetch", prefetch_slot); err.failure())
    return err;
  return ResolveCudaLaunch(stream, ops, fetch, launch, stream_begin, stream_count, prefetch_slot);
}

ffi::Error PrefetchJoinCudaImpl(cudaStream_t stream, ffi::AnyBuffer hot_in, ffi::AnyBuffer misses_in,
                                ffi::AnyBuffer miss_records, ffi::AnyBuffer miss_slots,
                                ffi::AnyBuffer layer, ffi::AnyBuffer /*after*/,
                                ffi::Result<ffi::AnyBuffer> hot, ffi::Result<ffi::AnyBuffer> misses,
                                int64_t prefetch_slot) {
  constexpr const char* op = "hisparse_prefetch_join";
  if (auto err = CheckPrefetchJoin(hot_in, misses_in, miss_records, miss_slots, layer, hot, misses,
                                   prefetch_slot);
      err.failure())
    return err;
  // The wait comes first: a carried copy of hot must see the records.
  bool other_destination = false;
  if (cudaError_t err = JoinPrefetch(stream, prefetch_slot, hot_in.untyped_data(), &other_destination);
      err != cudaSuccess)
    return CudaError(op, "waiting for the prefetch stream", err);
  if (other_destination)
    return ffi::Error::InvalidArgument(
        std::string(op) + ": the copy of prefetch_slot " + std::to_string(prefetch_slot) +
        " writes another hot buffer than this join's: join a PendingFetch into the cache its "
        "resolve_prefetch returned, in the same jitted program (outside one, the join gets a copy "
        "of the buffer taken before the records land)");
  for (auto [in, out, name] : {std::tuple{hot_in, &hot, "hot"}, {misses_in, &misses, "misses"}}) {
    if (auto err = Carry(op, name, in, *out, stream); err.failure()) return err;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hisparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HisparseResolvePrefetchCuda,
    hisparse::WithResolveOperands<cudaStream_t>(hisparse::ResolvePrefetchCudaImpl),
    hisparse::WithPrefetchSlot(hisparse::BindResolveOperands(hisparse::BindWithStream())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HisparsePrefetchJoinCuda, hisparse::PrefetchJoinCudaImpl,
                              hisparse::BindPrefetchJoinOperands(hisparse::BindWithStream()));

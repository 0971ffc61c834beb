// The copy kernels of RESOLVE's split plan and of the pool write: many blocks
// move rows between the pinned host pool and device memory with the record copy
// of record_copy.cuh. Included by resolve_kernels.cu after resolve_device.cuh.
#ifndef HISPARSE_FFI_RESOLVE_FETCH_KERNELS_CUH_
#define HISPARSE_FFI_RESOLVE_FETCH_KERNELS_CUH_

namespace hisparse {
namespace {

// ---------------------------------------------------------------------------
// Split plan: copy every stream's misses with many blocks.

template <typename V>
__global__ void __launch_bounds__(kFetchThreads) FetchKernel(const FetchArgs a) {
  const int stream = static_cast<int>(a.stream_begin) + static_cast<int>(blockIdx.x / a.chunks);
  const int chunk = blockIdx.x % a.chunks;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int layer = *a.layer;
  if (layer < 0 || layer >= a.layers) return;
  const int misses = a.misses[stream];
  const int64_t ls = int64_t{layer} * a.streams + stream;
  const int64_t W = a.record_bytes;
  const int64_t out = int64_t{stream} * a.top_k;
  const int32_t* miss_records = a.miss_records + out;
  const int32_t* miss_slots = a.miss_slots + out;
  auto plan_at = [=](int m) { return make_int2(miss_slots[m], miss_records[m]); };
  CopyMisses<V, kFetchCopyUnroll>(a.host_pool + ls * a.pool_records * W, a.hot + ls * a.hot_slots * W,
                                  W, a.hot_slots, a.pool_records, a.row_batch, misses,
                                  chunk * kFetchWarps + warp, a.chunks * kFetchWarps, lane,
                                  plan_at);
}

// ---------------------------------------------------------------------------
// Pool write: one warp per row, straight into pinned host memory.

template <typename V>
__global__ void __launch_bounds__(kFetchThreads) PoolWriteKernel(const PoolWriteArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * kFetchWarps;
  const int64_t n = a.rows, W = a.record_bytes, R = a.pool_records;
  const int vectors = static_cast<int>(W / static_cast<int64_t>(sizeof(V)));
  const int64_t total = a.layers * a.streams * n;
  for (int64_t row = int64_t{blockIdx.x} * kFetchWarps + threadIdx.x / kWarp; row < total;
       row += warps) {
    const int64_t ls = row / n, i = row - ls * n, s = ls % a.streams;
    const int32_t offered = a.count[s];
    const int64_t count = offered < 0 ? 0 : (offered < n ? offered : n);
    const int64_t r = int64_t{a.start[s]} + i;
    if (i >= count || r < 0 || r >= R) continue;
    // Row-relative addressing: rec 0 of the row's own base, slot 0 of the pool row.
    CopyRowBatch<V, kFetchCopyUnroll, false>(a.records + row * W, a.host_pool + (ls * R + r) * W, W,
                                             vectors, 1, lane, 0, 0);
  }
}

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_FETCH_KERNELS_CUH_

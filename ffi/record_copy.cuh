// The record copy of RESOLVE's kernels (resolve_kernels.cu, resolve_fetch_kernels.cuh):
// one warp moves a batch of rows between the pinned host pool and device
// memory. Part of resolve_device.cuh, which includes it where its constants
// are defined; never included on its own.
#ifndef HISPARSE_FFI_RECORD_COPY_CUH_
#define HISPARSE_FFI_RECORD_COPY_CUH_

namespace hisparse {
namespace {

template <typename V>
__device__ __forceinline__ V LoadPool(const V* p) {
  return __ldg(p);  // ld.global.nc: the pool is read-only during the call
}

// One warp copies the rows of one batch: row t < rows (t < 32) goes from
// src_base + rec_t * W to dst_base + slot_t * W, where lane t holds rec_t and
// slot_t (rec_t < 0: skip). The rows' vectors are numbered flat (row-major)
// and dealt to the lanes kUnroll at a time, loads first, then stores, so a
// warp keeps up to 32 x kUnroll vectors in flight. rows * n <= 32 * kUnroll
// unless rows == 1 (long records loop over segments).
template <typename V, int kUnroll, bool kStreamingStore>
__device__ __forceinline__ void CopyRowBatch(const uint8_t* src_base, uint8_t* dst_base,
                                             int64_t record_bytes, int n, int rows, int lane,
                                             int lane_rec, int lane_slot) {
  const int total = rows * n;
  for (int base = 0; base < total; base += kWarp * kUnroll) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = base + u * kWarp + lane;
      const int t = rows == 1 ? 0 : f / n;
      const int rec = __shfl_sync(kFullMask, lane_rec, t & (kWarp - 1));
      if (f < total && rec >= 0)
        v[u] = LoadPool(reinterpret_cast<const V*>(src_base + rec * record_bytes) + (f - t * n));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = base + u * kWarp + lane;
      const int t = rows == 1 ? 0 : f / n;
      const int rec = __shfl_sync(kFullMask, lane_rec, t & (kWarp - 1));
      const int slot = __shfl_sync(kFullMask, lane_slot, t & (kWarp - 1));
      if (f < total && rec >= 0 && slot >= 0) {
        V* dst = reinterpret_cast<V*>(dst_base + slot * record_bytes) + (f - t * n);
        if constexpr (kStreamingStore) {
          __stcg(dst, v[u]);
        } else {
          *dst = v[u];
        }
      }
    }
  }
}

// Rows a warp copies per batch so that rows * n fills 32 x unroll vectors.
__host__ __device__ __forceinline__ int RowBatch(int64_t vectors_per_row, int unroll) {
  const int64_t capacity = int64_t{kWarp} * unroll;
  if (vectors_per_row >= capacity) return 1;
  const int64_t rows = capacity / vectors_per_row;
  return rows > kWarp ? kWarp : static_cast<int>(rows);
}

// Copies misses [0, M) of one stream with `warps` warps, warp g taking the
// misses g + t * warps of each batch of rows_per_warp * warps. The plan is
// read through `plan_at(m) -> int2 {slot, record}`; an entry outside the hot
// buffer or the pool is skipped (none reaches here: a malformed state
// resolves nothing, so this only keeps any plan inside the stream's rows).
template <typename V, int kUnroll, typename PlanAt>
__device__ __forceinline__ void CopyMisses(const uint8_t* src_base, uint8_t* dst_base,
                                           int64_t record_bytes, int hot_slots, int pool_records,
                                           int max_batch, int misses, int warp, int warps,
                                           int lane, PlanAt plan_at) {
  if (misses <= 0) return;
  const int n = static_cast<int>(record_bytes / static_cast<int64_t>(sizeof(V)));
  // Few misses: one row per warp spreads them over more warps (and SMs).
  const int per_warp = (misses + warps - 1) / warps;
  const int rows = per_warp < max_batch ? per_warp : max_batch;
  for (int first = 0; first < misses; first += rows * warps) {
    int lane_rec = -1, lane_slot = -1;
    const int m = first + warp + lane * warps;
    if (lane < rows && m < misses) {
      const int2 p = plan_at(m);
      if (p.x >= 0 && p.x < hot_slots && p.y >= 0 && p.y < pool_records) {
        lane_slot = p.x;
        lane_rec = p.y;
      }
    }
    CopyRowBatch<V, kUnroll, true>(src_base, dst_base, record_bytes, n, rows, lane, lane_rec,
                                   lane_slot);
  }
}

}  // namespace
}  // namespace hisparse

#endif  // HISPARSE_FFI_RECORD_COPY_CUH_

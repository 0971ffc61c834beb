// The prefetch stream of each device and the completion events of its copies
// (prefetch.h): raw CUDA, no XLA types.
#ifndef HISPARSE_FFI_PREFETCH_CUDA_H_
#define HISPARSE_FFI_PREFETCH_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace hisparse {

// Blocks of the fetch kernel on the prefetch stream. The copy is latency-bound
// on the host link: 16 or more blocks reach the link's zero-copy rate on an
// H200, and each block holds a share of an SM's registers for as long as the
// copy lasts, which the kernels it overlaps then lack (BENCHMARKS.md: with 64
// blocks the overlapped kernels slowed by about as much as the copy hid).
inline constexpr int64_t kPrefetchFetchBlocks = 16;

// The fetch kernel's blocks: HISPARSE_PREFETCH_BLOCKS (a positive integer, read
// once per process: an A/B knob for benchmarks) or kPrefetchFetchBlocks.
int64_t PrefetchFetchBlocks();

// Enqueues what `launch` enqueues on the stream it is given (the current
// device's prefetch stream, high priority, created on first use) after all
// work already enqueued on `stream`, and records its completion under `slot`
// with the hot buffer it writes (`destination`). Returns the first error of an
// event, the stream or `launch`.
cudaError_t ForkPrefetch(cudaStream_t stream, int64_t slot, const void* destination,
                         const std::function<cudaError_t(cudaStream_t)>& launch);

// Makes `stream` wait for the last copy ForkPrefetch recorded under `slot` on
// the current device (none recorded: returns at once). Never waits for less:
// the prefetch stream is in order, so a later record of the slot covers it.
// *other_destination is set when that copy writes another hot buffer than
// `destination` (a join into another cache than the resolve's): then nothing
// is enqueued, since waiting would not put the records where the join says.
cudaError_t JoinPrefetch(cudaStream_t stream, int64_t slot, const void* destination,
                         bool* other_destination);

}  // namespace hisparse

#endif  // HISPARSE_FFI_PREFETCH_CUDA_H_

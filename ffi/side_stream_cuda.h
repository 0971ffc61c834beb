// Work beside the caller's stream within one call: a fork onto the device's
// side stream and a join back, raw CUDA, no XLA types.
//
// Why: a decode step's small, latency-bound launches (the MoE's shared expert:
// 26-41% of HBM alone at batch 2-17) leave most of the GPU idle while their
// few warps wait on memory, and the launch next to them (the routed experts)
// streams weights that do not depend on them. Run side by side, the small one
// hides under the large one. The fork and the join are one call's: the caller's
// stream goes on only after both launches, so the call is a single stream-ordered
// step for whoever enqueued it, and safe to record into a CUDA graph (the side
// stream joins the capture through the fork's event and leaves it at the join).
#ifndef HISPARSE_FFI_SIDE_STREAM_CUDA_H_
#define HISPARSE_FFI_SIDE_STREAM_CUDA_H_

#include <cuda_runtime_api.h>

#include <functional>

namespace hisparse {

// Enqueues what `side` enqueues on the current device's side stream (high
// priority, created on first use) and what `main` enqueues on `stream`, both
// after all work already on `stream`; work enqueued on `stream` afterwards
// waits for both. `side` is enqueued first: with the higher priority its blocks
// are placed first when both launches compete for SMs. Returns the first error
// of an event, the side stream, `side` or `main` (the join is still enqueued
// after an error of `main`, so the side stream never stays forked).
cudaError_t RunBeside(cudaStream_t stream, const std::function<cudaError_t(cudaStream_t)>& side,
                      const std::function<cudaError_t(cudaStream_t)>& main);

}  // namespace hisparse

#endif  // HISPARSE_FFI_SIDE_STREAM_CUDA_H_

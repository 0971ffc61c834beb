// The side stream of each device and the events of its fork and join
// (side_stream_cuda.h). One mutex makes a fork, its launches and its join one
// step for any other thread: an event is re-recorded only after the waits that
// read it were enqueued (cudaStreamWaitEvent reads the event's last record at
// enqueue time).
#include "side_stream_cuda.h"

#include <mutex>
#include <unordered_map>

namespace hisparse {
namespace {

struct DeviceSide {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;  // the caller's work before the call
  cudaEvent_t join = nullptr;  // the side stream's launches of the call
};

std::mutex mu;
// Never freed: the streams and events live as long as the process (XLA's programs
// may run until it exits).
std::unordered_map<int, DeviceSide>* devices = new std::unordered_map<int, DeviceSide>();

// The device's side stream and events, created on first use. Under stream capture (a first
// call recorded into a CUDA graph) creating them would be refused as unsafe in the capture's
// mode, so the thread's mode is relaxed for the creation only: nothing here enqueues work.
cudaError_t ForDevice(DeviceSide** out) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  DeviceSide& d = (*devices)[device];
  if (d.stream == nullptr) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode); err != cudaSuccess) return err;
    int least = 0, greatest = 0;
    cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&d.fork, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&d.join, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaStreamCreateWithPriority(&d.stream, cudaStreamNonBlocking, greatest);
    cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
    if (err != cudaSuccess) {
      d = DeviceSide{};
      return err;
    }
  }
  *out = &d;
  return cudaSuccess;
}

}  // namespace

cudaError_t RunBeside(cudaStream_t stream, const std::function<cudaError_t(cudaStream_t)>& side,
                      const std::function<cudaError_t(cudaStream_t)>& main) {
  std::lock_guard<std::mutex> lock(mu);
  DeviceSide* d = nullptr;
  if (cudaError_t err = ForDevice(&d); err != cudaSuccess) return err;
  if (cudaError_t err = cudaEventRecord(d->fork, stream); err != cudaSuccess) return err;
  if (cudaError_t err = cudaStreamWaitEvent(d->stream, d->fork, 0); err != cudaSuccess) return err;
  cudaError_t first = side(d->stream);
  // The join is enqueued whatever failed: a side stream left forked would fail the capture.
  const cudaError_t joined = cudaEventRecord(d->join, d->stream);
  const cudaError_t launched = first == cudaSuccess ? main(stream) : cudaSuccess;
  const cudaError_t waited = cudaStreamWaitEvent(stream, d->join, 0);
  for (cudaError_t err : {first, joined, launched, waited})
    if (err != cudaSuccess) return err;
  return cudaSuccess;
}

}  // namespace hisparse

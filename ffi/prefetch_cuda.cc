// The prefetch stream of each device and the events that join its copies
// (prefetch_cuda.h). One mutex serializes forks and joins: a fork's wait,
// launch and record are one step for any other thread that forks or joins,
// so a join always sees a record whose copy was enqueued before it.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "prefetch_cuda.h"

namespace hisparse {
namespace {

struct DevicePrefetch {
  cudaStream_t stream = nullptr;
  cudaEvent_t decided = nullptr;  // the compute stream's work before a fork
  std::unordered_map<int64_t, cudaEvent_t> done;  // slot -> its last copy's completion
  std::unordered_map<int64_t, const void*> destination;  // slot -> the hot buffer its last copy writes
};

std::mutex mu;
// Never freed: the streams and events live as long as the process (XLA's
// programs may run until it exits).
std::unordered_map<int, DevicePrefetch>* devices = new std::unordered_map<int, DevicePrefetch>();

cudaError_t NewEvent(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
}

cudaError_t ForDevice(DevicePrefetch** out) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  DevicePrefetch& d = (*devices)[device];
  if (d.stream == nullptr) {
    // Highest priority: the copy's few blocks start as soon as an SM frees up,
    // instead of queueing behind the large grids of the kernels it overlaps.
    int least = 0, greatest = 0;
    if (cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest); err != cudaSuccess)
      return err;
    if (cudaError_t err = NewEvent(&d.decided); err != cudaSuccess) return err;
    if (cudaError_t err = cudaStreamCreateWithPriority(&d.stream, cudaStreamNonBlocking, greatest);
        err != cudaSuccess)
      return err;
  }
  *out = &d;
  return cudaSuccess;
}

}  // namespace

int64_t PrefetchFetchBlocks() {
  static const int64_t blocks = [] {
    const char* text = std::getenv("HISPARSE_PREFETCH_BLOCKS");
    if (text == nullptr || *text == '\0') return kPrefetchFetchBlocks;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end == '\0' && value > 0 && value <= (1 << 20)) return static_cast<int64_t>(value);
    // Said once, on stderr: a handler cannot fail a call over a benchmark knob.
    std::fprintf(stderr, "hisparse: HISPARSE_PREFETCH_BLOCKS=%s is not an integer in [1, 2^20]; using %lld\n",
                 text, static_cast<long long>(kPrefetchFetchBlocks));
    return kPrefetchFetchBlocks;
  }();
  return blocks;
}

cudaError_t ForkPrefetch(cudaStream_t stream, int64_t slot, const void* destination,
                         const std::function<cudaError_t(cudaStream_t)>& launch) {
  std::lock_guard<std::mutex> lock(mu);
  DevicePrefetch* d = nullptr;
  if (cudaError_t err = ForDevice(&d); err != cudaSuccess) return err;
  cudaEvent_t& done = d->done[slot];
  if (done == nullptr) {
    if (cudaError_t err = NewEvent(&done); err != cudaSuccess) return err;
  }
  if (cudaError_t err = cudaEventRecord(d->decided, stream); err != cudaSuccess) return err;
  if (cudaError_t err = cudaStreamWaitEvent(d->stream, d->decided, 0); err != cudaSuccess) return err;
  if (cudaError_t err = launch(d->stream); err != cudaSuccess) return err;
  d->destination[slot] = destination;
  return cudaEventRecord(done, d->stream);
}

cudaError_t JoinPrefetch(cudaStream_t stream, int64_t slot, const void* destination,
                         bool* other_destination) {
  std::lock_guard<std::mutex> lock(mu);
  *other_destination = false;
  DevicePrefetch* d = nullptr;
  if (cudaError_t err = ForDevice(&d); err != cudaSuccess) return err;
  const auto found = d->done.find(slot);
  if (found == d->done.end()) return cudaSuccess;
  const auto written = d->destination.find(slot);
  if (written != d->destination.end() && written->second != destination) {
    *other_destination = true;
    return cudaSuccess;
  }
  return cudaStreamWaitEvent(stream, found->second, 0);
}

}  // namespace hisparse

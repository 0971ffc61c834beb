// What the standalone CUDA programs share: the checkers (ffi/tests) and the
// kernel benchmarks (ffi/bench). Each program is one translation unit that
// includes this once. Harness code only: the FFI handlers return their errors
// to XLA instead of exiting.
//
//   CUDA_OK(expr)       stop with the failing call, its place and CUDA's message (exit 2)
//   Stats, Summarize    min / median / max of timed samples, in microseconds
//   TimeLaunches        event-timed launches queued behind a Spin, after 3 untimed warm-ups
//   Spin                hold the GPU so the host can queue timed work behind it
//   Mix, Uniform        splitmix64 and a value in [-1, 1) from an index and a seed (random fills)
//   ReadAll             the HBM read ceiling kernel
#ifndef HISPARSE_FFI_TESTS_HARNESS_H_
#define HISPARSE_FFI_TESTS_HARNESS_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t err_ = (expr);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,               \
                   cudaGetErrorString(err_));                                          \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

namespace harness {

struct Stats {
  double min_us = 0, median_us = 0, max_us = 0;
};

inline Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  Stats s;
  s.min_us = v.front();
  s.max_us = v.back();
  s.median_us = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

// Holds the GPU busy for `ns` nanoseconds so the host can queue the timed work behind it.
__global__ void Spin(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

__host__ __device__ inline uint64_t Mix(uint64_t z) {  // splitmix64
  z = (z + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A value in [-1, 1) from an index and a seed.
__host__ __device__ inline float Uniform(uint64_t i, uint64_t seed) {
  return static_cast<float>(static_cast<int64_t>(Mix(i ^ (seed << 40)) >> 40) - (1ll << 23)) * 0x1p-23f;
}

// The read ceiling: every 16 bytes loaded once, folded so nothing is dead code.
__global__ void ReadAll(const uint4* __restrict__ p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never; keeps the loads
}

// Times `launch(i)` for i < iters, each between two events: 3 untimed calls
// first, then every timed call queued behind a 20 ms Spin, so the GPU time
// is measured and not the host's launch latency.
template <typename Fn>
Stats TimeLaunches(cudaStream_t stream, int iters, Fn&& launch) {
  for (int i = 0; i < 3; ++i) launch(i);
  std::vector<cudaEvent_t> start(iters), stop(iters);
  for (int i = 0; i < iters; ++i) {
    CUDA_OK(cudaEventCreate(&start[i]));
    CUDA_OK(cudaEventCreate(&stop[i]));
  }
  Spin<<<1, 1, 0, stream>>>(20'000'000);  // the host queues everything while the GPU waits
  for (int i = 0; i < iters; ++i) {
    CUDA_OK(cudaEventRecord(start[i], stream));
    launch(i);
    CUDA_OK(cudaEventRecord(stop[i], stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1000.0 * ms;
    CUDA_OK(cudaEventDestroy(start[i]));
    CUDA_OK(cudaEventDestroy(stop[i]));
  }
  return Summarize(us);
}

}  // namespace harness

#endif  // HISPARSE_FFI_TESTS_HARNESS_H_

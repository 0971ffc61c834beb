// What the standalone CUDA programs share: the checkers (ffi/tests) and the
// kernel benchmarks (ffi/bench). Each program is one translation unit that
// includes this once. Harness code only: the FFI handlers return their errors
// to XLA instead of exiting.
//
//   CUDA_OK(expr)       stop with the failing call, its place and CUDA's message (exit 2)
//   Stats, Summarize    min / median / max of timed samples, in microseconds
//   EventTimes          microseconds of each launch between two events, after warm-ups
//   TimeLaunches        EventTimes queued behind one 20 ms Spin, summarized
//   QueryDevice         the device, its properties and the CUDA versions
//   DeviceLine          the device, as a benchmark's header names it
//   OpenJson            a benchmark's JSON output (exit 2 when it cannot be written)
//   Spin                hold the GPU so the host can queue timed work behind it
//   Mix, Uniform        splitmix64 and a value in [-1, 1) from an index and a seed (random fills)
//   ReadAll, HbmCeilings  the HBM ceilings: a device-to-device memcpy and a read kernel
//   MeasureHbmCeilingsOver  the same over fresh memory a benchmark's fill kernel fills
//   CheckOptions        the checkers' flags (--quick --race --quiet --seed N --only SUBSTRING --shard I/N)
//   StartCheck          parse those flags and print the device line
//   Rng, Uniform, Unit  the checkers' seeded host random numbers
//   Format              printf into a std::string (failure messages)
//   GuardsHold          whether the guard bytes around a checked device buffer are intact
//   DeviceBuffer        a checked kernel's device buffer between guard bytes
#ifndef HISPARSE_FFI_TESTS_HARNESS_H_
#define HISPARSE_FFI_TESTS_HARNESS_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
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

// Microseconds of launch(i) for i < reps, each between two events, after
// `warmup` untimed calls. The timed calls queue behind a Spin of `spin_first_ns`
// (the host queues everything while the GPU waits) and, with spin_each_ns > 0,
// each behind a Spin of its own, so the GPU time is measured and not the host's
// launch latency.
template <typename Fn>
std::vector<double> EventTimes(cudaStream_t stream, int reps, int warmup, uint64_t spin_first_ns,
                               uint64_t spin_each_ns, Fn&& launch) {
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    CUDA_OK(cudaEventCreate(&start[i]));
    CUDA_OK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < warmup; ++i) launch(i);
  if (spin_first_ns > 0) Spin<<<1, 1, 0, stream>>>(spin_first_ns);
  for (int i = 0; i < reps; ++i) {
    if (spin_each_ns > 0) Spin<<<1, 1, 0, stream>>>(spin_each_ns);
    CUDA_OK(cudaEventRecord(start[i], stream));
    launch(i);
    CUDA_OK(cudaEventRecord(stop[i], stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1000.0 * ms;
    CUDA_OK(cudaEventDestroy(start[i]));
    CUDA_OK(cudaEventDestroy(stop[i]));
  }
  return us;
}

// Times `launch(i)` for i < iters: 3 untimed calls first, then every timed
// call queued behind one 20 ms Spin.
template <typename Fn>
Stats TimeLaunches(cudaStream_t stream, int iters, Fn&& launch) {
  return Summarize(EventTimes(stream, iters, /*warmup=*/3, /*spin_first_ns=*/20'000'000,
                              /*spin_each_ns=*/0, launch));
}

struct DeviceInfo {
  int device = 0, runtime = 0, driver = 0;
  cudaDeviceProp prop;
};

inline DeviceInfo QueryDevice() {
  DeviceInfo d;
  CUDA_OK(cudaGetDevice(&d.device));
  CUDA_OK(cudaGetDeviceProperties(&d.prop, d.device));
  CUDA_OK(cudaRuntimeGetVersion(&d.runtime));
  CUDA_OK(cudaDriverGetVersion(&d.driver));
  return d;
}

// Opens a benchmark's JSON output for writing; exits 2 when it cannot.
inline FILE* OpenJson(const char* path) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(2);
  }
  return f;
}

// GB/s of the HBM ceilings over `bytes` of device memory at src (filled by the
// caller): a memcpy to dst (read + write, so twice the bytes) and ReadAll over
// src; medians of 20 timed calls each.
struct HbmCeilings {
  double copy_gbs = 0, read_gbs = 0;
};

inline HbmCeilings MeasureHbmCeilings(cudaStream_t stream, const uint8_t* src, uint8_t* dst,
                                      int64_t bytes, int sms) {
  uint32_t* sink = nullptr;
  CUDA_OK(cudaMalloc(&sink, 4));
  const Stats copy = TimeLaunches(stream, 20, [&](int) {
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const Stats read = TimeLaunches(stream, 20, [&](int) {
    ReadAll<<<8 * sms, 512, 0, stream>>>(reinterpret_cast<const uint4*>(src), bytes / 16, sink);
    CUDA_OK(cudaGetLastError());
  });
  CUDA_OK(cudaFree(sink));
  return {2.0 * bytes / (copy.median_us * 1e3), bytes / (read.median_us * 1e3)};
}

// MeasureHbmCeilings over `bytes` of fresh device memory that fill(src) fills
// on `stream` (a benchmark's own fill kernel); frees the memory after.
template <typename Fill>
HbmCeilings MeasureHbmCeilingsOver(cudaStream_t stream, int64_t bytes, int sms, Fill&& fill) {
  uint8_t *src = nullptr, *dst = nullptr;
  CUDA_OK(cudaMalloc(&src, bytes));
  CUDA_OK(cudaMalloc(&dst, bytes));
  fill(src);
  const HbmCeilings hbm = MeasureHbmCeilings(stream, src, dst, bytes, sms);
  CUDA_OK(cudaFree(src));
  CUDA_OK(cudaFree(dst));
  return hbm;
}

// The checkers' command line: --quick (fewer cases), --race (the fewest cases
// and launch variants that still reach every code path, for compute-sanitizer's
// racecheck), --quiet (failures only), --seed N, --only SUBSTRING (cases whose
// name holds it), --shard I/N (the runs whose index is I modulo N, so that N
// processes can share a slow run such as racecheck's). Only checkers that start
// with StartCheck(..., Shards::kSplit) take --race and --shard; the others refuse
// them. Anything else prints the usage line and exits 2.
struct CheckOptions {
  bool quick = false, race = false, verbose = true;
  uint64_t seed = 0;
  std::string only;
  int64_t shard = 0, shards = 1;

  // Whether --only leaves the case `name` out.
  bool Skips(const std::string& name) const { return !only.empty() && name.find(only) == std::string::npos; }
  // Whether --shard leaves out the run at `index` (a case, or a case's launch variant: the checker's order).
  bool SkipsIndex(int64_t index) const { return index % shards != shard; }
};

// Parses --shard's "I/N" (0 <= I < N <= 4096) into `o`; false when malformed.
inline bool ParseShard(const std::string& text, CheckOptions& o) {
  const size_t slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size() || text.size() > 12) return false;
  for (size_t i = 0; i < text.size(); ++i)
    if (i != slash && (text[i] < '0' || text[i] > '9')) return false;
  const int64_t index = std::strtoll(text.substr(0, slash).c_str(), nullptr, 10);
  const int64_t count = std::strtoll(text.substr(slash + 1).c_str(), nullptr, 10);
  if (count < 1 || count > 4096 || index >= count) return false;
  o.shard = index;
  o.shards = count;
  return true;
}

// Whether a checker has a --race set and splits its runs by --shard.
enum class Shards { kWhole, kSplit };

inline CheckOptions ParseCheckOptions(int argc, char** argv, uint64_t default_seed, Shards shards = Shards::kWhole) {
  CheckOptions o;
  o.seed = default_seed;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--race") {
      if (shards == Shards::kWhole) {
        std::fprintf(stderr, "%s: --race: this checker has no race set; use --quick\n", argv[0]);
        std::exit(2);
      }
      o.quick = o.race = true;
    } else if (arg == "--quiet") {
      o.verbose = false;
    } else if (arg == "--seed" && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--only" && i + 1 < argc) {
      o.only = argv[++i];
    } else if (arg == "--shard" && i + 1 < argc) {
      if (shards == Shards::kWhole) {
        std::fprintf(stderr, "%s: --shard: this checker runs its cases whole; drop --shard\n", argv[0]);
        std::exit(2);
      }
      if (!ParseShard(argv[++i], o)) {
        std::fprintf(stderr, "%s: --shard takes I/N with 0 <= I < N <= 4096, e.g. --shard 0/4\n", argv[0]);
        std::exit(2);
      }
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--race] [--quiet] [--seed N] [--only SUBSTRING] [--shard I/N]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return o;
}

using Rng = std::mt19937_64;

inline int64_t Uniform(Rng& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
inline double Unit(Rng& rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

inline std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string Format(const char* fmt, ...) {
  char buffer[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buffer, sizeof(buffer), fmt, args);
  va_end(args);
  return buffer;
}

// Whether head_bytes of device memory at head and tail_bytes at tail all still
// hold `guard` (the guard areas a checker puts around a kernel's output).
inline bool GuardsHold(const uint8_t* head, size_t head_bytes, const uint8_t* tail, size_t tail_bytes,
                       uint8_t guard) {
  std::vector<uint8_t> h(head_bytes), t(tail_bytes);
  if (head_bytes) CUDA_OK(cudaMemcpy(h.data(), head, head_bytes, cudaMemcpyDeviceToHost));
  if (tail_bytes) CUDA_OK(cudaMemcpy(t.data(), tail, tail_bytes, cudaMemcpyDeviceToHost));
  return std::all_of(h.begin(), h.end(), [&](uint8_t b) { return b == guard; }) &&
         std::all_of(t.begin(), t.end(), [&](uint8_t b) { return b == guard; });
}

// A benchmark header's device: name (sm_XY, SMs, MiB of L2), CUDA runtime R, driver D.
inline std::string DeviceLine(const DeviceInfo& d) {
  return Format("%s (sm_%d%d, %d SMs, %.0f MiB L2), CUDA runtime %d, driver %d", d.prop.name, d.prop.major,
                d.prop.minor, d.prop.multiProcessorCount, d.prop.l2CacheSize / 1048576.0, d.runtime, d.driver);
}

// The device line a checker starts with.
inline void PrintCheckDevice(const CheckOptions& o) {
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, device));
  const char* set = o.race ? "; race" : (o.quick ? "; quick" : "");
  std::printf("device %d: %s (sm_%d%d, %d SMs); seed %llu%s\n", device, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, (unsigned long long)o.seed, set);
}

// A checker's start: its command line, then its device line.
inline CheckOptions StartCheck(int argc, char** argv, uint64_t default_seed, Shards shards = Shards::kWhole) {
  const CheckOptions options = ParseCheckOptions(argc, argv, default_seed, shards);
  PrintCheckDevice(options);
  return options;
}

// A checked kernel's device buffer of `count` T between guard bytes, the
// payload `misalign_bytes` past 256-byte alignment.
template <typename T>
class DeviceBuffer {
 public:
  static constexpr size_t kGuardBytes = 256;  // keeps 256-byte alignment of the payload
  static constexpr uint8_t kGuardByte = 0xA5;

  explicit DeviceBuffer(size_t count, size_t misalign_bytes = 0)
      : count_(count), lead_(kGuardBytes + misalign_bytes) {
    total_ = lead_ + count * sizeof(T) + kGuardBytes;
    CUDA_OK(cudaMalloc(&base_, total_));
    CUDA_OK(cudaMemset(base_, kGuardByte, total_));
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return reinterpret_cast<T*>(base_ + lead_); }
  size_t bytes() const { return count_ * sizeof(T); }
  void Upload(const T* host) {
    if (bytes() > 0) CUDA_OK(cudaMemcpy(get(), host, bytes(), cudaMemcpyHostToDevice));
    // A pageable cudaMemcpy may return before its DMA lands, and the kernels run on a
    // non-blocking stream that does not wait for the legacy stream.
    CUDA_OK(cudaDeviceSynchronize());
  }
  void Download(T* host) const {
    if (bytes() > 0) CUDA_OK(cudaMemcpy(host, get(), bytes(), cudaMemcpyDeviceToHost));
  }
  // Sets every payload byte to `byte` (the guards keep theirs), queued on the legacy stream.
  void Poison(uint8_t byte) { CUDA_OK(cudaMemset(get(), byte, bytes())); }
  // Poison, and wait until it is done.
  void Fill(uint8_t byte) {
    Poison(byte);
    CUDA_OK(cudaDeviceSynchronize());
  }
  // True when both guard areas still hold the guard pattern.
  bool GuardsIntact() const { return GuardsHold(base_, lead_, base_ + lead_ + bytes(), kGuardBytes, kGuardByte); }

 private:
  uint8_t* base_ = nullptr;
  size_t count_, lead_, total_ = 0;
};

}  // namespace harness

#endif  // HISPARSE_FFI_TESTS_HARNESS_H_

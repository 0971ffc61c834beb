// Bit-exactness check of the CUDA MoE ROUTE (moe_route_kernels.cu) against
// the CPU implementation (moe_route_cpu.cc): no XLA, no Python. Every case (T
// tokens x N scores, k choices, E local experts, a score distribution, a
// scaling) runs twice on the GPU: all five outputs (chosen, weights, order,
// inverse, group_sizes) are compared byte for byte with MoeRouteCpu's, the
// outputs are poisoned before each run (a different byte each time, so an
// entry the kernel never writes shows up whatever it holds), guard bytes
// around every output catch writes out of bounds, the scores sit in an
// allocation of exactly their size (compute-sanitizer's memcheck then flags
// any read past them), and the two runs must agree with each other
// (determinism).
//
// Cases: the glm5 decode shapes (N = 256, k = 8, E = 32, T in {1, 2, 9, 10,
// 17, 41, 64}); T in {0, 1, 2, 3, 17, 41, 64, 1000, 8192} (8192 x 8 = the
// kernel's limit of 65536 pairs); N in {1, 7, 32, 33, 256, 1000, 4096} with k
// in {1, 2, 8, N}; E in {1, 3, 32, 256, 1024}, E > N included; scores normal,
// sigmoid (router-like), quantized and all-equal (exact ties), specials (+-0,
// +-inf, NaNs of both signs and several payloads, subnormals), raw random bit
// patterns, and -NaN 0xffffffff (the lowest key) with -inf; scaling 1, 2.5 and
// 2^-130 (a subnormal: subnormal weights); both kernel paths (registers: N <=
// 256 and k <= 32; streaming otherwise), and scores misaligned to 4 bytes (no
// vector loads).
//
// Build (from the repository root; `make -C ffi/tests moe-route` does the same):
//   mkdir -p build/tests
//   nvcc -O2 -arch=sm_90 -std=c++17 -lineinfo -I ffi ffi/tests/moe_route_cuda_check.cu ffi/moe_route_kernels.cu ffi/moe_route_cpu.cc -o build/tests/moe_route_cuda_check
// Run:
//   build/tests/moe_route_cuda_check              # every case
//   build/tests/moe_route_cuda_check --quick      # small case set, for compute-sanitizer (racecheck < ~60 s)
//   build/tests/moe_route_cuda_check --only N256  # cases whose name contains "N256"
//   build/tests/moe_route_cuda_check --seed 7     # other random inputs
//   build/tests/moe_route_cuda_check --quiet      # print failures and the summary only
//   compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/moe_route_cuda_check --quick --quiet
//   compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 build/tests/moe_route_cuda_check --quick --quiet
// Last line: "N passed, M failed, K skipped"; the exit status is non-zero on failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "moe_route.h"
#include "moe_route_cuda.h"
#include "harness.h"

namespace {

using harness::DeviceBuffer;
using harness::Format;
using harness::Rng;
using harness::Uniform;
using harness::Unit;

using hisparse::MoeRouteBuffers;
using hisparse::MoeRouteDims;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// ---------------------------------------------------------------------------
// Inputs.

enum class Kind {
  kNormal,     // N(0, 1): distinct keys, both signs
  kSigmoid,    // sigmoid of N(0, 1): the router's scores (all in (0, 1))
  kQuantized,  // 7 distinct values: ties across and inside lanes
  kEqual,      // one value for the whole case (+-0, +-inf, 1): ties decide everything
  kSpecial,    // normals mixed with +-0, +-inf, NaNs of both signs and payloads, subnormals
  kRawBits,    // uniform random bit patterns
  kLowestKey,  // -NaN 0xffffffff (key 0, the lowest) and -inf: ties at the bottom of the order
};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNormal: return "normal";
    case Kind::kSigmoid: return "sigmoid";
    case Kind::kQuantized: return "quantized";
    case Kind::kEqual: return "equal";
    case Kind::kSpecial: return "special";
    case Kind::kRawBits: return "raw_bits";
    case Kind::kLowestKey: return "lowest_key";
  }
  return "?";
}

constexpr Kind kAllKinds[] = {Kind::kNormal,  Kind::kSigmoid, Kind::kQuantized, Kind::kEqual,
                              Kind::kSpecial, Kind::kRawBits, Kind::kLowestKey};

const float kSpecials[] = {
    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
    FromBits(0x7fc00000u), FromBits(0xffc00000u), FromBits(0x7fc00001u), FromBits(0xffc00001u),
    FromBits(0x7f800001u), FromBits(0xff800001u), FromBits(0x7fffffffu), FromBits(0xffffffffu),
    FromBits(0x00000001u), FromBits(0x80000001u), FromBits(0x007fffffu), FromBits(0x807fffffu),
    std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1.0f, -1.0f,
};

void FillScores(Kind kind, Rng& rng, std::vector<float>& scores) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float equal_values[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), 1.0f};
  const float equal_value = equal_values[Uniform(rng, 0, std::size(equal_values) - 1)];
  for (float& x : scores) {
    switch (kind) {
      case Kind::kNormal: x = normal(rng); break;
      case Kind::kSigmoid: x = 1.0f / (1.0f + std::exp(-normal(rng))); break;
      case Kind::kQuantized: x = 0.5f * static_cast<float>(Uniform(rng, -3, 3)); break;
      case Kind::kEqual: x = equal_value; break;
      case Kind::kSpecial:
        x = Unit(rng) < 0.4 ? kSpecials[Uniform(rng, 0, std::size(kSpecials) - 1)] : normal(rng);
        break;
      case Kind::kRawBits: x = FromBits(static_cast<uint32_t>(rng())); break;
      case Kind::kLowestKey:
        x = Unit(rng) < 0.6 ? FromBits(0xffffffffu)
                            : (Unit(rng) < 0.8 ? -std::numeric_limits<float>::infinity() : normal(rng));
        break;
    }
  }
}

// 2^-130: a subnormal, so every finite weight below 2^-4 comes out subnormal.
const float kTinyScaling = FromBits(0x00080000u);

// ---------------------------------------------------------------------------
// Cases.

struct Case {
  std::string name;
  int64_t tokens, scores, top_k, experts;
  Kind kind;
  float scaling;
  size_t misalign = 0;  // bytes added to the scores' address (4: no float4 loads)
};

std::vector<Case> MoeRouteCases(bool quick) {
  std::vector<Case> cases;
  auto add = [&](int64_t T, int64_t N, int64_t k, int64_t E, Kind kind, float scaling, size_t misalign = 0) {
    const char* scale_name = scaling == 1.0f ? "s1" : (scaling == 2.5f ? "s2.5" : "stiny");
    cases.push_back({Format("T%lld_N%lld_k%lld_E%lld_%s_%s%s", (long long)T, (long long)N, (long long)k,
                            (long long)E, KindName(kind), scale_name, misalign ? "_misaligned" : ""),
                     T, N, k, E, kind, scaling, misalign});
  };
  if (quick) {
    // Small enough for racecheck: both paths, every kind, several chunks of pairs.
    add(1, 256, 8, 32, Kind::kSigmoid, 2.5f);
    add(41, 256, 8, 32, Kind::kNormal, 2.5f);
    add(0, 256, 8, 32, Kind::kNormal, 1.0f);
    add(3, 1, 1, 3, Kind::kSpecial, 1.0f);
    add(5, 33, 33, 1024, Kind::kSpecial, kTinyScaling);
    add(64, 256, 8, 32, Kind::kQuantized, 1.0f);
    add(9, 37, 37, 7, Kind::kLowestKey, 1.0f);
    add(17, 256, 32, 256, Kind::kRawBits, 2.5f);
    add(6, 300, 40, 3, Kind::kEqual, 1.0f);
    add(300, 64, 8, 3, Kind::kQuantized, 2.5f);  // 2400 pairs: 3 chunks
    add(41, 256, 8, 32, Kind::kNormal, 1.0f, 4);
    return cases;
  }
  // The glm5 decode shapes.
  for (int64_t T : {1, 2, 9, 10, 17, 41, 64}) {
    add(T, 256, 8, 32, Kind::kSigmoid, 2.5f);
    add(T, 256, 8, 32, Kind::kNormal, 1.0f);
  }
  // Token counts up to the pair limit (8192 x 8 = 65536 pairs).
  const int64_t experts[] = {1, 3, 32, 256, 1024};
  int at = 0;
  for (int64_t T : {0, 1, 2, 3, 17, 41, 64, 1000, 8192}) {
    add(T, 256, 8, experts[at % 5], Kind::kNormal, 1.0f);
    add(T, 256, 8, experts[(at + 2) % 5], kAllKinds[at % std::size(kAllKinds)], at % 2 ? 2.5f : kTinyScaling);
    ++at;
  }
  // Row lengths and choice counts: both paths, k = N, E > N.
  const float scalings[] = {1.0f, 2.5f, kTinyScaling};
  at = 0;
  for (int64_t N : {1, 7, 32, 33, 256, 1000, 4096}) {
    std::vector<int64_t> ks = {1, std::min<int64_t>(2, N), std::min<int64_t>(8, N), N};
    std::sort(ks.begin(), ks.end());
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (int64_t k : ks) {
      const int64_t T =
          std::max<int64_t>(1, std::min<int64_t>(k * N > 100000 ? 16 : 41, hisparse::kMoeRouteMaxPairs / k));
      add(T, N, k, experts[at % 5], kAllKinds[at % std::size(kAllKinds)], scalings[at % 3]);
      add(T, N, k, 1024, kAllKinds[(at + 3) % std::size(kAllKinds)], scalings[(at + 1) % 3]);
      ++at;
    }
  }
  // Every kind of scores on each path's boundary shapes.
  for (Kind kind : kAllKinds) {
    add(64, 256, 8, 32, kind, 2.5f);
    add(17, 256, 32, 256, kind, 1.0f);     // the register path's largest k
    add(17, 256, 33, 3, kind, 1.0f);       // k > 32: streaming
    add(17, 257, 8, 32, kind, 2.5f);       // N > 256: streaming
    add(5, 33, 33, 1024, kind, kTinyScaling);
    add(41, 100, 8, 1, kind, 1.0f);        // N % 8 != 0: a partial lane
    add(12, 1000, 40, 256, kind, 2.5f);
  }
  // Misaligned scores: scalar loads on the register path.
  add(41, 256, 8, 32, Kind::kSigmoid, 2.5f, 4);
  add(17, 1000, 8, 32, Kind::kSpecial, 1.0f, 4);
  // Many chunks of pairs, heavily tied experts.
  add(8192, 256, 8, 1, Kind::kSigmoid, 2.5f);
  add(8192, 256, 8, 1024, Kind::kQuantized, 1.0f);
  add(2000, 256, 32, 32, Kind::kNormal, 1.0f);
  add(1000, 64, 8, 3, Kind::kEqual, 1.0f);
  add(1000, 4096, 8, 256, Kind::kNormal, 2.5f);
  add(65536, 1, 1, 1024, Kind::kNormal, 1.0f);  // k = N = 1 at the pair limit
  return cases;
}

// ---------------------------------------------------------------------------
// One case.

struct Report {
  std::string label;
  int printed = 0;
  bool failed = false;
  void Line(const std::string& text) {
    failed = true;
    if (printed < 12) std::printf("  FAIL %s: %s\n", label.c_str(), text.c_str());
    if (printed == 12) std::printf("  FAIL %s: (further mismatches not shown)\n", label.c_str());
    ++printed;
  }
};

// Byte-for-byte comparison of one output; `row` > 0 names the token of an entry.
template <typename T>
void Compare(Report& report, const char* what, const std::vector<T>& want, const std::vector<T>& got, int64_t row) {
  static_assert(sizeof(T) == 4, "int32 and float32 outputs");
  int64_t bad = 0;
  for (size_t at = 0; at < want.size(); ++at) {
    if (std::memcmp(&want[at], &got[at], sizeof(T)) == 0) continue;
    if (bad++ < 4) {
      uint32_t w, g;
      std::memcpy(&w, &want[at], 4);
      std::memcpy(&g, &got[at], 4);
      const std::string where = row > 0
                                    ? Format("token %lld, choice %lld", (long long)(at / row), (long long)(at % row))
                                    : Format("entry %lld", (long long)at);
      if constexpr (std::is_same<T, float>::value) {
        report.Line(Format("%s at %s: expected %.9g (0x%08x), got %.9g (0x%08x)", what, where.c_str(),
                           FromBits(w), w, FromBits(g), g));
      } else {
        report.Line(Format("%s at %s: expected %d, got %d", what, where.c_str(), static_cast<int32_t>(w),
                           static_cast<int32_t>(g)));
      }
    }
  }
  if (bad > 4) report.Line(Format("%s: %lld mismatches in all", what, (long long)bad));
}

// The scores in an allocation of exactly their bytes (plus the misalignment),
// so that memcheck reports any read outside them.
class TightScores {
 public:
  TightScores(const std::vector<float>& host, size_t misalign) : misalign_(misalign) {
    const size_t bytes = host.size() * sizeof(float) + misalign;
    CUDA_OK(cudaMalloc(&base_, std::max<size_t>(bytes, 1)));
    if (!host.empty())
      CUDA_OK(cudaMemcpy(base_ + misalign, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
  }
  ~TightScores() { cudaFree(base_); }
  TightScores(const TightScores&) = delete;
  TightScores& operator=(const TightScores&) = delete;
  const float* get() const { return reinterpret_cast<const float*>(base_ + misalign_); }

 private:
  uint8_t* base_ = nullptr;
  size_t misalign_;
};

__global__ void ReciprocalsKernel(const float* sums, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = hisparse::MoeRouteReciprocal(sums[i]);
  }
}

// Rule 2's weights as the GPU computes them: the CPU handler takes the IEEE 1 / sum, the GPU
// div.full.f32 (ffi/moe_route.h), so the sums' reciprocals come from the device and the rest,
// left-to-right sums and two round-to-nearest products with subnormals kept, from this thread.
void GpuWeights(const std::vector<float>& scores, const std::vector<int32_t>& chosen, int64_t T, int64_t N, int64_t k,
                float scaling, std::vector<float>& weights) {
  if (T == 0) return;
  std::vector<float> sums(T), reciprocals(T);
  for (int64_t t = 0; t < T; ++t) {
    volatile float sum = scores[t * N + chosen[t * k]];
    for (int64_t j = 1; j < k; ++j) sum = sum + scores[t * N + chosen[t * k + j]];
    sums[t] = sum;
  }
  DeviceBuffer<float> d_sums(T), d_reciprocals(T);
  d_sums.Upload(sums.data());
  ReciprocalsKernel<<<static_cast<unsigned>((T + 255) / 256), 256>>>(d_sums.get(), d_reciprocals.get(), T);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  d_reciprocals.Download(reciprocals.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      volatile float part = scores[t * N + chosen[t * k + j]] * reciprocals[t];
      volatile float w = part * scaling;
      weights[t * k + j] = std::isnan(w) ? FromBits(hisparse::kMoeRouteNanBits) : w;
    }
  }
}

bool RunCase(const Case& c, uint64_t seed, bool verbose) {
  const int64_t T = c.tokens, N = c.scores, k = c.top_k, E = c.experts, P = T * k;
  Rng rng(seed);
  std::vector<float> scores(T * N);
  FillScores(c.kind, rng, scores);

  // The oracle, on this (non-XLA) thread: subnormals kept, as on the GPU.
  std::vector<int32_t> want_chosen(P), want_order(P), want_inverse(P), want_sizes(E);
  std::vector<float> want_weights(P);
  const MoeRouteDims dims{T, N, k, E, c.scaling};
  hisparse::MoeRouteCpu(dims, MoeRouteBuffers{scores.data(), want_chosen.data(), want_weights.data(),
                                              want_order.data(), want_inverse.data(), want_sizes.data()});
  GpuWeights(scores, want_chosen, T, N, k, c.scaling, want_weights);

  TightScores d_scores(scores, c.misalign);
  DeviceBuffer<int32_t> d_chosen(P), d_order(P), d_inverse(P), d_sizes(E);
  DeviceBuffer<float> d_weights(P);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  Report report;
  report.label = "[" + c.name + "]";
  std::vector<int32_t> chosen(P), order(P), inverse(P), sizes(E);
  std::vector<float> weights(P);
  std::vector<int32_t> first_chosen, first_order, first_inverse, first_sizes;
  std::vector<float> first_weights;
  const uint8_t poison[2] = {0x5A, 0xC3};
  for (int run = 0; run < 2 && !report.failed; ++run) {
    d_chosen.Poison(poison[run]);
    d_weights.Poison(poison[run]);
    d_order.Poison(poison[run]);
    d_inverse.Poison(poison[run]);
    d_sizes.Poison(poison[run]);
    CUDA_OK(cudaDeviceSynchronize());
    cudaError_t err = hisparse::LaunchMoeRoute(
        dims,
        MoeRouteBuffers{d_scores.get(), d_chosen.get(), d_weights.get(), d_order.get(), d_inverse.get(),
                        d_sizes.get()},
        stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      report.Line(Format("run %d: %s", run, cudaGetErrorString(err)));
      break;
    }
    d_chosen.Download(chosen.data());
    d_weights.Download(weights.data());
    d_order.Download(order.data());
    d_inverse.Download(inverse.data());
    d_sizes.Download(sizes.data());
    Compare(report, "chosen", want_chosen, chosen, k);
    Compare(report, "weights", want_weights, weights, k);
    Compare(report, "order", want_order, order, 0);
    Compare(report, "inverse", want_inverse, inverse, 0);
    Compare(report, "group_sizes", want_sizes, sizes, 0);
    if (run == 0) {
      first_chosen = chosen;
      first_weights = weights;
      first_order = order;
      first_inverse = inverse;
      first_sizes = sizes;
    } else if (chosen != first_chosen || order != first_order || inverse != first_inverse || sizes != first_sizes ||
               std::memcmp(weights.data(), first_weights.data(), weights.size() * sizeof(float)) != 0) {
      report.Line("two runs of the same launch differ");
    }
  }
  if (!d_chosen.GuardsIntact()) report.Line("chosen guard bytes overwritten");
  if (!d_weights.GuardsIntact()) report.Line("weights guard bytes overwritten");
  if (!d_order.GuardsIntact()) report.Line("order guard bytes overwritten");
  if (!d_inverse.GuardsIntact()) report.Line("inverse guard bytes overwritten");
  if (!d_sizes.GuardsIntact()) report.Line("group_sizes guard bytes overwritten");
  CUDA_OK(cudaStreamDestroy(stream));
  if (!report.failed && verbose) std::printf("  ok   %s\n", report.label.c_str());
  return !report.failed;
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions options = harness::StartCheck(argc, argv, /*default_seed=*/4321);
  // The launcher refuses sizes outside its limits (nothing enqueued).
  int passed = 0, failed = 0, skipped = 0;
  {
    const MoeRouteDims too_many{hisparse::kMoeRouteMaxPairs + 1, 1, 1, 1, 1.0f};
    const MoeRouteDims too_long{1, hisparse::kMoeRouteMaxScores + 1, 1, 1, 1.0f};
    const MoeRouteDims too_wide{1, 8, 1, hisparse::kMoeRouteMaxExperts + 1, 1.0f};
    bool ok = true;
    for (const MoeRouteDims& d : {too_many, too_long, too_wide})
      ok = ok && hisparse::LaunchMoeRoute(d, MoeRouteBuffers{}, nullptr) == cudaErrorInvalidValue;
    if (!options.Skips("limits")) {
      if (ok) {
        ++passed;
        if (options.verbose) std::printf("  ok   [limits]\n");
      } else {
        ++failed;
        std::printf("  FAIL [limits]: sizes past the limits were not refused\n");
      }
    }
  }
  uint64_t case_seed = options.seed;
  for (const Case& c : MoeRouteCases(options.quick)) {
    ++case_seed;
    if (options.Skips(c.name)) continue;
    if (RunCase(c, case_seed, options.verbose)) {
      ++passed;
    } else {
      ++failed;
    }
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed == 0 ? 0 : 1;
}

// MoE ROUTE on the GPU: GPU time of one LaunchMoeRoute (ffi/moe_route_kernels.cu)
// at the glm5 decode shapes: N = 256 router scores, k = 8 choices, E = 32 local
// experts (one GPU's share of 256 over 8), scaling 2.5, T in {1, 2, 9, 10, 17,
// 41, 64} tokens. The kernel replaces XLA's chain of ~8 routing kernels
// (BENCHMARKS.md); the targets: about 2 us at T <= 2, well under 3 us at T = 41.
//
// Scores are sigmoids of normals (what the router hands the op), filled on the
// host with a fixed seed. Every shape is checked first: one launch's five
// outputs must equal MoeRouteCpu's byte for byte (exit 3 otherwise), so a
// wrong kernel cannot report a time. Each call is then timed alone with CUDA
// events around the launch, queued behind a ~50 us spin kernel so the host
// has enqueued it before the GPU gets there (GPU time, not the host's launch
// latency); --reps calls (default 200) after 10 warm-up calls give min /
// median / max. "back-to-back" is the mean time per launch of --reps launches
// queued behind one 20 ms spin, one after another (what a stream of them
// costs, launch gaps included). The launch floor is an empty kernel of the
// same shape (one block of 1024 threads) timed alike: the events' and the
// launch's own cost, which "over floor" takes out of the medians.
//
// Build (repository root):
//   make -C ffi/bench moe-route
// Run (a few seconds; prints a table, writes JSON with --json):
//   build/moe_route_bench --json results/moe_route_bench.json
//   build/moe_route_bench --reps 1000 --tokens 41   # one shape only (repeat --tokens for more)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe_route.h"
#include "moe_route_cuda.h"
#include "tests/harness.h"

namespace {

constexpr int64_t kScores = 256;
constexpr int64_t kTopK = 8;
constexpr int64_t kExperts = 32;
constexpr float kScaling = 2.5f;
constexpr int kWarmup = 10;
constexpr uint64_t kSpinEachNs = 50000;
// The targets.
constexpr double kTargetUsAtMost2 = 2.0;   // T <= 2
constexpr double kTargetUsAt41 = 3.0;      // T = 41

// The launch floor's kernel: the route kernel's shape, no work.
__global__ void EmptyKernel() {}

struct Result {
  int64_t tokens = 0;
  harness::Stats alone;
  double back_to_back_us = 0;
};

// Byte-for-byte comparison of n 4-byte values; prints the first mismatch.
bool Same(const char* what, int64_t tokens, const void* want, const void* got, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w, g;
    std::memcpy(&w, static_cast<const uint8_t*>(want) + 4 * i, 4);
    std::memcpy(&g, static_cast<const uint8_t*>(got) + 4 * i, 4);
    if (w != g) {
      std::fprintf(stderr, "T = %lld: %s[%lld] is 0x%08x, MoeRouteCpu gives 0x%08x\n", (long long)tokens, what,
                   (long long)i, g, w);
      return false;
    }
  }
  return true;
}

Result Time(int64_t T, int reps, uint64_t seed, cudaStream_t stream) {
  const int64_t P = T * kTopK;
  std::vector<float> scores(T * kScores);
  std::mt19937_64 rng(seed + T);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : scores) x = 1.0f / (1.0f + std::exp(-normal(rng)));

  std::vector<int32_t> chosen(P), order(P), inverse(P), sizes(kExperts);
  std::vector<float> weights(P);
  const hisparse::MoeRouteDims dims{T, kScores, kTopK, kExperts, kScaling};
  hisparse::MoeRouteCpu(dims,
                        {scores.data(), chosen.data(), weights.data(), order.data(), inverse.data(), sizes.data()});

  float *d_scores = nullptr, *d_weights = nullptr;
  int32_t *d_chosen = nullptr, *d_order = nullptr, *d_inverse = nullptr, *d_sizes = nullptr;
  CUDA_OK(cudaMalloc(&d_scores, scores.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_weights, P * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_chosen, P * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&d_order, P * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&d_inverse, P * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&d_sizes, kExperts * sizeof(int32_t)));
  CUDA_OK(cudaMemcpy(d_scores, scores.data(), scores.size() * sizeof(float), cudaMemcpyHostToDevice));
  for (int32_t* p : {d_chosen, d_order, d_inverse}) CUDA_OK(cudaMemset(p, 0x5A, P * sizeof(int32_t)));
  CUDA_OK(cudaMemset(d_weights, 0x5A, P * sizeof(float)));
  CUDA_OK(cudaMemset(d_sizes, 0x5A, kExperts * sizeof(int32_t)));
  CUDA_OK(cudaDeviceSynchronize());
  const hisparse::MoeRouteBuffers io{d_scores, d_chosen, d_weights, d_order, d_inverse, d_sizes};

  // The check, before any timing.
  CUDA_OK(hisparse::LaunchMoeRoute(dims, io, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<int32_t> got_chosen(P), got_order(P), got_inverse(P), got_sizes(kExperts);
  std::vector<float> got_weights(P);
  CUDA_OK(cudaMemcpy(got_chosen.data(), d_chosen, P * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_weights.data(), d_weights, P * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_order.data(), d_order, P * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_inverse.data(), d_inverse, P * sizeof(int32_t), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_sizes.data(), d_sizes, kExperts * sizeof(int32_t), cudaMemcpyDeviceToHost));
  if (!Same("chosen", T, chosen.data(), got_chosen.data(), P) ||
      !Same("weights", T, weights.data(), got_weights.data(), P) ||
      !Same("order", T, order.data(), got_order.data(), P) ||
      !Same("inverse", T, inverse.data(), got_inverse.data(), P) ||
      !Same("group_sizes", T, sizes.data(), got_sizes.data(), kExperts)) {
    std::fprintf(stderr, "MoE ROUTE differs from MoeRouteCpu: no timing\n");
    std::exit(3);
  }

  Result r;
  r.tokens = T;
  const std::vector<double> us = harness::EventTimes(
      stream, reps, kWarmup, /*spin_first_ns=*/0, kSpinEachNs,
      [&](int) { CUDA_OK(hisparse::LaunchMoeRoute(dims, io, stream)); });
  r.alone = harness::Summarize(us);

  // Back to back: reps launches between two events, behind one spin.
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  harness::Spin<<<1, 1, 0, stream>>>(20'000'000);
  CUDA_OK(cudaEventRecord(start, stream));
  for (int i = 0; i < reps; ++i) CUDA_OK(hisparse::LaunchMoeRoute(dims, io, stream));
  CUDA_OK(cudaEventRecord(stop, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  r.back_to_back_us = 1000.0 * ms / reps;
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));

  for (void* p : {static_cast<void*>(d_scores), static_cast<void*>(d_weights), static_cast<void*>(d_chosen),
                  static_cast<void*>(d_order), static_cast<void*>(d_inverse), static_cast<void*>(d_sizes)})
    CUDA_OK(cudaFree(p));
  return r;
}

const Result* Find(const std::vector<Result>& results, int64_t tokens) {
  for (const Result& r : results)
    if (r.tokens == tokens) return &r;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  int reps = 200;
  uint64_t seed = 1234;
  std::vector<int64_t> tokens;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--tokens" && i + 1 < argc) {
      const long long T = std::atoll(argv[++i]);
      if (T < 1 || T * kTopK > hisparse::kMoeRouteMaxPairs) {
        std::fprintf(stderr, "--tokens takes 1 to %lld, got %s\n", (long long)(hisparse::kMoeRouteMaxPairs / kTopK),
                     argv[i]);
        return 2;
      }
      tokens.push_back(T);
    } else {
      std::fprintf(stderr, "usage: %s [--json OUT.json] [--reps N] [--seed N] [--tokens T]...\n", argv[0]);
      return 2;
    }
  }
  if (tokens.empty()) tokens = {1, 2, 9, 10, 17, 41, 64};

  const harness::DeviceInfo device = harness::QueryDevice();
  std::printf("device %d: %s\n", device.device, harness::DeviceLine(device).c_str());
  std::printf("MoE ROUTE N = %lld, k = %lld, E = %lld, scaling %.1f; %d reps after %d warm-up calls; GPU time per "
              "call (CUDA events)\n\n",
              (long long)kScores, (long long)kTopK, (long long)kExperts, kScaling, reps, kWarmup);

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const harness::Stats launch_floor = harness::Summarize(
      harness::EventTimes(stream, reps, kWarmup, /*spin_first_ns=*/0, kSpinEachNs, [&](int) {
        EmptyKernel<<<1, 1024, 0, stream>>>();
        CUDA_OK(cudaGetLastError());
      }));
  std::printf("launch floor (empty kernel, 1 x 1024 threads): %.2f / %.2f / %.2f us\n\n", launch_floor.min_us,
              launch_floor.median_us, launch_floor.max_us);
  std::printf("| T | pairs | min us | median us | max us | median over floor us | back-to-back us |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<Result> results;
  for (int64_t T : tokens) {
    results.push_back(Time(T, reps, seed, stream));
    const Result& r = results.back();
    std::printf("| %lld | %lld | %.2f | %.2f | %.2f | %.2f | %.2f |\n", (long long)T, (long long)(T * kTopK),
                r.alone.min_us, r.alone.median_us, r.alone.max_us, r.alone.median_us - launch_floor.median_us,
                r.back_to_back_us);
    std::fflush(stdout);
  }
  CUDA_OK(cudaStreamDestroy(stream));

  std::printf("\ntargets (median):\n");
  for (int64_t T : {1, 2}) {
    if (const Result* r = Find(results, T))
      std::printf("  T = %lld: %.2f us, target about %.1f: %s\n", (long long)T, r->alone.median_us, kTargetUsAtMost2,
                  r->alone.median_us <= kTargetUsAtMost2 ? "met" : "MISSED");
  }
  if (const Result* r = Find(results, 41))
    std::printf("  T = 41: %.2f us, target < %.1f: %s\n", r->alone.median_us, kTargetUsAt41,
                r->alone.median_us < kTargetUsAt41 ? "met" : "MISSED");

  if (json_path != nullptr) {
    FILE* f = harness::OpenJson(json_path);
    std::fprintf(f,
                 "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"cuda_runtime\": %d,\n  \"driver\": %d,\n"
                 "  \"scores\": %lld,\n  \"top_k\": %lld,\n  \"experts\": %lld,\n  \"scaling\": %.1f,\n"
                 "  \"reps\": %d,\n  \"targets\": {\"us_at_most_2_tokens\": %.1f, \"us_at_41_tokens\": %.1f},\n"
                 "  \"launch_floor_us\": {\"min\": %.3f, \"median\": %.3f, \"max\": %.3f},\n"
                 "  \"results\": [\n",
                 device.prop.name, device.prop.multiProcessorCount, device.runtime, device.driver, (long long)kScores,
                 (long long)kTopK, (long long)kExperts, kScaling, reps, kTargetUsAtMost2, kTargetUsAt41,
                 launch_floor.min_us, launch_floor.median_us, launch_floor.max_us);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"tokens\": %lld, \"pairs\": %lld, \"us_min\": %.3f, \"us_median\": %.3f, \"us_max\": %.3f, "
                   "\"us_median_over_floor\": %.3f, \"us_back_to_back\": %.3f}%s\n",
                   (long long)r.tokens, (long long)(r.tokens * kTopK), r.alone.min_us, r.alone.median_us,
                   r.alone.max_us, r.alone.median_us - launch_floor.median_us, r.back_to_back_us,
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", json_path);
  }
  return 0;
}

// TOP-K on the GPU: GPU time of one LaunchTopk (ffi/topk_kernels.cu) per
// configuration, against the targets of issue 11: <= 3 us per row at 80 rows
// and <= 20 us in all for 2 rows (R = 131072, k = 2048), and of issue 22: <= 20
// us in all for 17 rows, on every kind of scores (the tie-heavy ones too).
//
// Configurations: k = 2048; R in {32768, 131072, 262144}; rows in
// {1, 2, 8, 10, 80, 160}; every row fully sealed. Scores are generated on the
// device: "normal" (a sum of four uniforms, bell-shaped like indexer scores:
// the sample of the resident kernel finds the k-th key's top-digit bucket;
// the streaming kernel's early exit comes after the first digit), and at
// R = 131072 also "uniform" (one exponent: all ids in 4 top-digit buckets;
// the streaming early exit comes a digit later) and "quantized" (7 distinct
// values: 18K ids tie at the top; the streaming kernel re-reads the scores at
// every digit); and two like the indexer's scores (ReLU'd sums of fp8 products,
// hisparse_index_scores with fp8 keys), "indexer" (relu(k0 k1 + k2) of
// e4m3-rounded normals: half the ids 0, T positive with a few dozen ties) and
// "zeros" (relu(k0 + k1 - 3.25) / 2: 99% zeros, so T = +0.0 with ~130K ties and
// the first ~750 zeros by id selected). The automatic plan runs every configuration; without a
// forced kernel the two target shapes also run on the streaming kernel, the
// baseline. Each call is timed with CUDA events around the launch only, queued
// behind a ~50 us spin kernel so the host has enqueued it before the GPU gets
// there (GPU time, not the host's launch latency); --reps calls (default 200)
// after 10 warm-up calls give min / median / max.
//
// Build (repository root):
//   make -C ffi/bench topk
// Run (well under a minute on an H200; prints a table, writes JSON):
//   build/topk_bench results/topk_bench.json
//   build/topk_bench results/topk_quick.json --quick      # R = 131072, rows 2 and 80 only
//   build/topk_bench results/topk_17.json --shape 17x131072 --shape 41x32768:1  # only these
//     (ROWSxR[:KIND], KIND 0 normal, 1 uniform, 2 quantized, 3 indexer, 4 zeros)
//   build/topk_bench results/topk_streaming.json --kernel streaming   # force a kernel (its own plan)
//   build/topk_bench results/topk_r8.json --kernel resident --cluster 8  # and blocks per row
// (resident: 1, 2, 4, 8, 16; streaming: 1, 2, 4, 8; a forced resident plan that does not fit a shape
// skips it.) Where a resident launch's time goes, from its blocks' phase stamps (a diagnosis build,
// never shipped; after each timed shape it prints the launch floor, an empty kernel of the same
// launch shape timed as the calls are, then two traced launches):
//   make -C ffi/bench topk EXTRA=-DHISPARSE_TOPK_TRACE OUT=$PWD/build/topk-trace
//   build/topk-trace/topk_bench results/topk_trace.json --shape 17x131072 --reps 50
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "topk.h"
#include "topk_cuda.h"
#include "tests/harness.h"

namespace {

constexpr int64_t kTopK = 2048;
constexpr int kWarmup = 10;
// The targets (issue 11).
constexpr int64_t kTargetRecords = 131072;
constexpr double kTargetUsPerRowAt80 = 3.0;
constexpr double kTargetUsAt2 = 20.0;
constexpr double kTargetUsAt17 = 20.0;  // issue 22: HiSparse's capacity batch at 128K, any scores

__device__ uint64_t SplitMix(uint64_t z) {
  z = (z + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A float rounded to float8_e4m3fn (what an fp8 key holds) and back.
__device__ float E4m3(float x) { return static_cast<float>(__nv_fp8_e4m3(x)); }

// Two standard normals from 32 random bits (Box-Muller on two 16-bit uniforms).
__device__ float2 Normals(uint32_t r) {
  const float u0 = ((r & 0xffff) + 0.5f) / 65536.0f, u1 = ((r >> 16) + 0.5f) / 65536.0f;
  const float radius = sqrtf(-2.0f * logf(u0));
  float s, c;
  sincosf(6.2831853f * u1, &s, &c);
  return make_float2(radius * c, radius * s);
}

// kind 0: normal-like (sum of 4 uniforms), 1: uniform [1, 2), 2: 7 distinct values,
// 3: indexer (ReLU'd fp8 products, half zeros), 4: zeros (ReLU'd fp8 sums, 99% zeros).
__global__ void FillScores(float* scores, int64_t n, int kind, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = SplitMix(seed ^ (i * 0xd1b54a32d192ed03ull));
    const float u0 = (r & 0xffff) / 65536.0f, u1 = ((r >> 16) & 0xffff) / 65536.0f;
    const float u2 = ((r >> 32) & 0xffff) / 65536.0f, u3 = (r >> 48) / 65536.0f;
    float x;
    if (kind == 0) {
      x = (u0 + u1 + u2 + u3 - 2.0f) * 1.7320508f;
    } else if (kind == 1) {
      x = 1.0f + u0 + u1 / 65536.0f;
    } else if (kind == 2) {
      x = 0.5f * static_cast<float>(static_cast<int>(r % 7) - 3);
    } else {
      const float2 a = Normals(static_cast<uint32_t>(r)), b = Normals(static_cast<uint32_t>(r >> 32));
      x = kind == 3 ? fmaxf(E4m3(a.x) * E4m3(a.y) + E4m3(b.x), 0.0f)
                    : 0.5f * fmaxf(E4m3(a.x) + E4m3(a.y) - 3.25f, 0.0f);
    }
    scores[i] = x;
  }
}

const char* kKindNames[] = {"normal", "uniform", "quantized", "indexer", "zeros"};
constexpr int kKinds = 5;

struct Config {
  int64_t rows, records;
  int kind;
  hisparse::TopkLaunchOptions options;
};

const char* KernelName(hisparse::TopkKernelKind kernel) {
  switch (kernel) {
    case hisparse::TopkKernelKind::kAuto: return "auto";
    case hisparse::TopkKernelKind::kStreaming: return "streaming";
    case hisparse::TopkKernelKind::kResident: return "resident";
  }
  return "?";
}

struct Result {
  Config config;
  hisparse::TopkLaunchPlan plan;
  double us_min = NAN, us_median = NAN, us_max = NAN;
  double PerRow() const { return us_median / config.rows; }
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - lo) * (v[hi] - v[lo]);
}

#ifdef HISPARSE_TOPK_TRACE
// The trace build (-DHISPARSE_TOPK_TRACE, diagnosis only): where one launch's time goes, from
// thread 0 of every block of the resident kernel (topk_resident_kernels.cuh, TopkStamp): per
// phase, us after the first block's entry (min / median / max over blocks), the launch warm as the
// timed ones (scores in L2 from the calls before).
void PrintTrace(const Config& c, const Result& r, const hisparse::TopkDims& dims, const hisparse::TopkBuffers& io,
                uint32_t* workspace, cudaStream_t stream) {
  constexpr int kSlots = hisparse::kTopkTraceSlots;
  const int blocks = static_cast<int>(std::min<int64_t>(c.rows * r.plan.cluster, 1024));
  static const char* names[kSlots] = {"entry",
                                      "sample loaded, cleared",
                                      "sample histogram",
                                      "sample estimated",
                                      "own copies landed",
                                      "slice counted",
                                      "counts exchanged",
                                      "candidates gathered",
                                      "exchange: cluster synced",
                                      "exchange: merged",
                                      "exchange: digits done",
                                      "T known",
                                      "lower blocks' counts",
                                      "output written",
                                      "",
                                      ""};
  // The launch floor first: the same launch shape doing nothing, timed as the calls were; then
  // the same grid without the clusters, without the dynamic shared memory, and without both.
  const struct {
    hisparse::TopkFloorShape shape;
    const char* what;
  } floors[] = {{hisparse::TopkFloorShape::kPlanned, "an empty kernel of the same launch shape"},
                {hisparse::TopkFloorShape::kNoClusters, "the same, no clusters"},
                {hisparse::TopkFloorShape::kNoSharedMemory, "the same, no dynamic shared memory"},
                {hisparse::TopkFloorShape::kNeither, "the same, neither"}};
  for (const auto& f : floors) {
    const std::vector<double> floor_us =
        harness::EventTimes(stream, 50, kWarmup, /*spin_first_ns=*/0, /*spin_each_ns=*/50000, [&](int) {
          CUDA_OK(hisparse::LaunchTopkEmptyResident(dims, stream, c.options, f.shape));
        });
    std::printf("launch floor %s %lldx%lld (%s): %.2f / %.2f / %.2f us\n", kKindNames[c.kind], (long long)c.rows,
                (long long)c.records, f.what, Percentile(floor_us, 0.0), Percentile(floor_us, 0.5),
                Percentile(floor_us, 1.0));
  }
  for (int rep = 0; rep < 2; ++rep) {
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(hisparse::TopkClearTrace());
    auto t = harness::EventTimes(stream, 1, 0, 0, 0, [&](int) {
      CUDA_OK(hisparse::LaunchTopk(dims, io, workspace, stream, c.options));
    });
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned long long> ns(static_cast<size_t>(blocks) * kSlots);
    CUDA_OK(hisparse::TopkReadTrace(ns.data(), blocks));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < blocks; ++b)
      if (ns[b * kSlots]) t0 = std::min(t0, ns[b * kSlots]);
    std::printf("trace %s %lldx%lld, %d blocks a row, event %.2f us; us after the first block's entry: min / median / max\n",
                kKindNames[c.kind], (long long)c.rows, (long long)c.records, r.plan.cluster, t[0]);
    for (int slot = 0; slot < kSlots; ++slot) {
      std::vector<double> us;
      for (int b = 0; b < blocks; ++b)
        if (ns[b * kSlots] && ns[b * kSlots + slot]) us.push_back((ns[b * kSlots + slot] - t0) * 1e-3);
      if (us.empty()) continue;
      std::sort(us.begin(), us.end());
      std::printf("  %-24s %8.2f %8.2f %8.2f  (%zu blocks)\n", names[slot], us.front(), us[us.size() / 2], us.back(),
                  us.size());
    }
  }
}
#endif

Result Time(const Config& c, int reps, float* scores, int32_t* sealed, int32_t* selected,
            uint32_t* workspace, cudaStream_t stream) {
  const hisparse::TopkDims dims{c.rows, c.records, kTopK};
  const hisparse::TopkLaunchOptions& options = c.options;
  Result r;
  r.config = c;
  r.plan = hisparse::TopkPlan(dims, options);
  if (r.plan.cluster == 0) return r;  // a forced plan that does not fit this shape
  FillScores<<<1024, 256, 0, stream>>>(scores, c.rows * c.records, c.kind, 0x5eed + c.records);
  std::vector<int32_t> full(c.rows, static_cast<int32_t>(c.records));
  CUDA_OK(cudaMemcpyAsync(sealed, full.data(), c.rows * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const hisparse::TopkBuffers io{scores, sealed, selected};
  const std::vector<double> us =
      harness::EventTimes(stream, reps, kWarmup, /*spin_first_ns=*/0, /*spin_each_ns=*/50000, [&](int) {
        CUDA_OK(hisparse::LaunchTopk(dims, io, workspace, stream, options));
      });
  // A plain sanity check of the last call: ids ascending in [0, R), no padding (rows are full).
  std::vector<int32_t> ids(c.rows * kTopK);
  CUDA_OK(cudaMemcpy(ids.data(), selected, ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (int64_t s = 0; s < c.rows; ++s) {
    for (int64_t j = 0; j < kTopK; ++j) {
      const int32_t id = ids[s * kTopK + j];
      if (id < 0 || id >= c.records || (j > 0 && id <= ids[s * kTopK + j - 1])) {
        std::fprintf(stderr, "rows %lld R %lld: row %lld position %lld holds %d\n", (long long)c.rows,
                     (long long)c.records, (long long)s, (long long)j, id);
        std::exit(3);
      }
    }
  }
  r.us_min = Percentile(us, 0.0);
  r.us_median = Percentile(us, 0.5);
  r.us_max = Percentile(us, 1.0);
#ifdef HISPARSE_TOPK_TRACE
  if (r.plan.kernel == hisparse::TopkKernelKind::kResident) PrintTrace(c, r, dims, io, workspace, stream);
#endif
  return r;
}

// The first result of a shape (the automatic or forced plan; baselines come last).
const Result* Find(const std::vector<Result>& results, int64_t rows, int64_t records, int kind) {
  for (const Result& r : results)
    if (r.config.rows == rows && r.config.records == records && r.config.kind == kind) return &r;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr,
                 "usage: %s OUT.json [--quick] [--shape ROWSxR[:KIND]]... [--reps N] "
                 "[--kernel streaming|resident] [--cluster C]\n",
                 argv[0]);
    return 2;
  }
  const char* json_path = argv[1];
  bool quick = false;
  int reps = 200;
  hisparse::TopkLaunchOptions options;
  std::vector<Config> shapes;  // --shape ROWSxR[:KIND]: only these configurations
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shape" && i + 1 < argc) {
      long long rows = 0, records = 0;
      int kind = 0;
      if (std::sscanf(argv[++i], "%lldx%lld:%d", &rows, &records, &kind) < 2 || rows < 1 ||
          records < kTopK || kind < 0 || kind >= kKinds) {
        std::fprintf(stderr, "--shape takes ROWSxR[:KIND] (R >= %lld, KIND 0..4), got %s\n",
                     (long long)kTopK, argv[i]);
        return 2;
      }
      shapes.push_back({rows, records, kind, {}});
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--cluster" && i + 1 < argc) {
      options.cluster = std::atoi(argv[++i]);
    } else if (arg == "--kernel" && i + 1 < argc) {
      const std::string kernel = argv[++i];
      if (kernel != "streaming" && kernel != "resident") {
        std::fprintf(stderr, "--kernel takes streaming or resident, got %s\n", kernel.c_str());
        return 2;
      }
      options.kernel = kernel == "streaming" ? hisparse::TopkKernelKind::kStreaming
                                             : hisparse::TopkKernelKind::kResident;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }

  if (options.cluster != 0 && options.kernel == hisparse::TopkKernelKind::kAuto) {
    std::fprintf(stderr, "--cluster needs --kernel\n");
    return 2;
  }
  std::vector<Config> configs;
  const std::vector<int64_t> all_rows = {1, 2, 8, 10, 80, 160};
  if (!shapes.empty()) {
    for (Config c : shapes) {
      c.options = options;
      configs.push_back(c);
    }
  } else if (quick) {
    for (int64_t rows : {2, 80}) configs.push_back({rows, kTargetRecords, 0, options});
  } else {
    for (int64_t records : {32768, 131072, 262144})
      for (int64_t rows : all_rows) configs.push_back({rows, records, 0, options});
    for (int kind : {1, 2})
      for (int64_t rows : {2, 80}) configs.push_back({rows, kTargetRecords, kind, options});
  }
  if (shapes.empty() && options.kernel == hisparse::TopkKernelKind::kAuto) {
    hisparse::TopkLaunchOptions baseline;
    baseline.kernel = hisparse::TopkKernelKind::kStreaming;
    for (int64_t rows : {2, 80}) configs.push_back({rows, kTargetRecords, 0, baseline});
  }
  int64_t max_elements = 0, max_rows = 0, max_words = 0;
  for (const Config& c : configs) {
    max_elements = std::max(max_elements, c.rows * c.records);
    max_rows = std::max(max_rows, c.rows);
    max_words = std::max(max_words, c.rows * hisparse::TopkWorkspaceWords(c.records));
  }

  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0, driver = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  CUDA_OK(cudaDriverGetVersion(&driver));
  std::printf("device %d: %s (sm_%d%d, %d SMs), CUDA runtime %d, driver %d\n", device, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, runtime, driver);
  const std::string forced =
      options.kernel == hisparse::TopkKernelKind::kAuto
          ? ""
          : std::string(" with the ") + KernelName(options.kernel) + " kernel forced" +
                (options.cluster ? ", " + std::to_string(options.cluster) + " blocks per row" : "");
  std::printf("TOP-K k = %lld, rows fully sealed, %d reps after %d warm-up calls; GPU time per call "
              "(CUDA events)%s\n\n",
              (long long)kTopK, reps, kWarmup, forced.c_str());

  float* scores = nullptr;
  int32_t *sealed = nullptr, *selected = nullptr;
  uint32_t* workspace = nullptr;
  CUDA_OK(cudaMalloc(&scores, max_elements * sizeof(float)));
  CUDA_OK(cudaMalloc(&sealed, max_rows * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&selected, max_rows * kTopK * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(&workspace, max_words * sizeof(uint32_t)));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("| scores | R | rows | kernel | blocks/row | min us | median us | max us | median us/row |\n");
  std::printf("|---|---:|---:|---|---:|---:|---:|---:|---:|\n");
  std::vector<Result> results;
  for (const Config& c : configs) {
    results.push_back(Time(c, reps, scores, sealed, selected, workspace, stream));
    const Result& r = results.back();
    if (r.plan.cluster == 0) {
      std::printf("| %s | %lld | %lld | %s | - | skipped: the forced plan does not fit |\n",
                  kKindNames[c.kind], (long long)c.records, (long long)c.rows, KernelName(c.options.kernel));
      continue;
    }
    std::printf("| %s | %lld | %lld | %s | %d | %.2f | %.2f | %.2f | %.3f |\n", kKindNames[c.kind],
                (long long)c.records, (long long)c.rows, KernelName(r.plan.kernel), r.plan.cluster,
                r.us_min, r.us_median, r.us_max, r.PerRow());
    std::fflush(stdout);
  }

  const Result* at80 = Find(results, 80, kTargetRecords, 0);
  const Result* at2 = Find(results, 2, kTargetRecords, 0);

  std::printf("\ntargets (R = %lld, k = %lld, normal scores):\n", (long long)kTargetRecords,
              (long long)kTopK);
  if (at80)
    std::printf("  80 rows: %.3f us per row (median), target <= %.1f: %s\n", at80->PerRow(),
                kTargetUsPerRowAt80, at80->PerRow() <= kTargetUsPerRowAt80 ? "met" : "MISSED");
  if (at2)
    std::printf("  2 rows: %.2f us in all (median), target <= %.1f: %s\n", at2->us_median,
                kTargetUsAt2, at2->us_median <= kTargetUsAt2 ? "met" : "MISSED");
  for (int kind = 0; kind < kKinds; ++kind) {
    const Result* at17 = Find(results, 17, kTargetRecords, kind);
    if (at17 && at17->plan.cluster != 0)
      std::printf("  17 rows, %s scores: %.2f us in all (median), target <= %.1f: %s\n", kKindNames[kind],
                  at17->us_median, kTargetUsAt17, at17->us_median <= kTargetUsAt17 ? "met" : "MISSED");
  }

  FILE* f = harness::OpenJson(json_path);
  std::fprintf(f,
               "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"cuda_runtime\": %d,\n  \"driver\": %d,\n"
               "  \"top_k\": %lld,\n  \"reps\": %d,\n  \"forced_kernel\": \"%s\",\n  \"forced_cluster\": %d,\n"
               "  \"targets\": {\"records\": %lld, \"us_per_row_at_80_rows\": %.1f, \"us_at_2_rows\": %.1f,\n"
               "              \"measured_us_per_row_at_80_rows\": %.4f, \"measured_us_at_2_rows\": %.3f},\n"
               "  \"results\": [\n",
               prop.name, prop.multiProcessorCount, runtime, driver, (long long)kTopK, reps,
               KernelName(options.kernel), options.cluster, (long long)kTargetRecords, kTargetUsPerRowAt80, kTargetUsAt2,
               at80 ? at80->PerRow() : -1.0, at2 ? at2->us_median : -1.0);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "    {\"scores\": \"%s\", \"records\": %lld, \"rows\": %lld, \"requested\": \"%s\", "
                 "\"kernel\": \"%s\", \"blocks_per_row\": %d, \"us_min\": %.3f, \"us_median\": %.3f, "
                 "\"us_max\": %.3f, \"us_per_row_median\": %.4f}%s\n",
                 kKindNames[r.config.kind], (long long)r.config.records, (long long)r.config.rows,
                 KernelName(r.config.options.kernel), KernelName(r.plan.kernel), r.plan.cluster,
                 r.plan.cluster ? r.us_min : -1.0, r.plan.cluster ? r.us_median : -1.0,
                 r.plan.cluster ? r.us_max : -1.0, r.plan.cluster ? r.PerRow() : -1.0,
                 i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("wrote %s\n", json_path);
  CUDA_OK(cudaFree(scores));
  CUDA_OK(cudaFree(sealed));
  CUDA_OK(cudaFree(selected));
  CUDA_OK(cudaFree(workspace));
  return 0;
}

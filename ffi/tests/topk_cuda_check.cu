// Bit-exactness check of the CUDA TOP-K against the CPU implementation
// (topk_cpu.cc): no XLA, no Python. Every case (rows x R x k, a score
// distribution, a pattern of sealed lengths) runs under every launch variant:
// the automatic plan; the streaming kernel with clusters of 1, 2, 4 and 8
// blocks per row forced, each with the default candidate capacity, with none
// (every level reads the scores again, then the final pass marks the
// bitmaps) and with a small one (the early exit at a later level, or not at
// all); the resident kernel with clusters of 1 to 8 and 16 forced, each
// with the default capacity, with none (every pass visits the whole slice)
// and with a small one (blocks of one row mixing both). Resident variants
// whose slice exceeds kTopkResidentMaxSlice, or whose cluster size the
// device cannot schedule, are skipped and counted. The selected ids are
// compared byte for byte; the workspace starts as garbage (the kernels need
// no initialization), outputs are poisoned so unwritten entries show up,
// guard bytes around every buffer catch writes out of bounds, and the
// automatic plan runs twice to check it is deterministic.
//
// Build (from the repository root; `make -C ffi/tests topk` does the same):
//   mkdir -p build/tests
//   nvcc -O2 -arch=sm_90 -std=c++17 -lineinfo -I ffi ffi/tests/topk_cuda_check.cu ffi/topk_kernels.cu ffi/topk_cpu.cc -o build/tests/topk_cuda_check
// Run:
//   build/tests/topk_cuda_check              # every case
//   build/tests/topk_cuda_check --quick      # small case set, for compute-sanitizer
//   build/tests/topk_cuda_check --only 131072  # cases whose name contains "131072"
//   build/tests/topk_cuda_check --seed 7     # other random inputs
//   build/tests/topk_cuda_check --quiet      # print failures and the summary only
//   build/tests/topk_cuda_check --race       # 5 cases x 14 launch variants that reach every path (racecheck)
//   build/tests/topk_cuda_check --shard 2/8  # every 8th (case, variant) run from the third (seeds as in a whole run)
//   compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/topk_cuda_check --quick --quiet
//   compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 build/tests/topk_cuda_check --race --quiet
// Last line: "N passed, M failed, K skipped"; the exit status is non-zero on failure.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "topk.h"
#include "topk_cuda.h"
#include "harness.h"

namespace {

using harness::Format;

using hisparse::TopkBuffers;
using hisparse::TopkDims;
using hisparse::TopkKernelKind;
using hisparse::TopkLaunchOptions;
using hisparse::TopkLaunchPlan;

using harness::DeviceBuffer;
using harness::Rng;
using harness::Uniform;
using harness::Unit;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// ---------------------------------------------------------------------------
// Inputs.

enum class Kind {
  kNormal,          // indexer-like: the bucket of the k-th key is small (early exit at level 1)
  kUniform12,       // one exponent: the top digit is shared, the early exit comes at level 2
  kQuantized,       // 7 distinct values: huge buckets, every level reads the scores
  kEqual,           // one value: ties decide everything
  kSpecial,         // normals mixed with +-0, +-inf, NaNs of both signs and several payloads
  kRawBits,         // uniform random bit patterns
  kAscending,       // score = id: the selection is the highest sealed ids
  kMostlyMinusInf,  // -inf with a few finite scores and -NaNs: sealed vs unsealed ties at -inf
  kPeriodicLow,      // normals, but ids 0..3 of every R / 1024 far below (far above): where R is
  kPeriodicHigh,     // a multiple of 4096 exactly the ids the resident kernel samples, so its
                     // estimate of the k-th key's bucket is far too low (high)
  kIndexer,          // relu(k0 k1 + k2) of fp8-rounded normals: half zeros, T positive, ties
  kZeros,            // relu(k0 + k1 - 3.25) of fp8-rounded normals: ~99% zeros, T = +0.0
};

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNormal: return "normal";
    case Kind::kUniform12: return "uniform_1_2";
    case Kind::kQuantized: return "quantized";
    case Kind::kEqual: return "equal";
    case Kind::kSpecial: return "special";
    case Kind::kRawBits: return "raw_bits";
    case Kind::kAscending: return "ascending";
    case Kind::kMostlyMinusInf: return "mostly_minus_inf";
    case Kind::kPeriodicLow: return "periodic_low";
    case Kind::kPeriodicHigh: return "periodic_high";
    case Kind::kIndexer: return "indexer";
    case Kind::kZeros: return "zeros";
  }
  return "?";
}

const float kSpecials[] = {
    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
    FromBits(0x7fc00000u), FromBits(0xffc00000u), FromBits(0x7fc00001u), FromBits(0xffc00001u),
    FromBits(0x7f800001u), FromBits(0xff800001u), FromBits(0x00000001u), FromBits(0x80000001u),
    std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1.0f, -1.0f,
};

// A float rounded to float8_e4m3fn (an fp8 key's value) and back.
float E4m3(float x) { return static_cast<float>(__nv_fp8_e4m3(x)); }

void FillScores(Kind kind, Rng& rng, std::vector<float>& scores, int64_t R) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float equal_value = kSpecials[Uniform(rng, 0, 3)];  // +-inf, +-0
  for (size_t i = 0; i < scores.size(); ++i) {
    float& x = scores[i];
    switch (kind) {
      case Kind::kNormal: x = normal(rng); break;
      case Kind::kUniform12: x = 1.0f + static_cast<float>(Unit(rng)); break;
      case Kind::kQuantized: x = 0.5f * static_cast<float>(Uniform(rng, -3, 3)); break;
      case Kind::kEqual: x = equal_value; break;
      case Kind::kSpecial:
        x = Unit(rng) < 0.4 ? kSpecials[Uniform(rng, 0, std::size(kSpecials) - 1)] : normal(rng);
        break;
      case Kind::kRawBits: x = FromBits(static_cast<uint32_t>(rng())); break;
      case Kind::kAscending: x = static_cast<float>(i % R); break;
      case Kind::kMostlyMinusInf: {
        const double u = Unit(rng);
        x = u < 0.9 ? -std::numeric_limits<float>::infinity()
                    : (u < 0.95 ? FromBits(0xffc00000u) : normal(rng));
        break;
      }
      case Kind::kPeriodicLow:
      case Kind::kPeriodicHigh: {
        const int64_t period = std::max<int64_t>(4, R / 1024);
        const float away = kind == Kind::kPeriodicLow ? -100.0f : 100.0f;
        x = static_cast<int64_t>(i % R) % period < 4 ? away + normal(rng) : normal(rng);
        break;
      }
      case Kind::kIndexer: {
        const float k0 = E4m3(normal(rng)), k1 = E4m3(normal(rng)), k2 = E4m3(normal(rng));
        x = std::max(k0 * k1 + k2, 0.0f);
        break;
      }
      case Kind::kZeros: {
        const float k0 = E4m3(normal(rng)), k1 = E4m3(normal(rng));
        x = 0.5f * std::max(k0 + k1 - 3.25f, 0.0f);
        break;
      }
    }
  }
}

enum class Sealed { kAll, kRagged };

void FillSealed(Sealed pattern, Rng& rng, std::vector<int32_t>& sealed, int64_t R, int64_t k) {
  for (int32_t& n : sealed) {
    if (pattern == Sealed::kAll) {
      n = static_cast<int32_t>(R);
      continue;
    }
    const int64_t options[] = {0,     1,     k - 1,          k,         k + 1,    R - 1, R,
                               -5,    R + 7, INT32_MAX,      INT32_MIN, R / 2,    Uniform(rng, 0, R)};
    n = static_cast<int32_t>(std::clamp<int64_t>(options[Uniform(rng, 0, std::size(options) - 1)],
                                                 INT32_MIN, INT32_MAX));
  }
}

// ---------------------------------------------------------------------------
// Cases and variants.

struct Case {
  std::string name;
  int64_t rows, records, top_k;
  Kind kind;
  Sealed sealed;
  size_t misalign = 0;  // bytes added to the scores' base address (4: scalar loads)
};

std::vector<Case> TopkCases(bool quick, bool race) {
  std::vector<Case> cases;
  auto add = [&](int64_t rows, int64_t R, int64_t k, Kind kind, Sealed sealed, size_t misalign = 0) {
    cases.push_back({Format("rows%lld_R%lld_k%lld_%s%s%s", (long long)rows, (long long)R,
                            (long long)k, KindName(kind), sealed == Sealed::kAll ? "" : "_ragged",
                            misalign ? "_misaligned" : ""),
                     rows, R, k, kind, sealed, misalign});
  };
  const Kind all_kinds[] = {Kind::kNormal,  Kind::kUniform12, Kind::kQuantized,      Kind::kEqual,
                            Kind::kSpecial, Kind::kRawBits,   Kind::kAscending,      Kind::kMostlyMinusInf,
                            Kind::kPeriodicLow, Kind::kIndexer, Kind::kZeros};
  if (race) {
    // racecheck shadows every shared-memory word of every block (221 KB each
    // for the resident kernel): a launch takes seconds under it, and the quick
    // set's 600 launches ran past 270 s. These five are chosen to reach every path: the
    // candidates noted while counting and merged in one block (normal, k =
    // 600), one key in T's bucket (zeros, equal: the single path), more ids at
    // or above T's bucket than a warp notes, so the second pass gathers them,
    // and more candidates than one block merges (k = 10000), scalar copies of
    // misaligned rows (quantized).
    add(2, 6000, 600, Kind::kNormal, Sealed::kRagged);
    add(2, 6000, 600, Kind::kZeros, Sealed::kAll);
    add(3, 1001, 40, Kind::kEqual, Sealed::kRagged);
    add(1, 20000, 10000, Kind::kNormal, Sealed::kAll);
    add(2, 6000, 600, Kind::kQuantized, Sealed::kAll, 4);
    return cases;
  }
  if (quick) {
    // For memcheck (racecheck takes --race: minutes for this set):
    // R = 6000 still gives every block of a 16-block row a slice, and k = 600
    // overflows the capacity-64 variants' candidate lists.
    for (Kind kind : all_kinds) add(3, 1001, 40, kind, Sealed::kRagged);
    add(2, 6000, 600, Kind::kZeros, Sealed::kAll);
    add(2, 5, 5, Kind::kSpecial, Sealed::kRagged);
    add(2, 6000, 600, Kind::kNormal, Sealed::kRagged);
    add(2, 6000, 600, Kind::kQuantized, Sealed::kAll, 4);
    return cases;
  }
  // Small and odd shapes: R below a tile, not a multiple of 4 or 128, k = 1 and k = R.
  for (int64_t R : {1, 2, 5, 31, 100, 128, 129, 1000, 1001, 4097}) {
    std::vector<int64_t> ks = {1, std::min<int64_t>(7, R), R};
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (int64_t k : ks) add(3, R, k, all_kinds[(R + k) % std::size(all_kinds)], Sealed::kRagged);
  }
  for (Kind kind : all_kinds) {
    add(4, 16384, 16384, kind, Sealed::kRagged);  // k = R
    add(3, 20000, 1, kind, Sealed::kRagged);
    add(5, 50000, 2048, kind, Sealed::kRagged);   // uneven slices
  }
  // The realistic shapes: R = 32K, 128K, 256K, k = 2048, every launch path's row counts.
  for (int64_t R : {32768, 131072, 262144}) {
    for (int64_t rows : {1, 2, 8, 10, 80, 160}) add(rows, R, 2048, Kind::kNormal, Sealed::kAll);
    for (Kind kind : all_kinds) {
      add(2, R, 2048, kind, Sealed::kRagged);
      add(80, R, 2048, kind, Sealed::kRagged);
    }
  }
  // The decode step's batch (17 rows of 131K: 6 blocks per row) and 41 rows of
  // 32K, on every kind of scores; the tie-heavy ones fully sealed too.
  for (Kind kind : all_kinds) {
    add(17, 131072, 2048, kind, Sealed::kRagged);
    add(41, 32768, 2048, kind, Sealed::kRagged);
  }
  for (Kind kind : {Kind::kQuantized, Kind::kZeros, Kind::kIndexer, Kind::kUniform12})
    add(17, 131072, 2048, kind, Sealed::kAll);
  // The sampled ids far above the rest: fewer than k of them (the sample's
  // estimate of the k-th key's bucket far too high), then more.
  add(2, 65536, 8192, Kind::kPeriodicHigh, Sealed::kAll);
  add(3, 131072, 6000, Kind::kPeriodicHigh, Sealed::kRagged);
  add(2, 32768, 2048, Kind::kPeriodicHigh, Sealed::kAll);
  // Rows too long for the resident kernel: the automatic plan streams.
  add(2, 600000, 2048, Kind::kNormal, Sealed::kRagged);
  add(2, 131071, 2048, Kind::kNormal, Sealed::kRagged);  // R % 4 != 0: scalar loads
  add(2, 131072, 2048, Kind::kNormal, Sealed::kRagged, 4);
  add(80, 32768, 2048, Kind::kSpecial, Sealed::kRagged, 4);
  return cases;
}

struct Variant {
  std::string name;
  TopkLaunchOptions options;
};

// Every launch variant, or with `race` one of each kind at 1 and 8 (streaming)
// or 1, 6 and 16 (resident) blocks a row: racecheck's set.
std::vector<Variant> Variants(bool race) {
  std::vector<Variant> variants = {{"auto", {}}};
  const std::vector<int> streaming = race ? std::vector<int>{1, 8} : std::vector<int>{1, 2, 4, 8};
  const std::vector<int> resident =
      race ? std::vector<int>{1, 6, 16} : std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 16};
  for (int cluster : streaming) {
    variants.push_back({Format("streaming%d", cluster), {TopkKernelKind::kStreaming, cluster, -1}});
    variants.push_back(
        {Format("streaming%d_no_early_exit", cluster), {TopkKernelKind::kStreaming, cluster, 0}});
    variants.push_back(
        {Format("streaming%d_capacity64", cluster), {TopkKernelKind::kStreaming, cluster, 64}});
  }
  for (int cluster : resident) {
    variants.push_back({Format("resident%d", cluster), {TopkKernelKind::kResident, cluster, -1}});
    variants.push_back(
        {Format("resident%d_no_candidates", cluster), {TopkKernelKind::kResident, cluster, 0}});
    variants.push_back(
        {Format("resident%d_capacity64", cluster), {TopkKernelKind::kResident, cluster, 64}});
  }
  return variants;
}

const char* KernelName(TopkKernelKind kernel) {
  switch (kernel) {
    case TopkKernelKind::kAuto: return "auto";
    case TopkKernelKind::kStreaming: return "streaming";
    case TopkKernelKind::kResident: return "resident";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// One case under every variant.

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

void Compare(Report& report, const std::vector<int32_t>& want, const std::vector<int32_t>& got,
             const std::vector<int32_t>& sealed, int64_t k) {
  int64_t bad = 0;
  for (size_t at = 0; at < want.size(); ++at) {
    if (want[at] == got[at]) continue;
    if (bad++ < 6) {
      const int64_t row = static_cast<int64_t>(at) / k;
      report.Line(Format("row %lld (sealed %d), position %lld: expected %d, got %d", (long long)row,
                         sealed[row], (long long)(at % k), want[at], got[at]));
    }
  }
  if (bad > 6) report.Line(Format("%lld mismatches in all", (long long)bad));
}

struct Tally {
  int passed = 0, failed = 0, skipped = 0;
};

// Runs `variants` on one case, those --shard keeps: run index run_base + v for variant v.
Tally RunCase(const Case& c, const std::vector<Variant>& variants, uint64_t seed, int64_t run_base,
              const harness::CheckOptions& options) {
  const bool verbose = options.verbose;
  const int64_t S = c.rows, R = c.records, k = c.top_k;
  Rng rng(seed);
  std::vector<float> scores(S * R);
  std::vector<int32_t> sealed(S);
  FillScores(c.kind, rng, scores, R);
  FillSealed(c.sealed, rng, sealed, R, k);

  std::vector<int32_t> want(S * k, 0x7b7b7b7b);
  const TopkDims dims{S, R, k};
  hisparse::TopkCpu(dims, TopkBuffers{scores.data(), sealed.data(), want.data()});

  DeviceBuffer<float> d_scores(S * R, c.misalign);
  DeviceBuffer<int32_t> d_sealed(S), d_selected(S * k);
  DeviceBuffer<uint32_t> d_workspace(S * hisparse::TopkWorkspaceWords(R));
  d_scores.Upload(scores.data());
  d_sealed.Upload(sealed.data());
  std::vector<uint32_t> garbage(S * hisparse::TopkWorkspaceWords(R));
  for (uint32_t& w : garbage) w = static_cast<uint32_t>(rng());

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Tally tally;
  std::vector<int32_t> got(S * k), first_run(S * k);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    if (options.SkipsIndex(run_base + static_cast<int64_t>(vi))) continue;
    Report report;
    report.label = "[" + c.name + " " + v.name + "]";
    const TopkLaunchPlan plan = hisparse::TopkPlan(dims, v.options);
    if (plan.cluster == 0 && v.options.kernel == TopkKernelKind::kResident) {
      ++tally.skipped;  // the slice does not fit, or the device cannot schedule the cluster
      continue;
    }
    if (plan.cluster == 0) report.Line("no launch plan");
    const int runs = v.options.kernel == TopkKernelKind::kAuto ? 2 : 1;  // determinism
    for (int run = 0; run < runs && !report.failed; ++run) {
      d_workspace.Upload(garbage.data());
      d_selected.Fill(0x5A);
      const char* failed_kernel = "?";
      cudaError_t err = hisparse::LaunchTopk(
          dims, TopkBuffers{d_scores.get(), d_sealed.get(), d_selected.get()}, d_workspace.get(),
          stream, v.options, &failed_kernel);
      if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
      if (err != cudaSuccess) {
        report.Line(Format("%s: %s", failed_kernel, cudaGetErrorString(err)));
        break;
      }
      d_selected.Download(got.data());
      Compare(report, want, got, sealed, k);
      if (run == 0) first_run = got;
      if (run == 1 && got != first_run) report.Line("two runs of the same launch differ");
    }
    if (!d_scores.GuardsIntact()) report.Line("scores guard bytes overwritten");
    if (!d_sealed.GuardsIntact()) report.Line("sealed guard bytes overwritten");
    if (!d_selected.GuardsIntact()) report.Line("selected guard bytes overwritten");
    if (!d_workspace.GuardsIntact()) report.Line("workspace guard bytes overwritten");
    if (report.failed) {
      ++tally.failed;
    } else {
      ++tally.passed;
      if (verbose)
        std::printf("  ok   %s (%s, %d blocks per row)\n", report.label.c_str(), KernelName(plan.kernel),
                    plan.cluster);
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
  return tally;
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions options =
      harness::StartCheck(argc, argv, /*default_seed=*/1234, harness::Shards::kSplit);

  // The automatic plans of the benchmark's shapes (k = 2048), for the record.
  for (int64_t R : {32768, 131072, 262144}) {
    std::printf("auto plan, R = %lld:", (long long)R);
    for (int64_t rows : {1, 2, 8, 10, 17, 41, 64, 80, 160}) {
      const TopkLaunchPlan plan = hisparse::TopkPlan(TopkDims{rows, R, 2048});
      std::printf(" %lld rows %s x%d;", (long long)rows, KernelName(plan.kernel), plan.cluster);
    }
    std::printf("\n");
  }

  const std::vector<Variant> variants = Variants(options.race);
  Tally all;
  uint64_t case_seed = options.seed;
  int64_t case_index = -1;
  for (const Case& c : TopkCases(options.quick, options.race)) {
    ++case_seed;
    ++case_index;
    if (options.Skips(c.name)) continue;
    const Tally t = RunCase(c, variants, case_seed, case_index * static_cast<int64_t>(variants.size()), options);
    all.passed += t.passed;
    all.failed += t.failed;
    all.skipped += t.skipped;
  }
  if (options.shards > 1) std::printf("shard %lld/%lld: ", (long long)options.shard, (long long)options.shards);
  std::printf("%d passed, %d failed, %d skipped\n", all.passed, all.failed, all.skipped);
  return all.failed == 0 ? 0 : 1;
}

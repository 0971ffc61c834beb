// The CUDA grouped matmul (grouped_matmul_kernels.cu) against the contract
// (grouped_matmul.h) evaluated in double precision on the CPU: no XLA, no
// Python. Every case (M x E x N x K, bf16 or fp8 weights, a pattern of group
// sizes) runs under the automatic plan and then under every kernel variant
// (weight tiles 1, 2 x chunks in flight 2, 4 x token tiles 1, 2, 4, 8), each
// with the automatic launch shape and with 1 warp per block and 3 tiles per
// warp, and the streaming kernel (grouped_matmul_stream.cuh) at token tiles
// 1, 2, 4, 8, persistent with one block an SM and a block a unit with two,
// where it runs (split K included: the warp-tile variants then check the
// streaming kernel's slice sums against theirs). Checked:
//   - every covered element within the contract's bound of the exact value,
//     rows past the last group +0 bit for bit;
//   - every variant, and a second run of the automatic plan, writes the same
//     bits (grouped_matmul.h: the bits depend on neither the plan nor the run);
//   - y starts poisoned (NaN bytes) so an unwritten element shows, and guard
//     bytes around y catch writes out of bounds (compute-sanitizer memcheck
//     catches reads: x and w are allocated to their exact size);
//   - named cases: every finite fp8 code times a one-hot x is that code's value
//     exactly; all-subnormal fp8 codes; empty groups; one group holding every
//     row; sizes summing below M; negative sizes, sums past M and the int32
//     extremes (the clamped layout); K with a partial last 64-byte chunk; N not
//     a multiple of 16; E = 1 and E = 1024; experts with several passes of rows.
//
// Build (from the repository root; `make -C ffi/tests grouped-matmul` does the same):
//   mkdir -p build/tests
//   nvcc -O2 -arch=sm_90 -std=c++17 -lineinfo -I ffi ffi/tests/grouped_matmul_cuda_check.cu ffi/grouped_matmul_kernels.cu -o build/tests/grouped_matmul_cuda_check
// Run:
//   build/tests/grouped_matmul_cuda_check              # every case
//   build/tests/grouped_matmul_cuda_check --quick      # small case set, for compute-sanitizer
//   build/tests/grouped_matmul_cuda_check --only fp8   # cases whose name contains "fp8"
//   build/tests/grouped_matmul_cuda_check --seed 7     # other random inputs
//   compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/grouped_matmul_cuda_check --quick --quiet
// Last line: "N passed, M failed"; the exit status is non-zero on failure.
//
// The tiled-weight experiment (grouped_matmul_tiled.h): built with
// -DHISPARSE_GROUPED_MATMUL_TILE_ROWS=16 (or 32), the same checks with the weights uploaded in
// the tiled layout (the oracle reads the row-major ones); cases outside its domain (N % T, a
// partial last chunk) are skipped and counted ("N passed, M failed, S skipped").
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "grouped_matmul.h"
#include "grouped_matmul_cuda.h"
#include "grouped_matmul_oracle.h"
#include "grouped_matmul_tiled.h"

namespace {

using harness::Format;

using hisparse::GroupedMatmulBuffers;
using hisparse::GroupedMatmulDims;
using hisparse::GroupedMatmulPlan;
using hisparse::GroupedMatmulTuning;
using hisparse::GroupedWeightType;
namespace oracle = grouped_matmul_oracle;

using harness::Rng;

// ---------------------------------------------------------------------------
// Device buffers: inputs of their exact size (memcheck sees any read past
// them), y between guard bytes.

constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kPoisonByte = 0xFF;  // a float of 0xFFFFFFFF is a NaN

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* p = nullptr;
  CUDA_OK(cudaMalloc(&p, std::max<size_t>(host.size() * sizeof(T), 1)));
  if (!host.empty()) CUDA_OK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

class GuardedOutput {
 public:
  explicit GuardedOutput(size_t floats) : bytes_(floats * sizeof(float)) {
    CUDA_OK(cudaMalloc(&base_, bytes_ + 2 * kGuardBytes));
  }
  ~GuardedOutput() { cudaFree(base_); }
  GuardedOutput(const GuardedOutput&) = delete;
  GuardedOutput& operator=(const GuardedOutput&) = delete;
  float* get() const { return reinterpret_cast<float*>(base_ + kGuardBytes); }
  void Poison() {
    CUDA_OK(cudaMemset(base_, kGuardByte, bytes_ + 2 * kGuardBytes));
    CUDA_OK(cudaMemset(get(), kPoisonByte, bytes_));
    CUDA_OK(cudaDeviceSynchronize());
  }
  std::vector<uint32_t> Download() const {
    std::vector<uint32_t> out(bytes_ / 4);
    if (bytes_) CUDA_OK(cudaMemcpy(out.data(), get(), bytes_, cudaMemcpyDeviceToHost));
    return out;
  }
  bool GuardsIntact() const {
    return harness::GuardsHold(base_, kGuardBytes, base_ + kGuardBytes + bytes_, kGuardBytes, kGuardByte);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_;
};

// ---------------------------------------------------------------------------
// Cases.

enum class Weights { kRandom, kEveryFp8Code, kSubnormalFp8 };

struct Case {
  std::string name;
  int64_t rows, experts, n, k;
  bool fp8;
  std::vector<int32_t> sizes;  // empty: a random routing of every row
  Weights weights = Weights::kRandom;
  bool quick = false;  // in the --quick set
};

std::vector<int32_t> RoutedSizes(Rng& rng, int64_t rows, int64_t experts) {
  std::vector<int32_t> sizes(experts, 0);
  std::uniform_int_distribution<int64_t> pick(0, experts - 1);
  for (int64_t i = 0; i < rows; ++i) ++sizes[pick(rng)];
  return sizes;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (bool fp8 : {false, true}) {
    const char* t = fp8 ? "fp8" : "bf16";
    auto add = [&](const std::string& name, int64_t m, int64_t e, int64_t n, int64_t k, std::vector<int32_t> sizes,
                   bool quick = false) {
      cases.push_back({Format("%s/%s", t, name.c_str()), m, e, n, k, fp8, std::move(sizes), Weights::kRandom, quick});
    };
    add("tiny", 1, 1, 16, 64, {}, true);
    add("routed_M37_E4_N130_K96", 37, 4, 130, 96, {}, true);  // N % 16, K's last chunk partial
    add("routed_M64_E8_N40_K208", 64, 8, 40, 208, {});
    add("routed_M300_E8_N520_K1024", 300, 8, 520, 1024, {});
    add("routed_M640_E32_N256_K512", 640, 32, 256, 512, {});
    add("passes_M200_E2_N72_K128", 200, 2, 72, 128, {}, true);  // ~100 rows per expert
    add("one_group_first", 24, 6, 48, 64, {24, 0, 0, 0, 0, 0}, true);
    add("one_group_last", 24, 6, 48, 64, {0, 0, 0, 0, 0, 24});
    add("empty_groups", 24, 6, 48, 64, {0, 7, 0, 0, 9, 0}, true);
    add("sum_below_m", 24, 6, 48, 64, {3, 0, 2, 0, 1, 0}, true);
    add("no_rows", 24, 6, 48, 64, {0, 0, 0, 0, 0, 0});
    add("negative_sizes", 24, 4, 48, 64, {-5, 10, -1, 3}, true);
    add("sum_above_m", 24, 3, 48, 64, {10, 10, 10}, true);
    add("int32_extremes", 24, 3, 48, 64, {INT32_MIN, INT32_MAX, INT32_MAX});
    add("e1_part", 20, 1, 40, 96, {13});
    add("e1024", 100, 1024, 32, 64, {});
    add("k_one_piece", 9, 3, 24, fp8 ? 16 : 8, {});  // K of one 16-byte piece per row
    // The split of K (grouped_matmul.h's S, from E, N, K alone): S = 8 with every slice full;
    // S = 8 over 17 (fp8) or 33 (bf16, the last partial) chunks, so the last slices are short
    // or empty; a shared expert with several passes; S = 4 (fp8) across several experts;
    // the glm5 shared expert's gate_up and down at M = 17. Then S = 1 at E * N / 16 = 2048.
    add("split_M17_E1_N48_K1024", 17, 1, 48, 1024, {}, true);
    add("split_uneven_M41_E1_N24_K1040", 41, 1, 24, 1040, {}, true);
    add("split_passes_M200_E1_N40_K512", 200, 1, 40, 512, {});
    add("split_M30_E3_N32_K256", 30, 3, 32, 256, {});
    add("shared_glm5_gate_up_M17", 17, 1, 4096, 6144, {});
    add("shared_glm5_down_M17", 17, 1, 6144, 2048, {});
    add("no_split_M300_E8_N4096_K64", 300, 8, 4096, 64, {});
    add("no_split_M200_E32_N1024_K256", 200, 32, 1024, 256, {});
  }
  cases.push_back({"fp8/every_code_one_hot", 64, 1, 32, 64, true, {64}, Weights::kEveryFp8Code, true});
  cases.push_back({"fp8/subnormal_codes", 10, 2, 24, 64, true, {4, 6}, Weights::kSubnormalFp8, true});
  return cases;
}

struct Inputs {
  std::vector<uint16_t> x;    // [M, K] bf16 bits
  std::vector<uint8_t> w;     // [E, N, K] bf16 bits or e4m3 codes
  std::vector<float> scale;   // [E, N]
  std::vector<int32_t> sizes;  // [E]
};

Inputs MakeInputs(const Case& c, Rng& rng) {
  Inputs in;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  in.x.resize(c.rows * c.k);
  for (auto& v : in.x) v = oracle::FloatToBf16(normal(rng));
  const int64_t weights = c.experts * c.n * c.k;
  in.w.resize(weights * (c.fp8 ? 1 : 2));
  in.scale.resize(c.experts * c.n);
  for (auto& s : in.scale) s = uniform(rng);
  if (c.weights == Weights::kRandom) {
    if (c.fp8) {
      for (auto& b : in.w) {
        do b = static_cast<uint8_t>(rng()); while ((b & 0x7f) == 0x7f);  // no NaN codes
      }
    } else {
      uint16_t* w = reinterpret_cast<uint16_t*>(in.w.data());
      const float unit = 1.0f / std::sqrt(static_cast<float>(c.k));
      for (int64_t i = 0; i < weights; ++i) w[i] = oracle::FloatToBf16(normal(rng) * unit);
    }
  } else if (c.weights == Weights::kEveryFp8Code) {
    // One code every 8 k values, every finite code once; x one-hot: y[m, n] = w[n, m] exactly.
    std::fill(in.w.begin(), in.w.end(), 0);
    int64_t at = 0;
    for (int code = 0; code < 256; ++code) {
      if ((code & 0x7f) == 0x7f) continue;
      in.w[at] = static_cast<uint8_t>(code);
      at += 8;
    }
    std::fill(in.x.begin(), in.x.end(), 0);
    for (int64_t m = 0; m < c.rows; ++m) in.x[m * c.k + m % c.k] = oracle::FloatToBf16(1.0f);
    std::fill(in.scale.begin(), in.scale.end(), 1.0f);
  } else {  // subnormal codes m * 2^-9, large x
    for (auto& b : in.w) b = static_cast<uint8_t>((rng() & 0x80) | (1 + rng() % 7));
    for (auto& v : in.x) v = oracle::FloatToBf16(64.0f);
  }
  in.sizes = c.sizes.empty() ? RoutedSizes(rng, c.rows, c.experts) : c.sizes;
  return in;
}

// ---------------------------------------------------------------------------
// One case under every plan.

struct Outcome {
  bool ok = true;
  bool skipped = false;  // outside the tiled experiment's domain (grouped_matmul_tiled.h)
  std::string detail;
  void Fail(const std::string& why) {
    if (ok) detail = why;
    ok = false;
  }
};

// The warp-tile kernel's variants, then the streaming kernel's token tiles (where it runs: compute
// capability 9.0 and up; RunCase skips them elsewhere).
std::vector<GroupedMatmulTuning> Variants() {
  std::vector<GroupedMatmulTuning> out;
  for (int wt : {1, 2})
    for (int u : {2, 4})
      for (int tt : {1, 2, 4, 8})
        for (int shape : {0, 1}) {
          GroupedMatmulTuning t;
          t.weight_tiles = wt;
          t.chunks_in_flight = u;
          t.token_tiles = tt;
          if (shape == 1) t.warps_per_block = 1, t.tiles_per_warp = 3;
          t.stream = -1;
          out.push_back(t);
        }
  for (int groups : {1, 2, 4})  // slice groups: a split weight's only (RunCase skips the others)
    for (int tt : {1, 2, 4, 8})
      for (int shape : {0, 1}) {  // one persistent block an SM, or two an SM and a block a unit
        GroupedMatmulTuning t;
        t.token_tiles = tt;
        t.stream = 1;
        t.stream_blocks_per_sm = shape == 0 ? 1 : 2;
        t.stream_persistent = shape == 0 ? 1 : -1;
        t.stream_slice_groups = groups;
        out.push_back(t);
      }
  return out;
}

std::string Describe(const GroupedMatmulPlan& p) {
  if (p.stream_stages > 0)
    return Format("streaming kernel, %d stages, token tiles %d, %d blocks an SM%s, K slices %d in %d groups",
                  p.stream_stages, p.token_tiles, p.stream_blocks_per_sm, p.stream_persistent ? ", persistent" : "",
                  p.k_slices, p.k_slices > 1 ? p.stream_slice_groups : 1);
  return Format("warps %d, weight tiles %d, in flight %d, token tiles %d, tiles/warp %d, blocks/expert %d, "
                "K slices %d",
                p.warps_per_block, p.weight_tiles, p.chunks_in_flight, p.token_tiles, p.tiles_per_warp,
                p.blocks_per_expert, p.k_slices);
}

Outcome RunCase(const Case& c, Rng& rng, bool verbose) {
  Outcome out;
  const Inputs in = MakeInputs(c, rng);
  GroupedMatmulDims dims;
  dims.rows = c.rows;
  dims.experts = c.experts;
  dims.n = c.n;
  dims.k = c.k;
  dims.weight_type = c.fp8 ? GroupedWeightType::kFp8E4m3 : GroupedWeightType::kBf16;
  if (const char* e = hisparse::GroupedMatmulSizeError(dims); e[0] != '\0') {
    out.Fail(Format("size error: %s", e));
    return out;
  }
  const int64_t row_bytes = c.k * (c.fp8 ? 1 : 2);
  if (hisparse::kGroupedMatmulTileRows > 0 && !hisparse::TiledWeightsFit(c.n, row_bytes, hisparse::kGroupedMatmulTileRows)) {
    out.skipped = true;
    return out;
  }
  uint16_t* x = DeviceCopy(in.x);
  uint8_t* w = DeviceCopy(hisparse::kGroupedMatmulTileRows > 0
                              ? hisparse::TileWeights(in.w, c.experts * c.n, row_bytes, hisparse::kGroupedMatmulTileRows)
                              : in.w);
  float* scale = DeviceCopy(in.scale);
  int32_t* sizes = DeviceCopy(in.sizes);
  GuardedOutput y(c.rows * c.n);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GroupedMatmulBuffers io{x, w, scale, sizes, y.get()};

  auto run = [&](const GroupedMatmulTuning& tuning, std::vector<uint32_t>* bits) -> bool {
    y.Poison();
    const cudaError_t err = hisparse::LaunchGroupedMatmul(dims, io, stream, tuning);
    if (err != cudaSuccess) {
      out.Fail(Format("launch: %s", cudaGetErrorString(err)));
      return false;
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    if (!y.GuardsIntact()) {
      out.Fail("a write outside y");
      return false;
    }
    *bits = y.Download();
    return true;
  };

  std::vector<uint32_t> first, again;
  GroupedMatmulPlan plan;
  CUDA_OK(hisparse::GroupedMatmulPlanFor(dims, {}, &plan));
  if (verbose) std::printf("  %-36s auto plan: %s\n", c.name.c_str(), Describe(plan).c_str());
  // The split is the one the contract's rule gives (grouped_matmul_cuda.h), in every plan.
  const int want_slices = hisparse::GroupedMatmulKSlices(dims);
  if (plan.k_slices != want_slices) out.Fail(Format("auto plan splits K in %d, the rule says %d", plan.k_slices, want_slices));
  if (run({}, &first) && run({}, &again) && first != again) out.Fail("two runs of the automatic plan differ");

  // Values against the double-precision contract.
  if (out.ok) {
    const auto starts = oracle::GroupStarts(in.sizes, c.rows);
    const int64_t covered = starts.back();
    int64_t bad = 0;
    for (int64_t m = 0; m < c.rows; ++m) {
      for (int64_t n = 0; n < c.n; ++n) {
        const uint32_t bits = first[m * c.n + n];
        float got;
        std::memcpy(&got, &bits, sizeof(got));
        bool good;
        oracle::Expected want;
        if (m >= covered) {
          good = bits == 0;  // +0 exactly
        } else {
          want = oracle::ExpectedElement(in.x.data(), in.w.data(), c.fp8, in.scale.data(), c.n, c.k, starts, m, n);
          if (c.weights == Weights::kEveryFp8Code) {
            good = static_cast<double>(got) == want.value;  // one product: exact
          } else {
            good = std::fabs(got - want.value) <= want.bound && (c.weights != Weights::kSubnormalFp8 || got != 0.0f);
          }
        }
        if (!good && bad++ == 0) {
          out.Fail(m >= covered ? Format("y[%lld, %lld] has bits 0x%08x past the groups, want +0", (long long)m,
                                         (long long)n, bits)
                                : Format("y[%lld, %lld] = %.9g, want %.9g within %.3g", (long long)m, (long long)n,
                                         got, want.value, want.bound));
        }
      }
    }
    if (bad) out.detail += Format(" (%lld bad elements)", (long long)bad);
  }

  // Every variant: the same bits.
  if (out.ok) {
    for (const GroupedMatmulTuning& t : Variants()) {
      if (t.stream == 1 && hisparse::GroupedMatmulPlanFor(dims, t, &plan) == cudaErrorNotSupported) continue;
      std::vector<uint32_t> bits;
      if (!run(t, &bits)) break;
      if (bits != first) {
        CUDA_OK(hisparse::GroupedMatmulPlanFor(dims, t, &plan));
        out.Fail("variant (" + Describe(plan) + ") writes other bits than the automatic plan");
        break;
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(x));
  CUDA_OK(cudaFree(w));
  CUDA_OK(cudaFree(scale));
  CUDA_OK(cudaFree(sizes));
  return out;
}

// The launcher refuses what the contract excludes, before touching anything.
bool RefusesBadArguments() {
  GroupedMatmulDims d;
  d.rows = 4, d.experts = 2, d.n = 16, d.k = 36;  // bf16 K not a multiple of 8
  GroupedMatmulBuffers io;
  bool ok = hisparse::LaunchGroupedMatmul(d, io, nullptr) == cudaErrorInvalidValue;
  d.k = 64, d.experts = 1025;
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr) == cudaErrorInvalidValue;
  d.experts = 2;
  GroupedMatmulTuning t;
  t.token_tiles = 3;
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorInvalidValue;
  t.token_tiles = 0, t.stream = 2;
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorInvalidValue;
  // The streaming kernel's launch shape outside its variants (1 or 2 blocks an SM; 1, 2 or 4 slice
  // groups), and slice groups where the weight has fewer slices (K = 8 bf16: one chunk, S = 1).
  t.stream = 1, t.stream_blocks_per_sm = 3;
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorInvalidValue;
  t.stream = -1;  // refused on the warp-tile kernel too, not ignored
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorInvalidValue;
  t.stream = 1, t.stream_blocks_per_sm = 0, t.stream_slice_groups = 3;
  ok = ok && hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorInvalidValue;
  d.k = 8, t.stream_slice_groups = 2;
  ok = ok && hisparse::GroupedMatmulKSlices(d) == 1 &&
       hisparse::LaunchGroupedMatmul(d, io, nullptr, t) == cudaErrorNotSupported;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions options = harness::ParseCheckOptions(argc, argv, /*default_seed=*/1);
  const bool quiet = !options.verbose;
  int passed = 0, failed = 0, skipped = 0;
  if (RefusesBadArguments()) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL launcher/bad_arguments: not refused with cudaErrorInvalidValue\n");
  }
  for (const Case& c : Cases()) {
    if (options.quick && !c.quick) continue;
    if (options.Skips(c.name)) continue;
    Rng rng(options.seed * 1000003 + std::hash<std::string>{}(c.name));
    const Outcome o = RunCase(c, rng, !quiet);
    if (o.skipped) {
      ++skipped;
      if (!quiet) std::printf("skip %s: outside the tiled layout's domain\n", c.name.c_str());
    } else if (o.ok) {
      ++passed;
      if (!quiet) std::printf("ok   %s\n", c.name.c_str());
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", c.name.c_str(), o.detail.c_str());
    }
  }
  if (hisparse::kGroupedMatmulTileRows > 0)
    std::printf("%d passed, %d failed, %d skipped (weights in tiles of %d rows)\n", passed, failed, skipped,
                static_cast<int>(hisparse::kGroupedMatmulTileRows));
  else
    std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

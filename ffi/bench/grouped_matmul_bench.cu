// The MoE grouped matmul kernel (ffi/grouped_matmul_kernels.cu) on the GPU,
// against the HBM bandwidth measured in the same run.
//
// Ceilings: cudaMemcpy device-to-device of 2 GiB (reported as read + write
// bytes / time) and a read-only kernel over the same 2 GiB (16-byte loads).
// Configurations: GLM-5.1-FP8 on 8 H200s, one GPU's 32 local experts of one
// layer: gate + up (K = 6144, N = 4096) and down (K = 2048, N = 6144), fp8
// e4m3 and bf16 weights, P in {16, 136, 640} rows routed uniformly at random
// over the experts (exact bincounts, fixed seed). The figure of merit is the
// bytes of the experts that got rows (active experts x N x K x element bytes)
// over the kernel's median time: the kernel reads nothing else of w. Each
// launch is timed alone with CUDA events, --iters times (default 30) after 3
// warm-ups, queued behind a 20 ms spin kernel so the host's launch cost is not
// in the time; successive launches alternate between two copies of the
// weights, so no launch finds the previous one's weights in L2.
// Every configuration is checked before it is timed: two runs give identical
// bits, every swept variant gives the same bits as the automatic plan
// (grouped_matmul.h), and 512 sampled elements match a double-precision
// evaluation on the CPU within the contract's bound. A configuration that
// fails prints FAIL and the program exits 1 at the end: a wrong kernel cannot
// report a fast time.
// A sweep of the plan (weight tiles x chunks in flight x token tiles x warps
// per block x tiles per warp) per configuration shows whether the automatic
// plan is the fast one: the table gives the automatic plan and the best
// variant; --sweep prints every variant. Every sweep holds the warp-tile kernel's own plan
// (grouped_matmul_cuda.h): on sm_90 the automatic plan is the streaming kernel.
//
// Build (repository root):
//   make -C ffi/bench grouped-matmul
// Run (under a minute on an H200; prints Markdown, writes JSON):
//   build/grouped_matmul_bench results/grouped_matmul_bench.json
//   build/grouped_matmul_bench /tmp/gmm.json --quick     # fp8 only, no sweep
//   build/grouped_matmul_bench /tmp/gmm.json --sweep     # every variant of every configuration
//   build/grouped_matmul_bench /tmp/gmm.json --slices --quick --ab   # the streaming kernel (the
//       # automatic plan on sm_90 for the routed experts; asked for, the shared expert's split K) in
//       # four launch shapes against the warp-tile kernel, same bits checked, all timed
//   build/grouped_matmul_bench /tmp/gmm.json --slices --dsv32 --quick --ab   # the same at the
//       # dsv32-h200 slice's shapes (D = 7168; 8 x 70 pairs at HiSparse's 32K batch)
//   build/grouped_matmul_bench /tmp/gmm.json --slices --quick --only gate_up:32:328 --iters 3
//       # one configuration (projection:experts:rows; fp8 and bf16 both unless --quick), e.g. under
//       # ncu --kernel-name regex:GroupedMatmulKernel --launch-skip 3 --launch-count 1
// The tiled-weight experiment (ffi/grouped_matmul_tiled.h): build with
//   make -C ffi/bench grouped-matmul EXTRA=-DHISPARSE_GROUPED_MATMUL_TILE_ROWS=16 OUT=build/tiled16
// and the kernel reads the (random) weights as tiles of 16 rows; the CPU check stages each
// sampled row from its tile, so the bits are checked against the same layout the kernel reads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "grouped_matmul.h"
#include "grouped_matmul_cuda.h"
#include "grouped_matmul_tiled.h"
#include "tests/harness.h"
#include "tests/grouped_matmul_oracle.h"

namespace {

using harness::Mix;
using harness::Stats;
using harness::TimeLaunches;
using harness::Uniform;

using hisparse::GroupedMatmulBuffers;
using hisparse::GroupedMatmulDims;
using hisparse::GroupedMatmulPlan;
using hisparse::GroupedMatmulTuning;
using hisparse::GroupedWeightType;
namespace oracle = grouped_matmul_oracle;

constexpr int64_t kExperts = 32;
constexpr int64_t kCeilingBytes = 2ll << 30;
constexpr double kNominalGbs = 4300.0;  // H200 HBM3e, the target's reference
constexpr int kChecked = 512;          // sampled elements per configuration

// ---------------------------------------------------------------------------
// Kernels of the benchmark itself.

__device__ uint16_t Bf16Bits(float f) {  // round to nearest even (finite f)
  uint32_t bits = __float_as_uint(f);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// bf16 values (as bits) of amplitude * Uniform, or random fp8 codes without the NaN codes.
__global__ void FillWeights(uint8_t* p, int64_t elements, bool fp8, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < elements; i += int64_t{gridDim.x} * blockDim.x) {
    if (fp8) {
      uint8_t code = static_cast<uint8_t>(Mix(i ^ (seed << 40)));
      if ((code & 0x7f) == 0x7f) code ^= 0x08;  // a NaN code becomes a finite one
      p[i] = code;
    } else {
      reinterpret_cast<uint16_t*>(p)[i] = Bf16Bits(amplitude * Uniform(i, seed));
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

struct Config {
  const char* projection;  // "gate_up" or "down"
  int64_t k, n;
  bool fp8;
  int64_t rows;  // P
  int64_t experts = kExperts;  // E: 32 routed, 1 for the shared expert (every token)
  // > 0: the shared expert stored as one more expert of the routed launch: the last of the E
  // experts gets exactly these rows (every token), the others the rest, uniformly.
  int64_t shared_rows = 0;
  int64_t element_bytes() const { return fp8 ? 1 : 2; }
  GroupedMatmulDims dims() const {
    GroupedMatmulDims d;
    d.rows = rows;
    d.experts = experts;
    d.n = n;
    d.k = k;
    d.weight_type = fp8 ? GroupedWeightType::kFp8E4m3 : GroupedWeightType::kBf16;
    return d;
  }
};

struct Result {
  Config config;
  int64_t active = 0, active_bytes = 0;
  GroupedMatmulPlan auto_plan, best_plan;
  Stats auto_stats, best_stats;
  double auto_gbs = 0, best_gbs = 0;
  bool ok = true;
  std::string failure;
};

std::string Describe(const GroupedMatmulPlan& p) {
  char buffer[160];
#ifdef HISPARSE_GMM_BENCH_BASELINE  // built against main's kernel (no k_slices) for a same-run baseline
  std::snprintf(buffer, sizeof(buffer), "w%d wt%d u%d tt%d q%d", p.warps_per_block, p.weight_tiles,
                p.chunks_in_flight, p.token_tiles, p.tiles_per_warp);
#else
  if (p.stream_stages > 0)
    std::snprintf(buffer, sizeof(buffer), "stream st%d tt%d b%d%s%s", p.stream_stages, p.token_tiles,
                  p.stream_blocks_per_sm, p.stream_persistent ? " p" : "",
                  p.k_slices > 1 ? (" sg" + std::to_string(p.stream_slice_groups)).c_str() : "");
  else
    std::snprintf(buffer, sizeof(buffer), "w%d wt%d u%d tt%d q%d S%d", p.warps_per_block, p.weight_tiles,
                  p.chunks_in_flight, p.token_tiles, p.tiles_per_warp, p.k_slices);
#endif
  return buffer;
}

std::string Json(const GroupedMatmulPlan& p) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer),
                "{\"warps_per_block\": %d, \"weight_tiles\": %d, \"chunks_in_flight\": %d, \"token_tiles\": %d, "
                "\"tiles_per_warp\": %d, \"blocks_per_expert\": %d, \"stream_stages\": %d, "
                "\"stream_slice_groups\": %d}",
                p.warps_per_block, p.weight_tiles, p.chunks_in_flight, p.token_tiles, p.tiles_per_warp,
                p.blocks_per_expert, p.stream_stages, p.stream_slice_groups);
  return buffer;
}

// The warp-tile kernel's own automatic plan: the A/B against the streaming kernel (--ab).
GroupedMatmulTuning WarpTileKernel() {
  GroupedMatmulTuning t;
  t.stream = -1;
  return t;
}

// --slices: the warp-tile kernel's plan fields that matter at decode (tt automatic, one tile per warp).
std::vector<GroupedMatmulTuning> SliceSweep() {
  std::vector<GroupedMatmulTuning> out = {WarpTileKernel()};
  for (int wt : {1, 2})
    for (int u : {2, 4})
      for (int warps : {2, 4, 8}) {
        GroupedMatmulTuning t;
        t.weight_tiles = wt;
        t.chunks_in_flight = u;
        t.warps_per_block = warps;
        t.stream = -1;
        out.push_back(t);
      }
  return out;
}

std::vector<GroupedMatmulTuning> Sweep(const Config& c, bool slices, bool ab) {
  if (ab) {  // the warp-tile kernel, then the streaming kernel's launch shapes (and a split weight's slice groups)
    std::vector<GroupedMatmulTuning> out = {WarpTileKernel()};
    for (int groups : {1, 2, 4})
      for (int persistent : {1, -1})
        for (int blocks : {1, 2}) {
          GroupedMatmulTuning t;
          t.stream = 1;
          t.stream_blocks_per_sm = blocks;
          t.stream_persistent = persistent;
          t.stream_slice_groups = groups;
          GroupedMatmulPlan plan;
          if (hisparse::GroupedMatmulPlanFor(c.dims(), t, &plan) == cudaSuccess) out.push_back(t);
        }
    return out;
  }
  if (slices) return SliceSweep();
  GroupedMatmulPlan automatic;
  CUDA_OK(hisparse::GroupedMatmulPlanFor(c.dims(), {}, &automatic));
  std::vector<int> token_tiles = {automatic.token_tiles};
  if (automatic.token_tiles != 8) token_tiles.push_back(8);
  std::vector<GroupedMatmulTuning> out = {WarpTileKernel()};
  for (int wt : {1, 2})
    for (int u : {2, 4})
      for (int tt : token_tiles)
        for (int warps : {2, 4, 8})
          for (int q : {0, 1}) {
            GroupedMatmulTuning t;
            t.weight_tiles = wt;
            t.chunks_in_flight = u;
            t.token_tiles = tt;
            t.warps_per_block = warps;
            t.tiles_per_warp = q;
            t.stream = -1;
            out.push_back(t);
          }
  return out;
}

Result RunConfig(const Config& c, cudaStream_t stream, int iters, bool sweep, bool print_sweep, uint8_t* w_copies[2],
                 uint32_t seed, bool slices, bool ab) {
  Result r;
  r.config = c;
  const GroupedMatmulDims dims = c.dims();
  const int64_t experts = c.experts;
  const int64_t weight_elements = experts * c.n * c.k;

  // Routing: exact bincounts of P uniform draws; x and scale from the same seed.
  std::mt19937_64 rng(seed * 7919 + c.rows);
  std::vector<int32_t> sizes(experts, 0);
  const int64_t routed = c.shared_rows > 0 ? experts - 1 : experts;
  for (int64_t i = 0; i < c.rows - c.shared_rows; ++i) ++sizes[std::uniform_int_distribution<int64_t>(0, routed - 1)(rng)];
  if (c.shared_rows > 0) sizes[experts - 1] = static_cast<int32_t>(c.shared_rows);
  for (int32_t s : sizes) r.active += s > 0;
  r.active_bytes = r.active * c.n * c.k * c.element_bytes();
  std::vector<uint16_t> x(c.rows * c.k);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = oracle::FloatToBf16(normal(rng));
  std::vector<float> scale(experts * c.n);
  for (auto& s : scale) s = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng) * (c.fp8 ? 1.0f / 448 : 1.0f);

  uint16_t* d_x = nullptr;
  float *d_scale = nullptr, *d_y = nullptr;
  int32_t* d_sizes = nullptr;
  CUDA_OK(cudaMalloc(&d_x, x.size() * 2));
  CUDA_OK(cudaMalloc(&d_scale, scale.size() * 4));
  CUDA_OK(cudaMalloc(&d_sizes, sizes.size() * 4));
  CUDA_OK(cudaMalloc(&d_y, c.rows * c.n * 4));
  CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_scale, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_sizes, sizes.data(), sizes.size() * 4, cudaMemcpyHostToDevice));
  for (int copy = 0; copy < 2; ++copy)
    FillWeights<<<1024, 256, 0, stream>>>(w_copies[copy], weight_elements, c.fp8, seed, 1.0f / std::sqrt(c.k));
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(stream));

  auto launch = [&](const GroupedMatmulTuning& t, int copy) {
    GroupedMatmulBuffers io{d_x, w_copies[copy], d_scale, d_sizes, d_y};
    CUDA_OK(hisparse::LaunchGroupedMatmul(dims, io, stream, t));
  };
  auto download = [&]() {
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint32_t> bits(c.rows * c.n);
    CUDA_OK(cudaMemcpy(bits.data(), d_y, bits.size() * 4, cudaMemcpyDeviceToHost));
    return bits;
  };

  // --- checks: the same bits twice, sampled elements against the CPU ---
  launch({}, 0);
  const std::vector<uint32_t> first = download();
  launch({}, 0);
  if (download() != first) r.ok = false, r.failure = "two runs differ";
  const auto starts = oracle::GroupStarts(sizes, c.rows);
  std::vector<uint8_t> w_row(c.k * c.element_bytes());
  for (int i = 0; i < kChecked && r.ok; ++i) {
    const int64_t m = std::uniform_int_distribution<int64_t>(0, c.rows - 1)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(0, c.n - 1)(rng);
    const size_t e = oracle::GroupOf(starts, m);
    // The oracle reads w[e, n, :] only: stage that row as expert 0, row 0 of a one-row weight.
    const int64_t row = static_cast<int64_t>(e) * c.n + n, row_bytes = c.k * c.element_bytes();
    if (hisparse::kGroupedMatmulTileRows > 0) {  // the row's bytes from its tile (grouped_matmul_tiled.h)
      // At least 1: a row-major build compiles this branch too, and "% 0" would warn there.
      const int64_t tile = std::max<int64_t>(hisparse::kGroupedMatmulTileRows, 1);
      std::vector<uint8_t> tile_bytes(tile * row_bytes);
      CUDA_OK(cudaMemcpy(tile_bytes.data(), w_copies[0] + (row - row % tile) * row_bytes, tile_bytes.size(),
                         cudaMemcpyDeviceToHost));
      for (int64_t b = 0; b < row_bytes; ++b)
        w_row[b] = tile_bytes[hisparse::TiledWeightOffset(row, b, row_bytes, tile) - (row - row % tile) * row_bytes];
    } else {
      CUDA_OK(cudaMemcpy(w_row.data(), w_copies[0] + row * row_bytes, w_row.size(), cudaMemcpyDeviceToHost));
    }
    const float one_scale = scale[e * c.n + n];
    const std::vector<int64_t> one_group = {0, 1};  // row 0 -> expert 0
    const auto want = oracle::ExpectedElement(x.data() + m * c.k, w_row.data(), c.fp8, &one_scale, 1, c.k, one_group,
                                              0, 0);
    float got;
    std::memcpy(&got, &first[m * c.n + n], 4);
    if (!(std::fabs(got - want.value) <= want.bound)) {
      char buffer[160];
      std::snprintf(buffer, sizeof(buffer), "y[%lld, %lld] = %.9g, want %.9g within %.3g", (long long)m,
                    (long long)n, got, want.value, want.bound);
      r.ok = false, r.failure = buffer;
    }
  }

  // --- timing ---
  CUDA_OK(hisparse::GroupedMatmulPlanFor(dims, {}, &r.auto_plan));
  r.auto_stats = TimeLaunches(stream, iters, [&](int i) { launch({}, i % 2); });
  r.auto_gbs = r.active_bytes / (r.auto_stats.median_us * 1e3);
  r.best_plan = r.auto_plan, r.best_stats = r.auto_stats, r.best_gbs = r.auto_gbs;
  if (sweep) {
    for (const GroupedMatmulTuning& t : Sweep(c, slices, ab)) {
      GroupedMatmulPlan plan;
      CUDA_OK(hisparse::GroupedMatmulPlanFor(dims, t, &plan));
      launch(t, 0);
      if (download() != first && r.ok) r.ok = false, r.failure = "variant " + Describe(plan) + " writes other bits";
      const Stats s = TimeLaunches(stream, iters, [&](int i) { launch(t, i % 2); });
      const double gbs = r.active_bytes / (s.median_us * 1e3);
      if (print_sweep)
        std::printf("    sweep %-8s %-5s P=%-4lld %-24s %8.1f us %7.0f GB/s\n", c.projection, c.fp8 ? "fp8" : "bf16",
                    (long long)c.rows, Describe(plan).c_str(), s.median_us, gbs);
      if (gbs > r.best_gbs) r.best_plan = plan, r.best_stats = s, r.best_gbs = gbs;
    }
  }
  CUDA_OK(cudaFree(d_x));
  CUDA_OK(cudaFree(d_scale));
  CUDA_OK(cudaFree(d_sizes));
  CUDA_OK(cudaFree(d_y));
  return r;
}

const char* kUsage =
    "usage: %s OUT.json [--quick] [--sweep] [--slices [--dsv32]] [--ab] [--iters N] [--seed N] [--only PROJ:E:P]\n"
    "  --ab                    each configuration against the warp-tile kernel's own plan alone (same bits\n"
    "                          checked; both times printed), instead of the sweep\n"
    "  --dsv32                 with --slices: the dsv32-h200 slice's shapes (D = 7168) instead of glm5-h200's\n"
    "  --only gate_up:32:328   that configuration alone (e.g. under ncu); a wrong one lists them\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  const char* out_path = argv[1];
  bool quick = false, print_sweep = false, slices = false, ab = false, dsv32 = false;
  std::string only;  // PROJ:E:P, or empty: every configuration
  int iters = 30;
  uint32_t seed = 1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--sweep") print_sweep = true;
    else if (a == "--slices") slices = true;
    else if (a == "--dsv32") dsv32 = true;
    else if (a == "--ab") ab = print_sweep = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seed" && i + 1 < argc) seed = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, kUsage, argv[0]);
      return 2;
    }
  }

  if (dsv32 && !slices) {
    std::fprintf(stderr, "--dsv32 picks the slices' shapes: give --slices too\n");
    return 2;
  }

  // --- configurations (before the device: a wrong --only fails fast) --------
  std::vector<Config> configs;
  // --slices: the deployment slices' shapes (GLM-5.1 per GPU, EP8, fp8): routed E = 32 at P = 8 x
  // batch pairs (batches 1, 2, 9, 10, 17, 41, 64), then the shared expert (E = 1, every token) at M = batch.
  // --slices --dsv32: the dsv32-h200 slice's shapes instead (DeepSeek-V3.2 per GPU, EP8, fp8: D =
  // 7168, expert width 2048): routed E = 32 at P = 8 x batch (batches 2, 4, 16, 17, 30, 70: both
  // modes at 32K, 128K and 256K), then the shared expert at M = batch.
  if (slices && dsv32) {
    for (const auto& [name, k, n] : {std::tuple<const char*, int64_t, int64_t>{"gate_up", 7168, 4096},
                                     std::tuple<const char*, int64_t, int64_t>{"down", 2048, 7168}}) {
      for (int64_t rows : {16, 32, 128, 136, 240, 560}) configs.push_back({name, k, n, true, rows});
      for (int64_t rows : {2, 4, 16, 17, 30, 70}) configs.push_back({name, k, n, true, rows, 1});
    }
  } else if (slices) {
    for (const auto& [name, k, n] : {std::tuple<const char*, int64_t, int64_t>{"gate_up", 6144, 4096},
                                     std::tuple<const char*, int64_t, int64_t>{"down", 2048, 6144}}) {
      for (int64_t rows : {8, 16, 72, 80, 136, 328, 512}) configs.push_back({name, k, n, true, rows});
      for (int64_t rows : {2, 17, 41, 64}) configs.push_back({name, k, n, true, rows, 1});
      // The shared expert as a 33rd expert of the routed launch (batch b: 8 b routed pairs + b
      // shared rows), against the two launches above: the layout hisparse_jax.models.moe
      // measured and left (slower from batch 10 up, where the shared rows take more passes).
      for (int64_t batch : {1, 2, 10, 17, 41}) configs.push_back({name, k, n, true, 9 * batch, kExperts + 1, batch});
    }
  }
  for (bool fp8 : {true, false}) {
    if (slices) break;
    if (quick && !fp8) continue;
    for (const auto& [name, k, n] : {std::tuple<const char*, int64_t, int64_t>{"gate_up", 6144, 4096},
                                     std::tuple<const char*, int64_t, int64_t>{"down", 2048, 6144}})
      for (int64_t rows : {16, 136, 640}) configs.push_back({name, k, n, fp8, rows});
  }
  if (!only.empty()) {
    std::vector<Config> kept;
    std::string listed;
    for (const Config& c : configs) {
      const std::string name = std::string(c.projection) + ":" + std::to_string(c.experts) + ":" + std::to_string(c.rows);
      listed += (listed.empty() ? "" : ", ") + name;
      if (name == only) kept.push_back(c);
    }
    if (kept.empty()) {
      std::fprintf(stderr, "--only %s: no such configuration in this run (PROJ:E:P, one of: %s)\n", only.c_str(),
                   listed.c_str());
      return 2;
    }
    configs = kept;
  }

  const harness::DeviceInfo info = harness::QueryDevice();
  std::printf("# MoE grouped matmul benchmark\n\ndevice: %s; E = %lld experts, x bf16, y f32; %d iterations "
              "(min / median / max); weights %s\n\n", harness::DeviceLine(info).c_str(), (long long)kExperts, iters,
              hisparse::kGroupedMatmulTileRows > 0
                  ? ("in tiles of " + std::to_string(hisparse::kGroupedMatmulTileRows) + " rows").c_str()
                  : "row-major");
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // --- HBM ceilings ---------------------------------------------------------
  const int64_t ceiling_bytes = quick ? kCeilingBytes / 4 : kCeilingBytes;
  const harness::HbmCeilings hbm =
      harness::MeasureHbmCeilingsOver(stream, ceiling_bytes, info.prop.multiProcessorCount, [&](uint8_t* src) {
        FillWeights<<<1024, 256, 0, stream>>>(src, ceiling_bytes / 2, false, 1, 1.0f);
      });
  const double copy_gbs = hbm.copy_gbs, read_gbs = hbm.read_gbs;
  std::printf("HBM: memcpy D2D of %.0f MiB %.0f GB/s (read + write), read kernel over it %.0f GB/s (medians); "
              "nominal %.0f GB/s\n\n", ceiling_bytes / 1048576.0, copy_gbs, read_gbs, kNominalGbs);

  int64_t max_bytes = 0;
  for (const Config& c : configs) max_bytes = std::max(max_bytes, c.experts * c.n * c.k * c.element_bytes());
  uint8_t* w_copies[2];
  for (auto& w : w_copies) CUDA_OK(cudaMalloc(&w, max_bytes));

  std::printf("| proj | w | E | P | active experts | active weight MB | auto plan | auto us (min/med/max) | auto GB/s "
              "| of nominal | of read kernel | of memcpy | best plan | best GB/s | check |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Result> results;
  bool all_ok = true;
  for (const Config& c : configs) {
    if (hisparse::kGroupedMatmulTileRows > 0 &&
        !hisparse::TiledWeightsFit(c.n, c.k * c.element_bytes(), hisparse::kGroupedMatmulTileRows)) {
      std::printf("| %s | %s | %lld | %lld | skipped: outside the tiled layout's domain |\n", c.projection,
                  c.fp8 ? "fp8" : "bf16", (long long)c.experts, (long long)c.rows);
      continue;
    }
    const Result r = RunConfig(c, stream, iters, !quick || ab, print_sweep, w_copies, seed, slices, ab);
    all_ok = all_ok && r.ok;
    std::printf("| %s | %s | %lld | %lld | %lld | %.1f | %s | %.1f / %.1f / %.1f | %.0f | %.2f | %.2f | %.2f | %s | %.0f "
                "| %s%s%s |\n",
                c.projection, c.fp8 ? "fp8" : "bf16", (long long)c.experts, (long long)c.rows, (long long)r.active, r.active_bytes / 1e6,
                Describe(r.auto_plan).c_str(), r.auto_stats.min_us, r.auto_stats.median_us, r.auto_stats.max_us,
                r.auto_gbs, r.auto_gbs / kNominalGbs, r.auto_gbs / read_gbs, r.auto_gbs / copy_gbs,
                Describe(r.best_plan).c_str(), r.best_gbs, r.ok ? "ok" : "FAIL", r.ok ? "" : ": ", r.failure.c_str());
    std::fflush(stdout);
    results.push_back(r);
  }
  for (auto& w : w_copies) CUDA_OK(cudaFree(w));

  FILE* f = harness::OpenJson(out_path);
  std::fprintf(f, "{\n  \"device\": \"%s\", \"sms\": %d, \"cuda_runtime\": %d, \"driver\": %d, \"iters\": %d,\n",
               info.prop.name, info.prop.multiProcessorCount, info.runtime, info.driver, iters);
  std::fprintf(f, "  \"weight_tile_rows\": %lld,\n", (long long)hisparse::kGroupedMatmulTileRows);
  std::fprintf(f, "  \"hbm\": {\"memcpy_d2d_gbs\": %.1f, \"read_kernel_gbs\": %.1f, \"nominal_gbs\": %.0f, "
               "\"bytes\": %lld},\n", copy_gbs, read_gbs, kNominalGbs, (long long)ceiling_bytes);
  std::fprintf(f, "  \"experts\": %lld,\n  \"results\": [\n", (long long)kExperts);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "    {\"projection\": \"%s\", \"weights\": \"%s\", \"experts\": %lld, \"shared_rows\": %lld, \"k\": %lld, \"n\": %lld, \"rows\": %lld, "
                 "\"active_experts\": %lld, \"active_weight_bytes\": %lld, \"auto_plan\": %s, "
                 "\"auto_us\": {\"min\": %.2f, \"median\": %.2f, \"max\": %.2f}, \"auto_gbs\": %.1f, "
                 "\"auto_of_nominal\": %.3f, \"auto_of_read_kernel\": %.3f, \"auto_of_memcpy\": %.3f, "
                 "\"best_plan\": %s, \"best_us_median\": %.2f, \"best_gbs\": %.1f, \"ok\": %s}%s\n",
                 r.config.projection, r.config.fp8 ? "fp8" : "bf16", (long long)r.config.experts,
                 (long long)r.config.shared_rows, (long long)r.config.k, (long long)r.config.n,
                 (long long)r.config.rows, (long long)r.active, (long long)r.active_bytes, Json(r.auto_plan).c_str(),
                 r.auto_stats.min_us, r.auto_stats.median_us, r.auto_stats.max_us, r.auto_gbs,
                 r.auto_gbs / kNominalGbs, r.auto_gbs / read_gbs, r.auto_gbs / copy_gbs, Json(r.best_plan).c_str(),
                 r.best_stats.median_us, r.best_gbs, r.ok ? "true" : "false", i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("\nwrote %s\n", out_path);
  return all_ok ? 0 : 1;
}

// Standalone checker of the sparse MLA decode attention kernels (no XLA, no Python):
//   - CUDA vs the CPU implementation (sparse_attention_cpu.cc, the contract's arithmetic): the
//     outputs agree to rounding (the tensor core's order inside a dot product is its own);
//   - batch invariance: request i alone (b = 1) == request i inside batch b, bit for bit;
//   - source invariance: the same records read from a hot buffer by slot == from the device KV by
//     record id, bit for bit (hisparse == full-KV);
//   - plan invariance: the combine plan (two launches) == the cluster plan (merge on chip) == the
//     automatic choice, bit for bit (the choice follows the batch, the bits must not);
//   - invalid ids (-1, out of range) and the open page's mask; nothing valid gives zeros;
//   - guard bytes around the output and the workspace stay untouched.
// Usage: sparse_attention_cuda_check [--quick] [--quiet] [--seed N] [--only SUBSTRING]
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness.h"
#include "sparse_attention.h"
#include "sparse_attention_cuda.h"

namespace {

using hisparse::SparseAttentionPlan;
using hisparse::SparseAttentionShape;
constexpr int64_t W = hisparse::kSparseAttentionWidth, Dv = hisparse::kSparseAttentionValueWidth;

uint16_t ToBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct Case {
  std::string name;
  SparseAttentionShape shape;
  float scale = 0.1f;
  double invalid_frac = 0.0;    // ids set to -1
  double out_of_range = 0.0;    // ids set to >= N (treated as invalid)
  bool tail_all_invalid = false;
  bool all_invalid = false;     // every id -1 (and, with tail_all_invalid, zeros out)
  int invalid_chunk = -1;       // a whole chunk of -1
  float key_spread = 1.0f;      // magnitude of the keys (larger: peakier softmax)
  int32_t layer = 0;            // of shape.layers stacked sources (outside: no record is read)
};

struct Host {
  std::vector<uint16_t> q, source, tail;
  std::vector<int32_t> index;
  std::vector<uint8_t> tail_valid;
};

Host Make(const Case& c, harness::Rng& rng) {
  const auto& s = c.shape;
  Host h;
  h.q.resize(s.batch * s.heads * W);
  h.source.resize(s.layers * s.batch * s.records * s.page * W);
  h.tail.resize(s.batch * s.page * W);
  h.index.resize(s.batch * s.top_k);
  h.tail_valid.resize(s.batch * s.page);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : h.q) v = ToBf16(u(rng));
  for (auto& v : h.source) v = ToBf16(c.key_spread * u(rng));
  for (auto& v : h.tail) v = ToBf16(c.key_spread * u(rng));
  const int64_t chunk_records = s.top_k / hisparse::kSparseAttentionChunks;
  for (int64_t r = 0; r < s.batch; ++r) {
    // Distinct ids, as a top-k gives.
    std::vector<int32_t> perm(s.records);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < s.top_k; ++j) {
      int32_t id = perm[j % s.records];
      const double x = harness::Unit(rng);
      if (x < c.invalid_frac) id = -1;
      else if (x < c.invalid_frac + c.out_of_range) id = static_cast<int32_t>(s.records + (j % 3));
      if (c.all_invalid || (c.invalid_chunk >= 0 && j / chunk_records == c.invalid_chunk)) id = -1;
      h.index[r * s.top_k + j] = id;
    }
    for (int64_t t = 0; t < s.page; ++t)
      h.tail_valid[r * s.page + t] = c.tail_all_invalid ? 0 : (t == 0 || harness::Unit(rng) < 0.5);
  }
  return h;
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty()) CUDA_OK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Runs the kernels on `h` (request offset `first`, `count` requests), output between guards.
std::vector<float> RunGpu(const Case& c, const Host& h, int64_t first, int64_t count, bool* guards_ok,
                          SparseAttentionPlan plan = SparseAttentionPlan::kAuto) {
  SparseAttentionShape s = c.shape;
  s.batch = count;
  const auto& f = c.shape;
  auto slice = [&](const auto& v, int64_t per) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<T>(v.begin() + first * per, v.begin() + (first + count) * per);
  };
  uint16_t* q = Upload(slice(h.q, f.heads * W));
  std::vector<uint16_t> src_rows;  // every stacked layer's rows of the requests [first, first + count)
  const int64_t per = f.records * f.page * W;
  for (int64_t l = 0; l < f.layers; ++l)
    src_rows.insert(src_rows.end(), h.source.begin() + (l * f.batch + first) * per,
                    h.source.begin() + (l * f.batch + first + count) * per);
  uint16_t* src = Upload(src_rows);
  int32_t* layer = Upload(std::vector<int32_t>{c.layer});
  uint16_t* tail = Upload(slice(h.tail, f.page * W));
  int32_t* idx = Upload(slice(h.index, f.top_k));
  uint8_t* tv = Upload(slice(h.tail_valid, f.page));
  harness::DeviceBuffer<float> out(s.batch * s.heads * Dv);
  harness::DeviceBuffer<float> ws(hisparse::SparseAttentionWorkspaceBytes(s) / 4);
  CUDA_OK(hisparse::LaunchSparseAttention(s, c.scale, q, src, layer, idx, tail, tv, out.get(), ws.get(), 0, plan));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> r(s.batch * s.heads * Dv);
  CUDA_OK(cudaMemcpy(r.data(), out.get(), r.size() * 4, cudaMemcpyDeviceToHost));
  using DB = harness::DeviceBuffer<float>;
  auto guards = [](const DB& b) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(b.get());
    return harness::GuardsHold(p - DB::kGuardBytes, DB::kGuardBytes, p + b.bytes(), DB::kGuardBytes,
                               DB::kGuardByte);
  };
  *guards_ok = guards(out) && guards(ws);
  cudaFree(q), cudaFree(src), cudaFree(tail), cudaFree(idx), cudaFree(tv), cudaFree(layer);
  return r;
}

int failures = 0;

void Report(const harness::CheckOptions& o, const std::string& name, bool ok, const std::string& what) {
  if (!ok) ++failures;
  if (!ok || o.verbose) std::printf("%s %s: %s\n", ok ? "ok  " : "FAIL", name.c_str(), what.c_str());
}

// Both launch plans give the automatic choice's bits, for the whole batch.
void CheckPlans(const harness::CheckOptions& o, const Case& c, const Host& h, const std::vector<float>& auto_bits) {
#ifdef HISPARSE_SPARSE_ATTENTION_WGMMA
  // The wgmma build runs one kernel and the combine kernel for every plan: nothing to compare.
  (void)o, (void)c, (void)h, (void)auto_bits;
#else
  for (const auto& [plan, name] : {std::pair{SparseAttentionPlan::kCombine, "combine"},
                                   std::pair{SparseAttentionPlan::kCluster, "cluster"}}) {
    bool g = false;
    const std::vector<float> bits = RunGpu(c, h, 0, c.shape.batch, &g, plan);
    Report(o, c.name + "/plan-" + name, g && std::memcmp(bits.data(), auto_bits.data(), bits.size() * 4) == 0,
           std::string("the ") + name + " plan gives the automatic plan's bits");
  }
#endif
}

// CUDA vs CPU to rounding: |gpu - cpu| <= 2e-3 * max |cpu| of the head + 1e-6.
void CheckVsCpu(const harness::CheckOptions& o, const Case& c, harness::Rng& rng) {
  if (o.Skips(c.name)) return;
  if (const char* e = hisparse::SparseAttentionShapeError(c.shape)) {
    Report(o, c.name, false, std::string("bad case shape: ") + e);
    return;
  }
  const Host h = Make(c, rng);
  bool guards = false;
  const std::vector<float> gpu = RunGpu(c, h, 0, c.shape.batch, &guards);
  {
    // The same call again: the same bits (no arrival order, no race).
    bool g = false;
    const std::vector<float> again = RunGpu(c, h, 0, c.shape.batch, &g);
    Report(o, c.name + "/rerun", g && std::memcmp(again.data(), gpu.data(), gpu.size() * 4) == 0,
           "same bits from a second run");
  }
  CheckPlans(o, c, h, gpu);
  std::vector<float> cpu(gpu.size());
  hisparse::SparseAttentionCpu(c.shape, c.scale, h.q.data(), h.source.data(), c.layer, h.index.data(), h.tail.data(),
                               h.tail_valid.data(), cpu.data());
  double worst = 0;
  int64_t bad = 0, nonfinite = 0;
  for (int64_t row = 0; row < c.shape.batch * c.shape.heads; ++row) {
    double top = 0;
    for (int64_t i = 0; i < Dv; ++i) top = std::max(top, std::fabs(double(cpu[row * Dv + i])));
    for (int64_t i = 0; i < Dv; ++i) {
      const double g = gpu[row * Dv + i], r = cpu[row * Dv + i];
      if (!std::isfinite(g)) ++nonfinite;
      const double err = std::fabs(g - r) / (top + 1e-6);
      worst = std::max(worst, err);
      if (!(std::fabs(g - r) <= 2e-3 * top + 1e-6)) ++bad;
    }
  }
  const bool zeros_expected = c.all_invalid && c.tail_all_invalid;
  bool zeros_ok = true;
  if (zeros_expected)
    for (float v : gpu) zeros_ok &= (v == 0.f);
  Report(o, c.name, bad == 0 && nonfinite == 0 && guards && zeros_ok,
         harness::Format("vs CPU: worst |err| / max|ref| %.2e, %lld over tolerance, %lld non-finite, guards %s%s",
                         worst, (long long)bad, (long long)nonfinite, guards ? "intact" : "BROKEN",
                         zeros_expected ? (zeros_ok ? ", zeros" : ", NOT ZEROS") : ""));
}

// Request i alone == request i in the batch; hot buffer by slot == device KV by id; bit for bit.
void CheckInvariance(const harness::CheckOptions& o, const Case& c, harness::Rng& rng) {
  if (o.Skips(c.name)) return;
  const Host h = Make(c, rng);
  bool guards = false;
  const std::vector<float> full = RunGpu(c, h, 0, c.shape.batch, &guards);
  CheckPlans(o, c, h, full);
  const int64_t per = c.shape.heads * Dv;
  int64_t differing = 0;
  std::vector<int64_t> probe = {0, c.shape.batch - 1, c.shape.batch / 2};
  for (int64_t r : probe) {
    bool g2 = false;
    const std::vector<float> alone = RunGpu(c, h, r, 1, &g2);
    guards &= g2;
    if (std::memcmp(alone.data(), full.data() + r * per, per * 4) != 0) ++differing;
  }
  Report(o, c.name + "/batch-invariance", differing == 0 && guards,
         harness::Format("%lld of %zu probed requests differ from their batch-%lld bits", (long long)differing,
                         probe.size(), (long long)c.shape.batch));

  // The same selection as a hot buffer: slots in shuffled order hold the selected records.
  const auto& s = c.shape;
  const int64_t slots = std::max<int64_t>(s.top_k + 7, 1);
  Case hot = c;
  hot.shape.records = slots;
  Host hh = h;
  hh.source.assign(s.batch * slots * s.page * W, ToBf16(0.5f));
  for (int64_t r = 0; r < s.batch; ++r) {
    std::vector<int32_t> perm(slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < s.top_k; ++j) {
      const int32_t id = h.index[r * s.top_k + j];
      if (id < 0 || id >= s.records) {
        hh.index[r * s.top_k + j] = -1;
        continue;
      }
      const int32_t slot = perm[j];
      hh.index[r * s.top_k + j] = slot;
      std::memcpy(&hh.source[(r * slots + slot) * s.page * W], &h.source[(r * s.records + id) * s.page * W],
                  s.page * W * 2);
    }
  }
  bool g3 = false;
  const std::vector<float> via_slots = RunGpu(hot, hh, 0, s.batch, &g3);
  Report(o, c.name + "/source-invariance", std::memcmp(via_slots.data(), full.data(), full.size() * 4) == 0 && g3,
         "hot buffer by slot vs device KV by record id, whole batch");
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions o = harness::StartCheck(argc, argv, 2026);
  harness::Rng rng(o.seed);
  auto shape = [](int64_t b, int64_t H, int64_t k, int64_t P, int64_t N) {
    SparseAttentionShape s;
    s.batch = b, s.heads = H, s.top_k = k, s.page = P, s.records = N;
    return s;
  };
  std::vector<Case> cases;
  cases.push_back({"small-b2-h64-k512", shape(2, 64, 512, 1, 700), 0.1f});
  cases.push_back({"invalid-ids", shape(2, 64, 512, 1, 600), 0.1f, 0.3, 0.05});
  cases.push_back({"invalid-chunk", shape(1, 64, 512, 1, 600), 0.1f, 0.0, 0.0, false, false, 5});
  cases.push_back({"page4-tail-mask", shape(2, 64, 128, 4, 300), 0.1f, 0.1});
  cases.push_back({"peaky-scale2", shape(1, 64, 512, 1, 600), 2.0f, 0.1, 0.0, false, false, -1, 2.0f});
  cases.push_back({"nothing-valid", shape(1, 64, 512, 1, 600), 0.1f, 0.0, 0.0, true, true});
  cases.push_back({"only-tail-valid", shape(1, 64, 512, 1, 600), 0.1f, 0.0, 0.0, false, true});
  cases.push_back({"h128-k2048", shape(1, 128, 2048, 1, 4096), 0.0722f, 0.02});
  {
    Case stacked{"stacked-layer2of3", shape(2, 64, 512, 1, 600), 0.1f, 0.05};
    stacked.shape.layers = 3, stacked.layer = 2;
    cases.push_back(stacked);
    Case outside = stacked;
    outside.name = "layer-outside-reads-only-the-tail", outside.layer = 3;
    cases.push_back(outside);
  }
  // Chunks of many passes: passes issued inside the loop (the first two are issued before it).
  if (!o.quick) cases.push_back({"long-chunks-k8192", shape(1, 64, 8192, 1, 9000), 0.0722f, 0.02});
  // More units (chunk, 64 heads, request) than an H200's 132 SMs: blocks run several units in
  // turn, the next unit's loads issued during the previous one's last pass.
  cases.push_back({"units-b9-k256-p2-half-pass", shape(9, 64, 256, 2, 300), 0.1f, 0.1});
  if (!o.quick) cases.push_back({"units-b9-k2048", shape(9, 64, 2048, 1, 2100), 0.0722f, 0.02});
  cases.push_back({"page4-k1024-4passes", shape(1, 64, 1024, 4, 1500), 0.0722f, 0.05});
  if (!o.quick) cases.push_back({"h64-k2048-b3", shape(3, 64, 2048, 1, 8192), 0.0722f, 0.01});
  // The plans' boundary at 64 heads: the largest batch whose clusters (64 heads a block) all fit
  // one wave (auto: cluster) and one request more (auto: combine).
  const int fit = hisparse::SparseAttentionClustersAtOnce(4);
  std::printf("clusters of 16 blocks at once: %d (16 heads a block), %d (64 heads a block)\n",
              hisparse::SparseAttentionClustersAtOnce(1), fit);
  if (fit >= 1) {
    cases.push_back({"cluster-edge-b" + std::to_string(fit), shape(fit, 64, 512, 1, 600), 0.1f, 0.02});
    cases.push_back({"combine-edge-b" + std::to_string(fit + 1), shape(fit + 1, 64, 512, 1, 600), 0.1f, 0.02});
  }
  for (const Case& c : cases) CheckVsCpu(o, c, rng);

  std::vector<Case> inv;
  inv.push_back({"inv-b5-h64-k512", shape(5, 64, 512, 1, 1000), 0.1f, 0.05});
  if (!o.quick) {
    inv.push_back({"inv-b17-h64-k2048", shape(17, 64, 2048, 1, 4096), 0.0722f, 0.02});
    // Batch 2 (the cluster plan at 16 heads a block) against batch 1.
    inv.push_back({"inv-b2-h64-k2048", shape(2, 64, 2048, 1, 4096), 0.0722f, 0.02});
    inv.push_back({"inv-b4-h128-k2048-p2", shape(4, 128, 1024, 2, 2048), 0.0722f, 0.02});
    inv.push_back({"inv-b3-h64-k8192", shape(3, 64, 8192, 1, 9000), 0.0722f, 0.02});
  }
  for (const Case& c : inv) CheckInvariance(o, c, rng);
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}

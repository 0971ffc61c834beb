// Standalone checker of the lightning indexer kernels (ffi/indexer_kernels.cu;
// no XLA, no Python):
//   - every score within the contract's bound (ffi/indexer.h) of a double-
//     precision evaluation, -inf exactly from lengths[b] on (lengths 0, 1, tile
//     edges, T - 1, T, negative, past T);
//   - every launch (the general kernel, each register-q shape of
//     indexer_cuda.h) writes the automatic launch's bits (the wgmma kernel of
//     sm_90a builds: its own bits, within the same bound), and two runs the same;
//   - batch invariance: request i alone (b = 1) == request i inside its batch,
//     bit for bit, for every launch: a request's scores, so its top-k ids, do
//     not depend on the batch it runs in (the grid and the warps' tiles do);
//   - guard bytes around the scores stay untouched.
// Usage: indexer_cuda_check [--quick] [--quiet] [--seed N] [--only SUBSTRING]
//        (INDEXER_CHECK_LAUNCHES=mma or wgmma: see LaunchFilter)
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "harness.h"
#include "number_formats.h"
#include "indexer.h"
#include "indexer_cuda.h"

namespace {

using hisparse::IndexerDims;
using hisparse::IndexerKernel;
using hisparse::IndexerRegisterShape;
using hisparse::IndexerTuning;
using hisparse::IndexKeyType;
using hisparse::IndexQueryType;

int failures = 0;

void Report(const harness::CheckOptions& o, const std::string& name, bool ok, const std::string& what) {
  if (!ok) ++failures;
  if (!ok || o.verbose) std::printf("%s %s: %s\n", ok ? "ok  " : "FAIL", name.c_str(), what.c_str());
}

struct Case {
  std::string name;
  int64_t rows, tokens, heads, dim;
  IndexKeyType key_type = IndexKeyType::kFp8E4m3;
  IndexQueryType query_type = IndexQueryType::kBf16;
  IndexerDims dims() const {
    IndexerDims d;
    d.rows = rows;
    d.tokens = tokens;
    d.heads = heads;
    d.dim = dim;
    d.query_type = query_type;
    d.key_type = key_type;
    return d;
  }
  bool fp8() const { return key_type == IndexKeyType::kFp8E4m3; }
  bool f32_query() const { return query_type == IndexQueryType::kF32; }
};

using number_formats::Bf16ToFloat;
using number_formats::FloatToBf16;
using number_formats::Fp8ToDouble;

// Host operands of a case. Keys: bf16 values in [-1, 1), or every fp8 code but
// NaN (0x7f, 0xff; subnormals included) with scales in [2^-10, 1).
struct Host {
  std::vector<uint16_t> q16;
  std::vector<float> q32, w, scale;
  std::vector<uint16_t> k16;
  std::vector<uint8_t> k8;
  std::vector<int32_t> lengths;
};

Host Make(const Case& c, harness::Rng& rng) {
  Host h;
  const int64_t nq = c.rows * c.heads * c.dim, nk = c.rows * c.tokens * c.dim;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  if (c.f32_query()) {
    h.q32.resize(nq);
    for (auto& v : h.q32) v = 2.f * u(rng);
  } else {
    h.q16.resize(nq);
    for (auto& v : h.q16) v = FloatToBf16(2.f * u(rng));
  }
  h.w.resize(c.rows * c.heads);
  for (auto& v : h.w) v = u(rng) / std::sqrt(float(c.heads * c.dim));
  if (c.fp8()) {
    h.k8.resize(nk);
    for (auto& v : h.k8) {
      do v = static_cast<uint8_t>(harness::Uniform(rng, 0, 255));
      while ((v & 0x7f) == 0x7f);
    }
    h.scale.resize(c.rows * c.tokens);
    for (auto& v : h.scale) v = std::ldexp(1.0f + 0.5f * (u(rng) + 1.f), -static_cast<int>(harness::Uniform(rng, 1, 10)));
  } else {
    h.k16.resize(nk);
    for (auto& v : h.k16) v = FloatToBf16(u(rng));
  }
  const int32_t T = static_cast<int32_t>(c.tokens);
  const int32_t pattern[] = {T, 0, 1, 15, 16, 17, 31, 32, 33, T / 2 + 7, T - 1, -5, T + 100, 47, 64, 65};
  h.lengths.resize(c.rows);
  for (int64_t r = 0; r < c.rows; ++r) h.lengths[r] = pattern[r % (sizeof(pattern) / sizeof(pattern[0]))];
  if (c.rows > 2) h.lengths[c.rows - 1] = T;  // the last row full, so batch ends are exercised
  return h;
}

// Rows [row0, row0 + rows) of `h` on the GPU with `tuning`; the scores of
// those rows, and whether the guard bytes around them held.
std::vector<float> RunGpu(const Case& c, const Host& h, int64_t row0, int64_t rows, const IndexerTuning& tuning,
                          bool* guards, cudaError_t* launch) {
  Case sub = c;
  sub.rows = rows;
  const int64_t hd = c.heads * c.dim, td = c.tokens * c.dim;
  harness::DeviceBuffer<uint8_t> q(rows * hd * (c.f32_query() ? 4 : 2));
  harness::DeviceBuffer<float> w(rows * c.heads);
  harness::DeviceBuffer<uint8_t> keys(rows * td * (c.fp8() ? 1 : 2));
  harness::DeviceBuffer<float> scale(c.fp8() ? rows * c.tokens : 0);
  harness::DeviceBuffer<int32_t> lengths(rows);
  harness::DeviceBuffer<float> scores(rows * c.tokens);
  if (c.f32_query()) {
    q.Upload(reinterpret_cast<const uint8_t*>(h.q32.data() + row0 * hd));
  } else {
    q.Upload(reinterpret_cast<const uint8_t*>(h.q16.data() + row0 * hd));
  }
  w.Upload(h.w.data() + row0 * c.heads);
  if (c.fp8()) {
    keys.Upload(h.k8.data() + row0 * td);
    scale.Upload(h.scale.data() + row0 * c.tokens);
  } else {
    keys.Upload(reinterpret_cast<const uint8_t*>(h.k16.data() + row0 * td));
  }
  lengths.Upload(h.lengths.data() + row0);
  scores.Fill(0x7f);  // poison (3.4e38 per float): a token the kernel does not write fails the checks
  hisparse::IndexerBuffers io;
  io.query = q.get();
  io.weights = w.get();
  io.keys = keys.get();
  io.key_scale = c.fp8() ? scale.get() : nullptr;
  io.lengths = lengths.get();
  io.scores = scores.get();
  *launch = hisparse::LaunchIndexScores(sub.dims(), io, nullptr, tuning);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> out(rows * c.tokens);
  scores.Download(out.data());
  *guards = scores.GuardsIntact();
  return out;
}

// Which launches to check: INDEXER_CHECK_LAUNCHES=mma (all but the wgmma
// kernel's), =wgmma (the automatic one and the wgmma kernel's), unset: all. A
// fault in one kernel ends the process, so a first run can keep it apart.
const char* LaunchFilter() {
  const char* f = std::getenv("INDEXER_CHECK_LAUNCHES");
  return f ? f : "";
}

bool IsWgmma(IndexerRegisterShape s) { return s == IndexerRegisterShape::k64wg; }

// Every launch the operands admit (and LaunchFilter keeps): automatic first.
std::vector<std::pair<std::string, IndexerTuning>> Launches(const Case& c) {
  const std::string filter = LaunchFilter();
  std::vector<std::pair<std::string, IndexerTuning>> out = {{"auto", IndexerTuning{}}};
  IndexerTuning general;
  general.kernel = IndexerKernel::kGeneral;
  if (filter != "wgmma" && hisparse::IndexerRegisterQueryApplies(c.dims())) out.push_back({"general", general});
  const std::pair<const char*, IndexerRegisterShape> shapes[] = {{"16x8", IndexerRegisterShape::k16x8},
                                                                 {"32x8", IndexerRegisterShape::k32x8},
                                                                 {"16x16", IndexerRegisterShape::k16x16},
                                                                 {"32x12", IndexerRegisterShape::k32x12},
                                                                 {"64x6", IndexerRegisterShape::k64x6},
                                                                 {"64wg", IndexerRegisterShape::k64wg}};
  for (const auto& [name, shape] : shapes) {
    if (!hisparse::IndexerRegisterShapeApplies(c.dims(), shape)) continue;
    if ((filter == "mma" && IsWgmma(shape)) || (filter == "wgmma" && !IsWgmma(shape))) continue;
    IndexerTuning t;
    t.shape = shape;
    out.push_back({name, t});
  }
  return out;
}

// The exact scores (double precision) and the contract's bound per token:
// (n + H + 4) 2^-23 sum_h |w_h| sum_i |q_hi k_i s| (ffi/indexer.h); tokens
// past the row's length expect -inf (bound < 0 marks them).
struct Reference {
  std::vector<double> exact, bound;
};

Reference Exact(const Case& c, const Host& h) {
  Reference ref;
  ref.exact.assign(c.rows * c.tokens, 0.0);
  ref.bound.assign(c.rows * c.tokens, -1.0);
  const int64_t n = c.f32_query() ? 3 * c.dim : c.dim;
  std::vector<double> k(c.dim);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t limit = std::min<int64_t>(std::max<int64_t>(h.lengths[r], 0), c.tokens);
    for (int64_t t = 0; t < limit; ++t) {
      const int64_t key = (r * c.tokens + t) * c.dim;
      for (int64_t i = 0; i < c.dim; ++i) k[i] = c.fp8() ? Fp8ToDouble(h.k8[key + i]) : Bf16ToFloat(h.k16[key + i]);
      const double s = c.fp8() ? h.scale[r * c.tokens + t] : 1.0;
      double exact = 0, magnitude = 0;
      for (int64_t hh = 0; hh < c.heads; ++hh) {
        double dot = 0, mag = 0;
        for (int64_t i = 0; i < c.dim; ++i) {
          const int64_t qi = (r * c.heads + hh) * c.dim + i;
          const double qv = c.f32_query() ? h.q32[qi] : Bf16ToFloat(h.q16[qi]);
          dot += qv * k[i];
          mag += std::fabs(qv * k[i]);
        }
        const double w = h.w[r * c.heads + hh];
        exact += w * std::max(dot * s, 0.0);
        magnitude += std::fabs(w) * mag * std::fabs(s);
      }
      ref.exact[r * c.tokens + t] = exact;
      ref.bound[r * c.tokens + t] = (n + c.heads + 4) * 0x1p-23 * magnitude;
    }
  }
  return ref;
}

void CheckVsDouble(const harness::CheckOptions& o, const std::string& name, const Reference& ref,
                   const std::vector<float>& gpu) {
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const float got = gpu[i];
    if (ref.bound[i] < 0) {
      if (!(std::isinf(got) && got < 0)) ++bad;
      continue;
    }
    const double err = std::fabs(static_cast<double>(got) - ref.exact[i]);
    if (!(err <= ref.bound[i])) ++bad;
    if (ref.bound[i] > 0) worst = std::max(worst, err / ref.bound[i]);
  }
  Report(o, name + "/vs-double", bad == 0,
         harness::Format("%zu tokens, %lld outside the bound or the -inf rule, worst error / bound %.3f", gpu.size(),
                         (long long)bad, worst));
}

void RunCase(const harness::CheckOptions& o, const Case& c, harness::Rng& rng) {
  if (o.Skips(c.name)) return;
  if (const char* e = hisparse::IndexerSizeError(c.dims()); e[0] != '\0') {
    Report(o, c.name, false, std::string("bad case: ") + e);
    return;
  }
  const Host h = Make(c, rng);
  const Reference ref = Exact(c, h);
  bool guards = false;
  cudaError_t err = cudaSuccess;
  const std::vector<float> base = RunGpu(c, h, 0, c.rows, IndexerTuning{}, &guards, &err);
  Report(o, c.name + "/launch", err == cudaSuccess && guards,
         harness::Format("%s, guards %s", cudaGetErrorString(err), guards ? "intact" : "BROKEN"));
  if (err != cudaSuccess) return;
  // Batch invariance: a few rows alone (b = 1) against the batch, for every launch.
  std::vector<int64_t> alone = {0, c.rows - 1};
  if (c.rows > 4) alone.push_back(c.rows / 2);
  for (const auto& [name, tuning] : Launches(c)) {
    bool g = false, g2 = false;
    cudaError_t e = cudaSuccess, e2 = cudaSuccess;
    const std::vector<float> batch = RunGpu(c, h, 0, c.rows, tuning, &g, &e);
    const std::vector<float> again = RunGpu(c, h, 0, c.rows, tuning, &g2, &e2);
    const std::string label = c.name + "/" + name;
    Report(o, label + "/deterministic",
           e == cudaSuccess && e2 == cudaSuccess && g && g2 &&
               std::memcmp(batch.data(), again.data(), batch.size() * 4) == 0,
           harness::Format("two runs, the same bits, guards intact (%s)", cudaGetErrorString(e)));
    if (e != cudaSuccess) continue;
    CheckVsDouble(o, label, ref, batch);
    int64_t other_bits = 0;
    for (size_t i = 0; i < batch.size(); ++i) other_bits += std::memcmp(&batch[i], &base[i], 4) != 0;
    // The mma.sync kernels and shapes follow the same steps (indexer.h); wgmma's bits are its own.
    const bool own_bits = IsWgmma(tuning.shape);
    Report(o, label + "==auto", own_bits || other_bits == 0,
           harness::Format("%lld of %zu scores differ from the automatic launch's bits%s", (long long)other_bits,
                           batch.size(), own_bits ? " (allowed: wgmma's own order)" : ""));
    int64_t differing = 0;
    for (int64_t r : alone) {
      const std::vector<float> one = RunGpu(c, h, r, 1, tuning, &g, &e);
      if (e != cudaSuccess || !g ||
          std::memcmp(one.data(), batch.data() + r * c.tokens, c.tokens * 4) != 0)
        ++differing;
    }
    Report(o, label + "/batch-invariance", differing == 0,
           harness::Format("rows alone == the same rows in a batch of %lld (%lld of %zu differ)", (long long)c.rows,
                           (long long)differing, alone.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions o = harness::StartCheck(argc, argv, 20261204);
  harness::Rng rng(o.seed);
  using K = IndexKeyType;
  using Q = IndexQueryType;
  std::vector<Case> cases;
  if (o.quick) {
    cases = {
        {"glm5-fp8-b17-T300", 17, 300, 32, 128},
        {"dsv32-fp8-b3-T200", 3, 200, 64, 128},
        {"bf16-H24-b3-T150", 3, 150, 24, 128, K::kBf16},
        {"f32q-fp8-H40-d64-b2-T100", 2, 100, 40, 64, K::kFp8E4m3, Q::kF32},
    };
  } else {
    cases = {
        // The decode slices' shapes (GLM-5: H = 32; DeepSeek-V3.2: H = 64), T not a multiple of any tile.
        {"glm5-fp8-b2-T8200", 2, 8200, 32, 128},
        {"glm5-fp8-b17-T3000", 17, 3000, 32, 128},
        {"glm5-fp8-b41-T1100", 41, 1100, 32, 128},
        {"dsv32-fp8-b10-T2100", 10, 2100, 64, 128},
        {"glm5-bf16-b17-T1500", 17, 1500, 32, 128, K::kBf16},
        {"dsv32-bf16-b5-T1000", 5, 1000, 64, 128, K::kBf16},
        // Heads that are not a multiple of 8 (the register-q head check), small H, other d.
        {"fp8-H24-b5-T700", 5, 700, 24, 128},
        {"fp8-H20-b3-T500", 3, 500, 20, 128},
        {"fp8-H8-d64-b4-T600", 4, 600, 8, 64},
        {"bf16-H48-d96-b3-T400", 3, 400, 48, 96, K::kBf16},
        // The general kernel's own domain: float32 q, H > 64, d > 128.
        {"f32q-fp8-H32-b6-T900", 6, 900, 32, 128, K::kFp8E4m3, Q::kF32},
        {"fp8-H128-d256-b2-T300", 2, 300, 128, 256},
        {"bf16-H96-d160-b2-T300", 2, 300, 96, 160, K::kBf16},
    };
  }
  for (const Case& c : cases) RunCase(o, c, rng);
  std::printf("%s: %d failure%s\n", failures == 0 ? "PASSED" : "FAILED", failures, failures == 1 ? "" : "s");
  return failures == 0 ? 0 : 1;
}

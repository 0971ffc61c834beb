// The lightning indexer kernel (ffi/indexer_kernels.cu) on the GPU, against
// the HBM bandwidth measured in the same run.
//
// Ceilings: cudaMemcpy device-to-device of 2 GiB (reported as read + write
// bytes / time) and a read-only kernel over the same 2 GiB (16-byte loads,
// many blocks).
// Configurations: H = 64, d = 128, keys bf16 (256 B/token) and fp8 e4m3 with
// an f32 scale per token (132 B/token), T in {32768, 131072}, b in
// {1, 2, 8, 10, 16, 80}, lengths = T. Each configuration's launch is timed
// alone with CUDA events, --iters times (default 50) after 3 warm-ups, all
// queued behind a 20 ms spin kernel so the host's launch cost is not in the
// time; min / median / max. Successive iterations read different copies of
// the keys (rotating through >= 256 MiB of them), so small configurations are
// not served from L2. Key GB/s = key bytes (+ scales) / median time, also as a
// fraction of the read kernel's and of the memcpy's bandwidth.
// Every configuration is checked before it is timed: two runs give identical
// bits, the general kernel gives the same bits as the register-q kernel that
// the launcher picks for H = 64, d = 128 (indexer_cuda.h: both run the same
// tensor-core steps in the same order), and rows 0 and b - 1 (4096 tokens
// each) match a double-precision evaluation on the CPU within the contract's
// bound (ffi/indexer.h); a separate launch per kernel with lengths in {0, 1,
// 15, 16, 17, 31, 32, 33, T/2 + 7, T - 1, T} checks the -inf sentinel. A
// configuration that fails its check prints FAIL and the program exits 1 at
// the end: a wrong kernel cannot report a fast time.
// A sweep of the launch shape (kernel x warps per block x blocks per SM) at
// b = 8, T = 131072 shows whether the automatic choice is the fast one.
//
// Build (repository root):
//   make -C ffi/bench indexer
// Run (about a minute on an H200; prints Markdown, writes JSON):
//   build/indexer_bench results/indexer_bench.json
//   build/indexer_bench results/quick.json --quick     # b = 8, T = 32768 only, small buffers, no sweep
// The decode table (--decode): GLM-5's H = 32 (--heads), fp8 keys, b in {1, 2,
// 10, 17, 41} x T in {32K, 128K, 256K}, the automatic launch and every launch
// shape of indexer_cuda.h (--shapes to pick; --no-shapes: automatic only), each
// checked first (same bits as the automatic launch, within the bound on rows 0
// and b - 1), min / median / max us and the share of the HBM read kernel
// measured in the same run (and of the H200's nominal 4.3 TB/s); an mma.sync
// ceiling measured in the same run gives each row's tensor-core floor.
// --profile launches each configuration once (for ncu); --lengths L times
// shorter rows (0: the launch's fixed cost). Built against main's headers (no
// IndexerRegisterShape) it times the automatic launch only: the A/B.
//   build/indexer_bench results/decode.json --decode
//   build/indexer_bench results/decode_h64.json --decode --heads 64 --tokens 131072
// Under compute-sanitizer (memcheck, then racecheck: the shared-memory rings):
//   compute-sanitizer --tool memcheck --error-exitcode 3 build/indexer_bench /tmp/s.json --quick --iters 5
//   compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 build/indexer_bench /tmp/s.json --quick --iters 5
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "indexer.h"
#include "tests/number_formats.h"
#include "indexer_cuda.h"
#include "tests/harness.h"

namespace {

using harness::Mix;
using harness::Stats;
using harness::TimeLaunches;
using harness::Uniform;

using hisparse::IndexerBuffers;
using hisparse::IndexerDims;
using hisparse::IndexerKernel;
#ifdef HISPARSE_INDEXER_HAS_SHAPES
using hisparse::IndexerRegisterShape;
#endif
using hisparse::IndexerTuning;
using hisparse::IndexKeyType;
using hisparse::IndexQueryType;

int64_t g_heads = 64;  // H (--heads; the decode table defaults to 32, GLM-5's index heads)
constexpr int64_t kDim = 128;
constexpr int64_t kLengthsRows = 11;  // the -inf check's shape
constexpr int64_t kLengthsTokens = 32768;
constexpr int64_t kCheckTokens = 4096;        // per checked row
constexpr int64_t kRotateBytes = 256ll << 20;  // keys read by successive iterations, at least
constexpr int64_t kCeilingBytes = 2ll << 30;  // (--quick: 1/16 of it)

// ---------------------------------------------------------------------------
// Kernels of the benchmark itself.

__global__ void FillBf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16_rn(amplitude * Uniform(i, seed));
}

__global__ void FillF32(float* p, int64_t n, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = amplitude * Uniform(i, seed);
}

// DeepSeek's fp8 index keys: per token, scale = max |x| / 448, codes = x / scale in e4m3.
// One warp per token, kDim / 32 values per lane.
__global__ void QuantizeTokens(uint8_t* codes, float* scale, int64_t tokens, uint64_t seed) {
  const int64_t token = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (token >= tokens) return;
  float x[kDim / 32], amax = 0.0f;
  for (int i = 0; i < kDim / 32; ++i) {
    x[i] = Uniform(token * kDim + lane + 32 * i, seed);
    amax = fmaxf(amax, fabsf(x[i]));
  }
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float s = amax / 448.0f;
  for (int i = 0; i < kDim / 32; ++i)
    codes[token * kDim + lane + 32 * i] = __nv_cvt_float_to_fp8(s > 0 ? x[i] / s : 0.0f, __NV_SATFINITE, __NV_E4M3);
  if (lane == 0) scale[token] = s;
}

// The tensor cores' mma.sync ceiling: each warp runs kMmaChains independent
// accumulator chains of m16n8k16 bf16 -> f32 (operands in registers, nothing
// read from memory); the sum is written so nothing is optimized away.
constexpr int kMmaChains = 8;
constexpr int kMmaIters = 2048;

__global__ void MmaCeiling(float* out) {
  uint32_t a[4], b0 = 0x3f803f80u ^ threadIdx.x, b1 = 0x3f003f00u ^ threadIdx.x;
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u + 17u * (threadIdx.x + i);
  float acc[kMmaChains][4] = {};
  for (int it = 0; it < kMmaIters; ++it) {
#pragma unroll
    for (int c = 0; c < kMmaChains; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
  float sum = 0;
  for (int c = 0; c < kMmaChains; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// TFLOP/s of MmaCeiling over `sms` x 2 blocks of 8 warps (median of 5 runs after a warm-up).
double MeasureMmaCeiling(cudaStream_t stream, int sms) {
  const int blocks = 2 * sms, threads = 256;
  float* out = nullptr;
  CUDA_OK(cudaMalloc(&out, blocks * threads * sizeof(float)));
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int rep = 0; rep < 6; ++rep) {
    CUDA_OK(cudaEventRecord(start, stream));
    MmaCeiling<<<blocks, threads, 0, stream>>>(out);
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0) us.push_back(ms * 1e3);
  }
  CUDA_OK(cudaFree(out));
  const double flop = 2.0 * 16 * 8 * 16 * kMmaChains * kMmaIters * (blocks * threads / 32.0);
  return flop / (harness::Summarize(us).median_us * 1e-6) / 1e12;
}

// ---------------------------------------------------------------------------
// Host side.

using number_formats::Bf16ToFloat;
using number_formats::Fp8ToDouble;

struct Buffers {
  int64_t max_rows = 0, max_tokens = 0;
  __nv_bfloat16* query = nullptr;  // [max_rows, H, d]
  float* weights = nullptr;        // [max_rows, H]
  __nv_bfloat16* keys_bf16 = nullptr;
  uint8_t* keys_fp8 = nullptr;
  float* scales = nullptr;
  int64_t bf16_tokens = 0, fp8_tokens = 0;  // tokens each key buffer holds
  int32_t* lengths = nullptr;               // [max_rows]
  float* scores = nullptr;                  // [max_rows, max_tokens]
  std::vector<uint16_t> host_query;
  std::vector<float> host_weights;
};

struct Config {
  IndexKeyType key_type;
  int64_t rows, tokens;
  const char* name() const { return key_type == IndexKeyType::kFp8E4m3 ? "fp8" : "bf16"; }
  int64_t token_bytes() const { return key_type == IndexKeyType::kFp8E4m3 ? kDim + 4 : 2 * kDim; }
  int64_t key_bytes() const { return rows * tokens * token_bytes(); }
  IndexerDims dims() const {
    IndexerDims d;
    d.rows = rows;
    d.tokens = tokens;
    d.heads = g_heads;
    d.dim = kDim;
    d.query_type = IndexQueryType::kBf16;
    d.key_type = key_type;
    return d;
  }
};

// The buffers of one launch, reading copy `slot` of the keys.
IndexerBuffers Io(const Buffers& b, const Config& c, int64_t slot) {
  IndexerBuffers io;
  io.query = b.query;
  io.weights = b.weights;
  io.lengths = b.lengths;
  io.scores = b.scores;
  const int64_t tokens = c.rows * c.tokens;
  if (c.key_type == IndexKeyType::kFp8E4m3) {
    io.keys = b.keys_fp8 + slot * tokens * kDim;
    io.key_scale = b.scales + slot * tokens;
  } else {
    io.keys = b.keys_bf16 + slot * tokens * kDim;
  }
  return io;
}

int64_t Slots(const Buffers& b, const Config& c) {
  const int64_t held = (c.key_type == IndexKeyType::kFp8E4m3 ? b.fp8_tokens : b.bf16_tokens) / (c.rows * c.tokens);
  const int64_t wanted = (kRotateBytes + c.key_bytes() - 1) / c.key_bytes();
  return std::max<int64_t>(1, std::min(held, wanted));
}

void SetLengths(const Buffers& b, const std::vector<int32_t>& lengths) {
  CUDA_OK(cudaMemcpy(b.lengths, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice));
}

struct Check {
  double worst = 0;      // max |error| / bound over the checked tokens
  int64_t checked = 0;   // tokens compared
  int64_t failures = 0;  // tokens outside the bound, or with the wrong sentinel
  bool deterministic = true;
  bool kernels_agree = true;  // the general kernel's bits equal the automatic kernel's
};

const char* KernelName(const IndexerDims& d, IndexerKernel kernel) {
  if (kernel == IndexerKernel::kGeneral) return "general";
  return hisparse::IndexerRegisterQueryApplies(d) ? "register-q" : "general";
}

// Rows `rows` of the last launch's scores against double precision, on kCheckTokens tokens each.
void CheckRows(const Buffers& b, const Config& c, const std::vector<int32_t>& lengths,
               const std::vector<int64_t>& rows, Check* out) {
  const bool fp8 = c.key_type == IndexKeyType::kFp8E4m3;
  std::vector<float> scores(c.tokens);
  std::vector<uint16_t> keys16(fp8 ? 0 : c.tokens * kDim);
  std::vector<uint8_t> keys8(fp8 ? c.tokens * kDim : 0);
  std::vector<float> scale(fp8 ? c.tokens : 0);
  for (int64_t row : rows) {
    CUDA_OK(cudaMemcpy(scores.data(), b.scores + row * c.tokens, c.tokens * 4, cudaMemcpyDeviceToHost));
    if (fp8) {
      CUDA_OK(cudaMemcpy(keys8.data(), b.keys_fp8 + row * c.tokens * kDim, keys8.size(), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(scale.data(), b.scales + row * c.tokens, c.tokens * 4, cudaMemcpyDeviceToHost));
    } else {
      CUDA_OK(cudaMemcpy(keys16.data(), b.keys_bf16 + row * c.tokens * kDim, keys16.size() * 2,
                         cudaMemcpyDeviceToHost));
    }
    std::vector<double> q(g_heads * kDim), w(g_heads);
    for (int64_t i = 0; i < g_heads * kDim; ++i) q[i] = Bf16ToFloat(b.host_query[row * g_heads * kDim + i]);
    for (int64_t h = 0; h < g_heads; ++h) w[h] = b.host_weights[row * g_heads + h];
    for (int64_t j = 0; j < kCheckTokens; ++j) {
      // The first and last 1024 tokens, and 2048 spread over the row.
      const int64_t spread = static_cast<int64_t>(Mix(row * 7919 + j) % static_cast<uint64_t>(c.tokens));
      const int64_t t = j < 1024 ? j : j < 2048 ? c.tokens - 2048 + j : spread;
      if (t < 0 || t >= c.tokens) continue;
      ++out->checked;
      if (t >= lengths[row]) {
        if (!(std::isinf(scores[t]) && scores[t] < 0)) ++out->failures;
        continue;
      }
      double k[kDim], s = fp8 ? scale[t] : 1.0;
      for (int64_t i = 0; i < kDim; ++i)
        k[i] = fp8 ? Fp8ToDouble(keys8[t * kDim + i]) : Bf16ToFloat(keys16[t * kDim + i]);
      double exact = 0, magnitude = 0;
      for (int64_t h = 0; h < g_heads; ++h) {
        double dot = 0, mag = 0;
        for (int64_t i = 0; i < kDim; ++i) {
          dot += q[h * kDim + i] * k[i];
          mag += std::fabs(q[h * kDim + i] * k[i]);
        }
        exact += w[h] * std::max(dot * s, 0.0);
        magnitude += std::fabs(w[h]) * mag * std::fabs(s);
      }
      const double bound = (kDim + g_heads + 4) * 0x1p-23 * magnitude;
      const double err = std::fabs(static_cast<double>(scores[t]) - exact);
      if (!(err <= bound)) ++out->failures;
      if (bound > 0) out->worst = std::max(out->worst, err / bound);
      else if (err > 0) out->worst = INFINITY;
    }
  }
}

Check CheckConfig(const Buffers& b, const Config& c, cudaStream_t stream) {
  Check check;
  std::vector<int32_t> lengths(c.rows, static_cast<int32_t>(c.tokens));
  SetLengths(b, lengths);
  const IndexerBuffers io = Io(b, c, 0);
  const int64_t n = c.rows * c.tokens;
  std::vector<uint32_t> first(n), second(n);
  CUDA_OK(hisparse::LaunchIndexScores(c.dims(), io, stream));
  CUDA_OK(cudaMemcpyAsync(first.data(), b.scores, n * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaMemsetAsync(b.scores, 0xff, n * 4, stream));
  CUDA_OK(hisparse::LaunchIndexScores(c.dims(), io, stream));
  CUDA_OK(cudaMemcpyAsync(second.data(), b.scores, n * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  check.deterministic = first == second;
  if (hisparse::IndexerRegisterQueryApplies(c.dims())) {
    IndexerTuning general;
    general.kernel = IndexerKernel::kGeneral;
    CUDA_OK(cudaMemsetAsync(b.scores, 0xff, n * 4, stream));
    CUDA_OK(hisparse::LaunchIndexScores(c.dims(), io, stream, general));
    CUDA_OK(cudaMemcpyAsync(second.data(), b.scores, n * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    check.kernels_agree = first == second;
    // Leave the automatic kernel's scores for the CPU comparison.
    CUDA_OK(cudaMemcpy(b.scores, first.data(), n * 4, cudaMemcpyHostToDevice));
  }
  CheckRows(b, c, lengths, {0, c.rows - 1}, &check);
  return check;
}

// The -inf sentinel at lengths inside and at the edges of both kernels' tiles (16 and 32 tokens).
Check CheckLengths(const Buffers& b, IndexKeyType key_type, IndexerKernel kernel, cudaStream_t stream) {
  Config c{key_type, kLengthsRows, kLengthsTokens};
  const int32_t T = static_cast<int32_t>(c.tokens);
  std::vector<int32_t> lengths = {0, 1, 15, 16, 17, 31, 32, 33, T / 2 + 7, T - 1, T};
  SetLengths(b, lengths);
  IndexerTuning tuning;
  tuning.kernel = kernel;
  CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, 0), stream, tuning));
  CUDA_OK(cudaStreamSynchronize(stream));
  Check check;
  std::vector<int64_t> rows(c.rows);
  for (int64_t r = 0; r < c.rows; ++r) rows[r] = r;
  CheckRows(b, c, lengths, rows, &check);
  return check;
}

struct Result {
  Config config{IndexKeyType::kBf16, 0, 0};
  IndexerTuning tuning;
  Stats stats;
  Check check;
  double gbs = 0;
};

// lengths < 0: every row's length is T.
Result Measure(const Buffers& b, const Config& c, const IndexerTuning& tuning, int iters, cudaStream_t stream,
               int64_t lengths = -1) {
  Result r;
  r.config = c;
  r.tuning = tuning;
  SetLengths(b, std::vector<int32_t>(c.rows, static_cast<int32_t>(lengths < 0 ? c.tokens : std::min(lengths, c.tokens))));
  const int64_t slots = Slots(b, c);
  r.stats = TimeLaunches(stream, iters, [&](int i) {
    CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, i % slots), stream, tuning));
  });
  r.gbs = c.key_bytes() / (r.stats.median_us * 1e3);
  return r;
}

// ---------------------------------------------------------------------------
// The decode table (--decode): the batches of the decode slices (1, 2, 10, 17,
// 41 requests) x 32K-256K keys each, fp8 keys, H = --heads (32: GLM-5's index
// heads). Each configuration is checked first (two runs give the same bits,
// every register-q shape gives the automatic launch's bits, rows 0 and b - 1
// are within the bound of a double-precision evaluation), then the automatic
// launch and every shape that the operands admit are timed.

constexpr double kNominalHbmGbs = 4300.0;  // the H200's HBM read bandwidth the issue measures against

#ifdef HISPARSE_INDEXER_HAS_SHAPES
constexpr IndexerRegisterShape kShapes[] = {IndexerRegisterShape::k16x8, IndexerRegisterShape::k32x8,
                                            IndexerRegisterShape::k16x16, IndexerRegisterShape::k32x12,
                                            IndexerRegisterShape::k64x6, IndexerRegisterShape::k64wg};
const char* ShapeName(IndexerRegisterShape s) {
  switch (s) {
    case IndexerRegisterShape::k16x8:
      return "16x8";
    case IndexerRegisterShape::k32x8:
      return "32x8";
    case IndexerRegisterShape::k16x16:
      return "16x16";
    case IndexerRegisterShape::k32x12:
      return "32x12";
    case IndexerRegisterShape::k64x6:
      return "64x6";
    case IndexerRegisterShape::k64wg:
      return "64wg";
    default:
      return "auto";
  }
}
#endif

struct DecodeResult {
  Config config{IndexKeyType::kFp8E4m3, 0, 0};
  std::string shape;
  Stats stats;
  double gbs = 0;
};

struct DecodeOptions {
  bool quick = false;    // b in {2, 17}, T = 4096
  bool shapes = true;    // check and time every register-q shape, not only the automatic launch
  bool profile = false;  // one launch per configuration and shape, nothing checked or timed (under ncu)
  std::string only;      // --shapes NAME,NAME: only these shapes (and the automatic launch unless "noauto" is named)
  int64_t lengths = -1;  // --lengths L: time with every row's length min(L, T) (0: the launch's fixed cost); -1: T
  std::vector<int64_t> rows, tokens;  // empty: the decode lists
};

// Whether `name` is in the comma-separated `list` (an empty list wants every name).
bool Wanted(const std::string& list, const std::string& name) {
  if (list.empty()) return true;
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

bool AutoWanted(const DecodeOptions& o) { return o.only.empty() || !Wanted(o.only, "noauto"); }

int RunDecode(const char* json_path, int iters, const DecodeOptions& o, const harness::DeviceInfo& info,
              cudaStream_t stream) {
  const bool quick = o.quick, shapes = o.shapes;
  std::vector<int64_t> rows_list = quick ? std::vector<int64_t>{2, 17} : std::vector<int64_t>{1, 2, 10, 17, 41};
  std::vector<int64_t> tokens_list = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{32768, 131072, 262144};
  if (!o.rows.empty()) rows_list = o.rows;
  if (!o.tokens.empty()) tokens_list = o.tokens;
  // This GPU's HBM read kernel, before the keys take the memory: the share the issue's target
  // (>= 75% of HBM read bandwidth) asks for, beside the H200's nominal 4.3 TB/s.
  double read_gbs = 0;
  if (!o.profile) {
    const int64_t ceiling_bytes = quick ? kCeilingBytes / 16 : kCeilingBytes;
    read_gbs = harness::MeasureHbmCeilingsOver(stream, ceiling_bytes, info.prop.multiProcessorCount, [&](uint8_t* src) {
                 FillF32<<<4 * info.prop.multiProcessorCount, 256, 0, stream>>>(reinterpret_cast<float*>(src),
                                                                                 ceiling_bytes / 4, 1, 1.0f);
               }).read_gbs;
    std::printf("HBM: read kernel over %lld MiB %.0f GB/s (median)\n\n", (long long)(ceiling_bytes >> 20), read_gbs);
  }
  Buffers b;
  b.max_rows = std::max(kLengthsRows, *std::max_element(rows_list.begin(), rows_list.end()));
  b.max_tokens = std::max(kLengthsTokens, *std::max_element(tokens_list.begin(), tokens_list.end()));
  b.bf16_tokens = 0;
  // Every configuration's keys, and >= kRotateBytes of them for the small ones (rotating copies).
  b.fp8_tokens = std::max<int64_t>(b.max_rows * b.max_tokens, quick ? 0 : kRotateBytes / (kDim + 4) + b.max_tokens);
  CUDA_OK(cudaMalloc(&b.query, b.max_rows * g_heads * kDim * 2));
  CUDA_OK(cudaMalloc(&b.weights, b.max_rows * g_heads * 4));
  CUDA_OK(cudaMalloc(&b.keys_fp8, b.fp8_tokens * kDim));
  CUDA_OK(cudaMalloc(&b.scales, b.fp8_tokens * 4));
  CUDA_OK(cudaMalloc(&b.lengths, b.max_rows * 4));
  CUDA_OK(cudaMalloc(&b.scores, b.max_rows * b.max_tokens * 4));
  const int grid = 8 * info.prop.multiProcessorCount;
  FillBf16<<<grid, 256, 0, stream>>>(b.query, b.max_rows * g_heads * kDim, 11, 2.0f);
  FillF32<<<grid, 256, 0, stream>>>(b.weights, b.max_rows * g_heads, 12, 1.0f / std::sqrt(float(g_heads * kDim)));
  QuantizeTokens<<<(b.fp8_tokens * 32 + 255) / 256, 256, 0, stream>>>(b.keys_fp8, b.scales, b.fp8_tokens, 14);
  CUDA_OK(cudaGetLastError());
  b.host_query.resize(b.max_rows * g_heads * kDim);
  b.host_weights.resize(b.max_rows * g_heads);
  CUDA_OK(cudaMemcpyAsync(b.host_query.data(), b.query, b.host_query.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaMemcpyAsync(b.host_weights.data(), b.weights, b.host_weights.size() * 4, cudaMemcpyDeviceToHost,
                          stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  if (o.profile) {
    for (int64_t tokens : tokens_list) {
      for (int64_t rows : rows_list) {
        const Config c{IndexKeyType::kFp8E4m3, rows, tokens};
        SetLengths(b, std::vector<int32_t>(rows, static_cast<int32_t>(tokens)));
        if (AutoWanted(o)) CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, 0), stream));
#ifdef HISPARSE_INDEXER_HAS_SHAPES
        for (IndexerRegisterShape s : kShapes) {
          if (!shapes || !Wanted(o.only, ShapeName(s)) || !hisparse::IndexerRegisterShapeApplies(c.dims(), s))
            continue;
          IndexerTuning t;
          t.shape = s;
          CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, 0), stream, t));
        }
#endif
        CUDA_OK(cudaStreamSynchronize(stream));
        std::printf("profiled launches: b = %lld, T = %lld\n", (long long)rows, (long long)tokens);
      }
    }
    return 0;
  }
  const double mma_tflops = MeasureMmaCeiling(stream, info.prop.multiProcessorCount);
  std::printf("mma.sync m16n8k16 bf16 -> f32 ceiling (16 warps per SM, %d independent chains each): %.0f TFLOP/s; "
              "'MMA floor' below = b T H d 2 flop at that rate\n\n",
              kMmaChains, mma_tflops);
  bool all_ok = true;
  std::vector<DecodeResult> results;
  const std::string timed_lengths = o.lengths < 0 ? "T" : harness::Format("min(%lld, T) (GB/s and share still "
                                                                             "count all T keys)", (long long)o.lengths);
  std::printf("Decode batches, fp8 keys + f32 scale (132 B/token at d = 128), H = %lld, lengths = %s; share = key "
              "GB/s / the read kernel's %.0f GB/s, and / %.0f GB/s (the H200's nominal HBM)\n\n| b | T | key MB | shape | "
              "min us | median us | max us | GB/s | of read kernel | of 4.3 TB/s | MMA floor us | check |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
              (long long)g_heads, timed_lengths.c_str(), read_gbs, kNominalHbmGbs);
  for (int64_t tokens : tokens_list) {
    for (int64_t rows : rows_list) {
      const Config c{IndexKeyType::kFp8E4m3, rows, tokens};
      Check check = CheckConfig(b, c, stream);
      bool shapes_agree = true;
      std::vector<std::pair<std::string, IndexerTuning>> launches;
      if (AutoWanted(o)) launches.push_back({"auto", IndexerTuning{}});
#ifdef HISPARSE_INDEXER_HAS_SHAPES
      if (shapes) {
        const int64_t n = c.rows * c.tokens;
        std::vector<uint32_t> first(n), other(n);
        CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, 0), stream));
        CUDA_OK(cudaMemcpyAsync(first.data(), b.scores, n * 4, cudaMemcpyDeviceToHost, stream));
        for (IndexerRegisterShape s : kShapes) {
          if (!Wanted(o.only, ShapeName(s)) || !hisparse::IndexerRegisterShapeApplies(c.dims(), s)) continue;
          IndexerTuning t;
          t.shape = s;
          launches.push_back({ShapeName(s), t});
          CUDA_OK(cudaMemsetAsync(b.scores, 0xff, n * 4, stream));
          CUDA_OK(hisparse::LaunchIndexScores(c.dims(), Io(b, c, 0), stream, t));
          CUDA_OK(cudaMemcpyAsync(other.data(), b.scores, n * 4, cudaMemcpyDeviceToHost, stream));
          CUDA_OK(cudaStreamSynchronize(stream));
          if (other != first) {
            int64_t differ = 0;
            for (int64_t i = 0; i < n; ++i) differ += other[i] != first[i];
            // wgmma's order inside a k-step is its own: its bits may differ, its error may not.
            Check own;
            const bool wgmma = s == IndexerRegisterShape::k64wg;
            if (wgmma) CheckRows(b, c, std::vector<int32_t>(rows, tokens), {0, rows - 1}, &own);
            const bool allowed = wgmma && own.failures == 0;
            shapes_agree = shapes_agree && allowed;
            std::printf("%s: shape %s writes other bits than the automatic launch at %lld of %lld tokens (b = %lld, "
                        "T = %lld)%s\n",
                        allowed ? "note" : "FAIL", ShapeName(s), (long long)differ, (long long)n, (long long)rows,
                        (long long)tokens,
                        allowed ? harness::Format("; within the bound on rows 0 and b - 1 (worst %.3f)", own.worst).c_str()
                                : "");
          }
        }
      }
#else
      (void)shapes;
#endif
      const bool ok = check.failures == 0 && check.deterministic && check.kernels_agree && shapes_agree;
      all_ok = all_ok && ok;
      for (const auto& [name, tuning] : launches) {
        const Result r = Measure(b, c, tuning, iters, stream, o.lengths);
        results.push_back({c, name, r.stats, r.gbs});
        const double mma_floor_us = 2.0 * rows * tokens * g_heads * kDim / (mma_tflops * 1e6);
        std::printf("| %lld | %lld | %.1f | %s | %.1f | %.1f | %.1f | %.0f | %.2f | %.2f | %.1f | %s |\n", (long long)rows,
                    (long long)tokens, c.key_bytes() / 1e6, name.c_str(), r.stats.min_us, r.stats.median_us,
                    r.stats.max_us, r.gbs, r.gbs / read_gbs, r.gbs / kNominalHbmGbs, mma_floor_us, ok ? "ok" : "FAIL");
        std::fflush(stdout);
      }
    }
  }
  FILE* f = harness::OpenJson(json_path);
  std::fprintf(f, "{\n  \"device\": \"%s\", \"sms\": %d, \"heads\": %lld, \"dim\": %lld, \"iters\": %d, "
               "\"nominal_hbm_gbs\": %.0f, \"read_kernel_gbs\": %.1f, \"mma_sync_tflops\": %.1f,\n  \"decode\": [\n",
               info.prop.name, info.prop.multiProcessorCount, (long long)g_heads, (long long)kDim, iters,
               kNominalHbmGbs, read_gbs, mma_tflops);
  for (size_t i = 0; i < results.size(); ++i) {
    const DecodeResult& r = results[i];
    std::fprintf(f,
                 "    {\"b\": %lld, \"T\": %lld, \"key_bytes\": %lld, \"shape\": \"%s\", \"us_min\": %.2f, "
                 "\"us_median\": %.2f, \"us_max\": %.2f, \"gbs\": %.1f, \"share_of_read_kernel\": %.4f, "
                 "\"share_of_4300\": %.4f}%s\n",
                 (long long)r.config.rows, (long long)r.config.tokens, (long long)r.config.key_bytes(),
                 r.shape.c_str(), r.stats.min_us, r.stats.median_us, r.stats.max_us, r.gbs, r.gbs / read_gbs,
                 r.gbs / kNominalHbmGbs, i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ],\n  \"all_checks_passed\": %s\n}\n", all_ok ? "true" : "false");
  std::fclose(f);
  std::printf("\nJSON: %s; checks %s\n", json_path, all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: %s OUT.json [--quick] [--iters N] [--no-sweep]\n"
      "       %s OUT.json --decode [--quick] [--iters N] [--heads H] [--no-shapes] [--rows B,B..] [--tokens T,T..] "
      "[--profile] [--shapes NAME,..[,noauto]] [--lengths L]\n";
  if (argc < 2) {
    std::fprintf(stderr, kUsage, argv[0], argv[0]);
    return 2;
  }
  const char* json_path = argv[1];
  bool quick = false, sweep = true, decode = false;
  DecodeOptions decode_options;
  auto list = [](const char* text) {
    std::vector<int64_t> out;
    for (const char* p = text; *p;) {
      char* end = nullptr;
      const long long v = std::strtoll(p, &end, 10);
      if (end == p || v < 1) return std::vector<int64_t>{};
      out.push_back(v);
      p = *end == ',' ? end + 1 : end;
      if (*end != ',' && *end != '\0') return std::vector<int64_t>{};
    }
    return out;
  };
  int iters = 50;
  int64_t heads = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      sweep = false;
    } else if (a == "--no-sweep") {
      sweep = false;
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(5, std::atoi(argv[++i]));
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--no-shapes") {
      decode_options.shapes = false;
    } else if (a == "--profile") {
      decode_options.profile = true;
    } else if (a == "--shapes" && i + 1 < argc) {
      decode_options.only = argv[++i];
    } else if (a == "--lengths" && i + 1 < argc) {
      decode_options.lengths = std::atoll(argv[++i]);
      if (decode_options.lengths < 0) {
        std::fprintf(stderr, "--lengths must be >= 0\n");
        return 2;
      }
    } else if ((a == "--rows" || a == "--tokens") && i + 1 < argc) {
      std::vector<int64_t>& dst = a == "--rows" ? decode_options.rows : decode_options.tokens;
      dst = list(argv[++i]);
      if (dst.empty()) {
        std::fprintf(stderr, "%s takes positive integers separated by commas, e.g. 2,17\n", a.c_str());
        return 2;
      }
    } else if (a == "--heads" && i + 1 < argc) {
      heads = std::atoll(argv[++i]);
      if (heads < 1 || heads > 128) {
        std::fprintf(stderr, "--heads must be in [1, 128] (the kernel's H)\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, kUsage, argv[0], argv[0]);
      return 2;
    }
  }
  g_heads = heads > 0 ? heads : decode ? 32 : 64;
  const harness::DeviceInfo info = harness::QueryDevice();
  if (decode) {
    std::printf("# Lightning indexer benchmark, decode batches\n\ndevice: %s; H = %lld, d = %lld, q bf16; %d "
                "iterations (min / median / max)\n\n",
                harness::DeviceLine(info).c_str(), (long long)g_heads, (long long)kDim, iters);
    cudaStream_t decode_stream;
    CUDA_OK(cudaStreamCreateWithFlags(&decode_stream, cudaStreamNonBlocking));
    decode_options.quick = quick;
    return RunDecode(json_path, iters, decode_options, info, decode_stream);
  }
  std::printf("# Lightning indexer benchmark\n\ndevice: %s; H = %lld, d = %lld, q bf16, lengths = T; %d iterations "
              "(min / median / max)\n\n", harness::DeviceLine(info).c_str(), (long long)g_heads, (long long)kDim, iters);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // --- HBM ceilings ---------------------------------------------------------
  const int64_t ceiling_bytes = quick ? kCeilingBytes / 16 : kCeilingBytes;
  const harness::HbmCeilings hbm =
      harness::MeasureHbmCeilingsOver(stream, ceiling_bytes, info.prop.multiProcessorCount, [&](uint8_t* src) {
        FillF32<<<4 * info.prop.multiProcessorCount, 256, 0, stream>>>(reinterpret_cast<float*>(src),
                                                                        ceiling_bytes / 4, 1, 1.0f);
      });
  const double copy_gbs = hbm.copy_gbs, read_gbs = hbm.read_gbs;
  std::printf("HBM: memcpy D2D of %.0f MiB %.0f GB/s (read + write), read kernel over it %.0f GB/s "
              "(medians)\n\n", ceiling_bytes / 1048576.0, copy_gbs, read_gbs);

  // --- inputs ---------------------------------------------------------------
  const std::vector<int64_t> rows_list = quick ? std::vector<int64_t>{8} : std::vector<int64_t>{1, 2, 8, 10, 16, 80};
  const std::vector<int64_t> tokens_list =
      quick ? std::vector<int64_t>{32768} : std::vector<int64_t>{32768, 131072};
  Buffers b;
  b.max_rows = std::max(kLengthsRows, *std::max_element(rows_list.begin(), rows_list.end()));
  b.max_tokens = std::max(kLengthsTokens, *std::max_element(tokens_list.begin(), tokens_list.end()));
  b.bf16_tokens = b.max_rows * b.max_tokens;  // 2.7 GB at b = 80, T = 131072
  b.fp8_tokens = b.max_rows * b.max_tokens;   // 1.3 GB + 42 MB of scales
  const int64_t kMaxRows = b.max_rows, kMaxTokens = b.max_tokens;
  CUDA_OK(cudaMalloc(&b.query, kMaxRows * g_heads * kDim * 2));
  CUDA_OK(cudaMalloc(&b.weights, kMaxRows * g_heads * 4));
  CUDA_OK(cudaMalloc(&b.keys_bf16, b.bf16_tokens * kDim * 2));
  CUDA_OK(cudaMalloc(&b.keys_fp8, b.fp8_tokens * kDim));
  CUDA_OK(cudaMalloc(&b.scales, b.fp8_tokens * 4));
  CUDA_OK(cudaMalloc(&b.lengths, kMaxRows * 4));
  CUDA_OK(cudaMalloc(&b.scores, kMaxRows * kMaxTokens * 4));
  const int grid = 8 * info.prop.multiProcessorCount;
  FillBf16<<<grid, 256, 0, stream>>>(b.query, kMaxRows * g_heads * kDim, 11, 2.0f);
  FillF32<<<grid, 256, 0, stream>>>(b.weights, kMaxRows * g_heads, 12, 1.0f / std::sqrt(float(g_heads * kDim)));
  FillBf16<<<grid, 256, 0, stream>>>(b.keys_bf16, b.bf16_tokens * kDim, 13, 1.0f);
  QuantizeTokens<<<(b.fp8_tokens * 32 + 255) / 256, 256, 0, stream>>>(b.keys_fp8, b.scales, b.fp8_tokens, 14);
  CUDA_OK(cudaGetLastError());
  b.host_query.resize(kMaxRows * g_heads * kDim);
  b.host_weights.resize(kMaxRows * g_heads);
  CUDA_OK(cudaMemcpyAsync(b.host_query.data(), b.query, b.host_query.size() * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaMemcpyAsync(b.host_weights.data(), b.weights, b.host_weights.size() * 4, cudaMemcpyDeviceToHost,
                          stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  // --- the -inf sentinel -----------------------------------------------------
  bool all_ok = true;
  for (IndexKeyType key_type : {IndexKeyType::kBf16, IndexKeyType::kFp8E4m3}) {
    for (IndexerKernel kernel : {IndexerKernel::kAuto, IndexerKernel::kGeneral}) {
      const Check c = CheckLengths(b, key_type, kernel, stream);
      const bool ok = c.failures == 0;
      all_ok = all_ok && ok;
      std::printf("lengths check (%s keys, %s kernel, b = %lld, T = %lld, lengths 0 .. T): %lld tokens, "
                  "%lld failures, worst error / bound %.3f: %s\n",
                  key_type == IndexKeyType::kFp8E4m3 ? "fp8" : "bf16",
                  KernelName(Config{key_type, kLengthsRows, kLengthsTokens}.dims(), kernel),
                  (long long)kLengthsRows, (long long)kLengthsTokens, (long long)c.checked, (long long)c.failures,
                  c.worst, ok ? "ok" : "FAIL");
    }
  }

  // --- the table -------------------------------------------------------------
  std::vector<Result> results;
  std::printf("\n| keys | kernel | b | T | key MB | min us | median us | max us | GB/s | of read | of memcpy "
              "| check |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (IndexKeyType key_type : {IndexKeyType::kBf16, IndexKeyType::kFp8E4m3}) {
    for (int64_t tokens : tokens_list) {
      for (int64_t rows : rows_list) {
        const Config c{key_type, rows, tokens};
        const Check check = CheckConfig(b, c, stream);
        const bool ok = check.failures == 0 && check.deterministic && check.kernels_agree;
        all_ok = all_ok && ok;
        Result r = Measure(b, c, {}, iters, stream);
        r.check = check;
        results.push_back(r);
        std::printf("| %s | %s | %lld | %lld | %.1f | %.1f | %.1f | %.1f | %.0f | %.2f | %.2f "
                    "| %s (%.2f of bound%s%s) |\n",
                    c.name(), KernelName(c.dims(), IndexerKernel::kAuto), (long long)rows, (long long)tokens,
                    c.key_bytes() / 1e6, r.stats.min_us, r.stats.median_us, r.stats.max_us, r.gbs, r.gbs / read_gbs,
                    r.gbs / copy_gbs, ok ? "ok" : "FAIL", check.worst,
                    check.deterministic ? "" : ", NOT DETERMINISTIC",
                    check.kernels_agree ? "" : ", KERNELS DIFFER");
        std::fflush(stdout);
      }
    }
  }

  // --- launch-shape sweep -----------------------------------------------------
  std::vector<Result> sweep_results;
  if (sweep) {
    std::printf("\nLaunch shape at b = 8, T = 131072 (0 = automatic):\n\n"
                "| keys | kernel | warps/block | blocks/SM | median us | GB/s | of read |\n"
                "|---|---|---|---|---|---|---|\n");
    for (IndexKeyType key_type : {IndexKeyType::kBf16, IndexKeyType::kFp8E4m3}) {
      for (IndexerKernel kernel : {IndexerKernel::kAuto, IndexerKernel::kGeneral}) {
        for (int warps : {0, 2, 4, 8}) {
          for (int blocks : {0, 1, 2, 3}) {
            const Config c{key_type, 8, 131072};
            const Result r = Measure(b, c, {warps, blocks, kernel}, iters, stream);
            sweep_results.push_back(r);
            std::printf("| %s | %s | %d | %d | %.1f | %.0f | %.2f |\n", c.name(), KernelName(c.dims(), kernel),
                        warps, blocks, r.stats.median_us, r.gbs, r.gbs / read_gbs);
          }
        }
      }
    }
  }

  // --- JSON --------------------------------------------------------------------
  FILE* f = harness::OpenJson(json_path);
  std::fprintf(f, "{\n  \"device\": \"%s\", \"sms\": %d, \"cuda_runtime\": %d, \"driver\": %d,\n",
               info.prop.name, info.prop.multiProcessorCount, info.runtime, info.driver);
  std::fprintf(f, "  \"heads\": %lld, \"dim\": %lld, \"iters\": %d,\n", (long long)g_heads, (long long)kDim, iters);
  std::fprintf(f, "  \"hbm\": {\"memcpy_d2d_gbs\": %.1f, \"read_kernel_gbs\": %.1f, \"bytes\": %lld},\n", copy_gbs,
               read_gbs, (long long)ceiling_bytes);
  auto write = [&](const char* name, const std::vector<Result>& list, bool last) {
    std::fprintf(f, "  \"%s\": [\n", name);
    for (size_t i = 0; i < list.size(); ++i) {
      const Result& r = list[i];
      std::fprintf(f,
                   "    {\"keys\": \"%s\", \"kernel\": \"%s\", \"b\": %lld, \"T\": %lld, \"key_bytes\": %lld, "
                   "\"warps_per_block\": %d, \"blocks_per_sm\": %d, \"us_min\": %.2f, \"us_median\": %.2f, "
                   "\"us_max\": %.2f, \"gbs\": %.1f, \"of_read\": %.4f, \"of_memcpy\": %.4f, "
                   "\"checked_tokens\": %lld, \"check_failures\": %lld, \"worst_error_over_bound\": %.4f, "
                   "\"deterministic\": %s, \"kernels_agree\": %s}%s\n",
                   r.config.name(), KernelName(r.config.dims(), r.tuning.kernel), (long long)r.config.rows,
                   (long long)r.config.tokens, (long long)r.config.key_bytes(), r.tuning.warps_per_block,
                   r.tuning.blocks_per_sm, r.stats.min_us, r.stats.median_us, r.stats.max_us, r.gbs,
                   r.gbs / read_gbs, r.gbs / copy_gbs, (long long)r.check.checked, (long long)r.check.failures,
                   r.check.worst, r.check.deterministic ? "true" : "false",
                   r.check.kernels_agree ? "true" : "false", i + 1 < list.size() ? "," : "");
    }
    std::fprintf(f, "  ]%s\n", last ? "" : ",");
  };
  write("results", results, false);
  write("sweep", sweep_results, false);
  std::fprintf(f, "  \"all_checks_passed\": %s\n}\n", all_ok ? "true" : "false");
  std::fclose(f);
  std::printf("\nJSON: %s; checks %s\n", json_path, all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

// Times the sparse MLA decode attention kernels (chunk kernel + combine) on the GPU against the
// byte roofline: the k selected 1152-B records per request, read once from where they live, at the
// HBM read bandwidth measured in the same run (a read kernel over 2 GiB; the H200's nominal 4.3
// TB/s is printed beside it, so a run on another GPU is not held to the H200's HBM).
// Shapes: b = 1, 2 (latency), 17 (HiSparse capacity at 128K), 41 (at 32K) x H = 64, 128;
// k = 2048, P = 1. Two sources: "hot" (hot buffer, 4096 slots per request) and "kv" (device KV,
// one row per record of the context: 128K, or 32K at b = 41). The L2 is flushed (a 256 MB write)
// before every timed call, so the records come from HBM as in a decode step.
// Usage: sparse_attention_bench [out.json [BATCH HEADS [PLAN]]]   (one shape, any batch, hot source only: what
// a profiler run of one configuration wants; PLAN auto (default), combine or cluster: an A/B of the
// launch plans, sparse_attention_cuda.h)
#include <numeric>

#include "../tests/harness.h"
#include "sparse_attention.h"
#include "sparse_attention_cuda.h"

namespace {

__global__ void FillBf16(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float f = harness::Uniform(i, seed);
    uint32_t u = __float_as_uint(f);
    p[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

#ifdef HISPARSE_SPARSE_ATTENTION_TRACE
// The trace build (-DHISPARSE_SPARSE_ATTENTION_TRACE, diagnosis only): where one cold launch's
// time goes, from thread 0 of every block (sparse_attention_kernels.cu, Stamp): per phase, us
// after the first block started (min / median / max over blocks), and the combine kernel's blocks.
void PrintTrace(const char* what, int blocks) {
  std::vector<unsigned long long> ns(blocks * 8), clk(blocks * 8), comb(4096 * 2);
  CUDA_OK(hisparse::SparseAttentionReadTrace(ns.data(), clk.data(), comb.data(), blocks));
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < blocks; ++b)
    if (ns[b * 8]) t0 = std::min(t0, ns[b * 8]);
#ifdef HISPARSE_SPARSE_ATTENTION_WGMMA
  // The wgmma chunk kernel's phases (sparse_attention_wgmma.cuh): its step 0 and step 1.
  static const char* names[8] = {"entry", "math starts", "step 0 landed", "step 0 scored",
                                 "step 0 softmax exchanged", "step 0 P @ V done", "step 1 landed", "exit"};
#else
  static const char* names[8] = {"entry", "ids read, copies issued", "pass 0 landed", "pass 0 computed",
                                 "pass 1 landed", "passes done", "cluster: partials shared", "exit"};
#endif
  std::printf("trace %s (%d blocks), us after the first block's entry: min / median / max; cycles after the block's own entry (median)\n",
              what, blocks);
  for (int slot = 0; slot < 8; ++slot) {
    std::vector<double> us, cy;
    for (int b = 0; b < blocks; ++b)
      if (ns[b * 8] && ns[b * 8 + slot]) {
        us.push_back((ns[b * 8 + slot] - t0) * 1e-3);
        cy.push_back(double(clk[b * 8 + slot] - clk[b * 8]));
      }
    if (us.empty()) continue;
    std::sort(us.begin(), us.end());
    std::sort(cy.begin(), cy.end());
    std::printf("  %-26s %8.2f %8.2f %8.2f   %9.0f cycles\n", names[slot], us.front(), us[us.size() / 2], us.back(),
                cy[cy.size() / 2]);
  }
  std::vector<double> in, out;
  for (int b = 0; b < 4096; ++b)
    if (comb[b * 2] && comb[b * 2] >= t0) {
      in.push_back((comb[b * 2] - t0) * 1e-3);
      out.push_back((comb[b * 2 + 1] - t0) * 1e-3);
    }
  if (!in.empty()) {
    std::sort(in.begin(), in.end());
    std::sort(out.begin(), out.end());
    std::printf("  combine entry %8.2f %8.2f %8.2f | exit %8.2f %8.2f %8.2f (%zu blocks)\n", in.front(),
                in[in.size() / 2], in.back(), out.front(), out[out.size() / 2], out.back(), in.size());
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = argc > 1 ? argv[1] : nullptr;
  const bool one = argc > 3;
  const int64_t only_b = one ? std::atoll(argv[2]) : 0, only_h = one ? std::atoll(argv[3]) : 0;
  if (one && (only_b < 1 || only_b > 4096 || only_h < 64 || only_h % 64 != 0)) {
    std::fprintf(stderr, "B H: batch must be in [1, 4096] and heads a positive multiple of 64 (got %s %s)\n",
                 argv[2], argv[3]);
    return 2;
  }
  const std::string plan_name = argc > 4 ? argv[4] : "auto";
  const hisparse::SparseAttentionPlan plan = plan_name == "combine"   ? hisparse::SparseAttentionPlan::kCombine
                                             : plan_name == "cluster" ? hisparse::SparseAttentionPlan::kCluster
                                                                      : hisparse::SparseAttentionPlan::kAuto;
  if (plan_name != "auto" && plan_name != "combine" && plan_name != "cluster") {
    std::fprintf(stderr, "PLAN: %s is not one of auto, combine, cluster\n", plan_name.c_str());
    return 2;
  }
  const harness::DeviceInfo dev = harness::QueryDevice();
  std::printf("%s\n", harness::DeviceLine(dev).c_str());
  std::printf("plan %s; clusters of 16 blocks at once: %d (16 heads a block), %d (32), %d (64)\n", plan_name.c_str(),
              hisparse::SparseAttentionClustersAtOnce(1), hisparse::SparseAttentionClustersAtOnce(2),
              hisparse::SparseAttentionClustersAtOnce(4));
  const double nominal_tbs = 4.3;  // H200 HBM3e, the issue's reference
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The roofline's bandwidth: this GPU's HBM read kernel (harness::ReadAll), not a datasheet figure.
  const int64_t ceiling_bytes = 2ll << 30;
  const harness::HbmCeilings hbm = harness::MeasureHbmCeilingsOver(
      stream, ceiling_bytes, dev.prop.multiProcessorCount, [&](uint8_t* src) {
        FillBf16<<<1024, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(src), ceiling_bytes / 2, 9);
        CUDA_OK(cudaGetLastError());
      });
  const double hbm_tbs = hbm.read_gbs / 1e3;
  std::printf("HBM: read kernel over %lld MiB %.0f GB/s, memcpy D2D %.0f GB/s (read + write; medians); nominal "
              "%.0f GB/s. Roofline = the records' bytes at the read kernel's rate.\n",
              (long long)(ceiling_bytes >> 20), hbm.read_gbs, hbm.copy_gbs, nominal_tbs * 1e3);
  uint8_t* flush = nullptr;
  const size_t flush_bytes = 256ull << 20;
  CUDA_OK(cudaMalloc(&flush, flush_bytes));
  FILE* json = json_path ? harness::OpenJson(json_path) : nullptr;
  if (json)
    std::fprintf(json, "{\"device\": \"%s\", \"hbm\": {\"read_kernel_gbs\": %.1f, \"memcpy_d2d_gbs\": %.1f, "
                 "\"nominal_gbs\": %.0f}, \"rows\": [\n",
                 harness::DeviceLine(dev).c_str(), hbm.read_gbs, hbm.copy_gbs, nominal_tbs * 1e3);
  bool first_row = true;
  const int64_t k = 2048, W = hisparse::kSparseAttentionWidth;
  std::mt19937_64 rng(7);
  for (const char* mode : {"hot", "kv"}) {
    if (one && std::string(mode) != "hot") continue;
    for (int64_t H : {64, 128}) {
      // One shape (B H on the command line) may be any batch, e.g. the halves of an overlap
      // group's split (8 and 9 of 17); the table runs the deployments' batches.
      const std::vector<int64_t> batches = one ? std::vector<int64_t>{only_b} : std::vector<int64_t>{17, 2, 1, 41};
      for (int64_t b : batches) {
        if (one && H != only_h) continue;
        hisparse::SparseAttentionShape s;
        s.batch = b, s.heads = H, s.top_k = k, s.page = 1;
        s.records = std::string(mode) == "hot" ? 4096 : (b == 41 ? 32768 : 131072);
        uint16_t *q, *src, *tail;
        int32_t *idx, *layer;
        uint8_t* tv;
        float *out, *ws;
        CUDA_OK(cudaMalloc(&q, b * H * W * 2));
        CUDA_OK(cudaMalloc(&src, b * s.records * W * 2));
        CUDA_OK(cudaMalloc(&tail, b * W * 2));
        CUDA_OK(cudaMalloc(&idx, b * k * 4));
        CUDA_OK(cudaMalloc(&layer, 4));
        CUDA_OK(cudaMemsetAsync(layer, 0, 4, stream));
        CUDA_OK(cudaMalloc(&tv, b));
        CUDA_OK(cudaMalloc(&out, b * H * 512 * 4));
        CUDA_OK(cudaMalloc(&ws, hisparse::SparseAttentionWorkspaceBytes(s)));
        FillBf16<<<1024, 256, 0, stream>>>(q, b * H * W, 1);
        FillBf16<<<1024, 256, 0, stream>>>(src, b * s.records * W, 2);
        FillBf16<<<64, 256, 0, stream>>>(tail, b * W, 3);
        CUDA_OK(cudaMemsetAsync(tv, 1, b, stream));
        std::vector<int32_t> h(b * k);
        for (int64_t r = 0; r < b; ++r) {
          std::vector<int32_t> perm(s.records);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          std::copy(perm.begin(), perm.begin() + k, h.begin() + r * k);
        }
        CUDA_OK(cudaMemcpyAsync(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        const float scale = 0.0722f;
        auto launch = [&](int) {
          CUDA_OK(hisparse::LaunchSparseAttention(s, scale, q, src, layer, idx, tail, tv, out, ws, stream, plan));
        };
        if (const cudaError_t err = hisparse::LaunchSparseAttention(s, scale, q, src, layer, idx, tail, tv, out, ws, stream, plan);
            err != cudaSuccess) {
          std::printf("%-3s b=%-3lld H=%-4lld does not launch: %s\n", mode, (long long)b, (long long)H,
                      cudaGetErrorString(err));
          cudaGetLastError();
          cudaFree(q), cudaFree(src), cudaFree(tail), cudaFree(idx), cudaFree(tv), cudaFree(out), cudaFree(ws), cudaFree(layer);
          continue;
        }
        // Cold: flush before each call (not timed). Warm: back to back (records in L2).
        std::vector<double> cold;
        for (int i = 0; i < 3; ++i) launch(i);
        for (int i = 0; i < 30; ++i) {
          CUDA_OK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
          auto t = harness::EventTimes(stream, 1, 0, 0, 0, launch);
          cold.push_back(t[0]);
        }
        const harness::Stats c = harness::Summarize(cold);
#ifdef HISPARSE_SPARSE_ATTENTION_TRACE
        for (int rep = 0; rep < 2; ++rep) {  // the second: code and TLBs warm, records cold
          CUDA_OK(cudaMemsetAsync(flush, rep, flush_bytes, stream));
          CUDA_OK(cudaStreamSynchronize(stream));
          CUDA_OK(hisparse::SparseAttentionClearTrace());
          CUDA_OK(cudaDeviceSynchronize());
          auto t = harness::EventTimes(stream, 1, 0, 0, 0, launch);
          CUDA_OK(cudaDeviceSynchronize());
          PrintTrace(harness::Format("b=%lld H=%lld cold, event %.2f us", (long long)b, (long long)H, t[0]).c_str(), 4096);
        }
#endif
        const harness::Stats w = harness::TimeLaunches(stream, 50, launch);
        // The outputs' bits (FNV-1a): two builds given the same shape must print the same hash
        // where their arithmetic is the same (an A/B of kernels that should not change the bits).
        std::vector<uint32_t> bits(b * H * 512);
        CUDA_OK(cudaMemcpy(bits.data(), out, bits.size() * 4, cudaMemcpyDeviceToHost));
        uint64_t hash = 1469598103934665603ull;
        for (uint32_t v : bits) hash = (hash ^ v) * 1099511628211ull;
        const double bytes = double(b) * k * W * 2;
        const double roof_us = bytes / (hbm_tbs * 1e12) * 1e6;
        const double nominal_roof_us = bytes / (nominal_tbs * 1e12) * 1e6;
        std::printf("%-3s b=%-3lld H=%-4lld cold us min %7.2f med %7.2f max %7.2f | %5.1f%% of byte roofline (%.2f us; "
                    "%.1f%% at the nominal) | warm(L2) med %7.2f | out %016llx\n",
                    mode, (long long)b, (long long)H, c.min_us, c.median_us, c.max_us, 100 * roof_us / c.median_us,
                    roof_us, 100 * nominal_roof_us / c.median_us, w.median_us, (unsigned long long)hash);
        std::fflush(stdout);
        if (json) {
          std::fprintf(json,
                       "%s{\"plan\": \"%s\", \"source\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"top_k\": %lld, \"cold_min_us\": %.3f, "
                       "\"cold_median_us\": %.3f, \"cold_max_us\": %.3f, \"warm_median_us\": %.3f, \"roofline_us\": %.3f, "
                       "\"roofline_fraction\": %.4f, \"nominal_roofline_fraction\": %.4f}",
                       first_row ? "" : ",\n", plan_name.c_str(), mode, (long long)b, (long long)H, (long long)k, c.min_us, c.median_us, c.max_us,
                       w.median_us, roof_us, roof_us / c.median_us, nominal_roof_us / c.median_us);
          first_row = false;
        }
        cudaFree(q), cudaFree(src), cudaFree(tail), cudaFree(idx), cudaFree(tv), cudaFree(out), cudaFree(ws), cudaFree(layer);
      }
    }
  }
  if (json) std::fprintf(json, "\n]}\n"), std::fclose(json);
  return 0;
}

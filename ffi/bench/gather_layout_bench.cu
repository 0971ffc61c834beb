// How fast can a block gather random 1152-byte records into shared memory in a layout the
// tensor cores' wgmma reads (issue: the roofline; the wgmma sparse attention's copies)?
//
// sparse_attention_wgmma.cuh's copies are 72 16-byte cp.async a record, because its no-swizzle
// core-matrix layout puts 8 records' 16-byte pieces side by side: measured, they move ~24 GB/s an
// SM alone and ~10 GB/s an SM with all SMs copying (BENCHMARKS.md, thirteenth pass). Three ways to
// fill a 32-record stage (36 KB), each checked against its layout, then timed:
//   cpasync16  128 threads, 18 16-byte cp.async each: the no-swizzle core-matrix layout of today's
//              wgmma kernel (piece p of record t at (t / 8) * 9216 + p * 128 + (t % 8) * 16).
//   tma-slab   one TMA tensor copy per 64-element slab of a record (9 a record, one box of 1 row x
//              128 bytes each, 128-byte swizzle), issued by one warp: the 128-byte-swizzled K-major
//              layout (slab s of record t at s * 4096 + t * 128, its 16-byte chunks permuted by
//              t % 8), which wgmma reads with a swizzled descriptor for both the scores and P @ V.
//   bulk-row   one TMA bulk copy per record (1152 contiguous bytes), issued by one warp: the mma.sync
//              kernel's rows, which no wgmma layout takes; the upper bound of the three.
// Each block gathers --stages stages of 32 random rows of a --pool-gib GiB pool (every SM one
// block; two stage buffers, the next stage's copies in flight while one is checked off). GB/s =
// rows x 1152 B / time, min / median / max of --iters calls.
// Usage: gather_layout_bench [out.json] [--stages 64] [--iters 20] [--pool-gib 2]
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>
#include <numeric>
#include <random>

#include "../tests/harness.h"

namespace {

constexpr int kW = 576, kRowBytes = kW * 2, kStage = 32, kPieces = kRowBytes / 16, kSlabs = kW / 64;
constexpr int kStageBytes = kStage * kRowBytes;  // 36864 in every layout
constexpr int kThreads = 128;

__device__ __forceinline__ uint32_t Smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void BarInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(Smem(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void BarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(Smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void BarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(Smem(bar)), "r"(parity) : "memory");
}

// The layouts: byte offset of 16-byte piece p (of 72) of record t (of 32) in a stage.
__host__ __device__ inline int CoreMatrixOffset(int t, int p) { return (t / 8) * (kPieces * 128) + p * 128 + (t % 8) * 16; }
__host__ __device__ inline int Swizzled128Offset(int t, int p) {
  return (p / 8) * (kStage * 128) + t * 128 + (((p % 8) ^ (t % 8)) * 16);
}

struct Args {
  const uint16_t* pool;
  const int* ids;  // [blocks][stages][32]
  int stages;
  uint8_t* dump;   // the last stage of block 0, for the layout check
  uint32_t* sink;  // [blocks][threads]: a word of every stage read, so the copies' data is used
};

// Every variant: stage s into buffer s % 2 after stage s - 1 was checked off, then a read of one
// word per thread (so the copies' data is used) and, for block 0's last stage, the dump.
template <int kVariant>
__global__ void __launch_bounds__(kThreads, 1) Gather(const __grid_constant__ CUtensorMap map, Args a) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzled layout's 8-row atoms start on 1024-byte boundaries (the launch adds 1024 bytes).
  uint8_t* smem = smem_raw + ((1024 - (Smem(smem_raw) & 1023)) & 1023);
  uint8_t* buf[2] = {smem, smem + kStageBytes};
  __shared__ uint64_t bar[2];
  const int tid = threadIdx.x;
  const int* ids = a.ids + static_cast<int64_t>(blockIdx.x) * a.stages * kStage;
  if (tid == 0) BarInit(&bar[0]), BarInit(&bar[1]);
  __syncthreads();
  // The rows this thread copies, loaded a stage before their copies are issued (as the wgmma
  // kernel's producers do): cpasync16's thread p copies tokens p % 8 + 8 (p / 64) and that + 16;
  // in the TMA variants lane t of warp 0 issues token t.
  const int tok0 = tid % 8 + 8 * (tid / 64), piece0 = (tid / 8) % 8;
  int next[2] = {0, 0};
  auto load_ids = [&](int s) {
    if constexpr (kVariant == 0) {
      next[0] = __ldg(ids + s * kStage + tok0);
      next[1] = __ldg(ids + s * kStage + tok0 + 16);
    } else if (tid < 32) {
      next[0] = __ldg(ids + s * kStage + tid);
    }
  };
  load_ids(0);
  auto issue = [&](int s) {
    uint8_t* dst = buf[s & 1];
    const int row0 = next[0], row1 = next[1];
    if (s + 1 < a.stages) load_ids(s + 1);
    if constexpr (kVariant == 0) {  // cpasync16: pieces (p / 8) % 8 + 8 i of the thread's two tokens
      for (int hf = 0; hf < 2; ++hf) {
        const int t = tok0 + 16 * hf;
        const uint16_t* src = a.pool + static_cast<int64_t>(hf ? row1 : row0) * kW;
        for (int i = 0; i < 9; ++i) {
          const int p = piece0 + 8 * i;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(Smem(dst + CoreMatrixOffset(t, p))),
                       "l"(src + p * 8) : "memory");
        }
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    } else if (tid < 32) {  // tma-slab, bulk-row: warp 0, lane t issues record t
      if (tid == 0) BarExpect(&bar[s & 1], kStageBytes);
      __syncwarp();
      const int row = row0;
      if constexpr (kVariant == 1) {
        for (int slab = 0; slab < kSlabs; ++slab)
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                  Smem(dst + slab * (kStage * 128) + tid * 128)), "l"(&map), "r"(slab * 64), "r"(row), "r"(Smem(&bar[s & 1]))
              : "memory");
      } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         Smem(dst + tid * kRowBytes)), "l"(a.pool + static_cast<int64_t>(row) * kW), "r"(kRowBytes),
                     "r"(Smem(&bar[s & 1]))
                     : "memory");
      }
    }
  };
  uint32_t sum = 0;
  issue(0);
  for (int s = 0; s < a.stages; ++s) {
    if (s + 1 < a.stages) {
      __syncthreads();  // stage s - 1's buffer read
      issue(s + 1);
    }
    if constexpr (kVariant == 0) {
      if (s + 1 < a.stages) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      __syncthreads();
    } else {
      BarWait(&bar[s & 1], (s >> 1) & 1);
    }
    sum += reinterpret_cast<const uint32_t*>(buf[s & 1])[tid * 67 % (kStageBytes / 4)];
    if (blockIdx.x == 0 && s == a.stages - 1)
      for (int i = tid; i < kStageBytes / 16; i += kThreads)
        reinterpret_cast<uint4*>(a.dump)[i] = reinterpret_cast<const uint4*>(buf[s & 1])[i];
  }
  a.sink[blockIdx.x * kThreads + tid] = sum;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  int stages = 64, iters = 20;
  double pool_gib = 2.0;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) std::fprintf(stderr, "gather_layout_bench: %s needs a value\n", flag), std::exit(2);
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--stages")) stages = std::atoi(value("--stages"));
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(value("--iters"));
    else if (!std::strcmp(argv[i], "--pool-gib")) pool_gib = std::atof(value("--pool-gib"));
    else if (argv[i][0] != '-' && !json_path) json_path = argv[i];
    else std::fprintf(stderr, "gather_layout_bench: unknown argument %s; usage: gather_layout_bench [out.json] "
                              "[--stages 64] [--iters 20] [--pool-gib 2]\n", argv[i]), std::exit(2);
  }
  if (stages < 2 || stages > 4096 || iters < 1 || iters > 10000 || !(pool_gib >= 0.25 && pool_gib <= 64)) {
    std::fprintf(stderr, "gather_layout_bench: --stages in [2, 4096], --iters in [1, 10000], --pool-gib in [0.25, 64]\n");
    return 2;
  }
  const harness::DeviceInfo dev = harness::QueryDevice();
  std::printf("%s\n", harness::DeviceLine(dev).c_str());
  const int blocks = dev.prop.multiProcessorCount;
  const int64_t rows = static_cast<int64_t>(pool_gib * (1ull << 30) / kRowBytes);
  uint16_t* pool;
  CUDA_OK(cudaMalloc(&pool, rows * kRowBytes));
  {
    std::vector<uint16_t> pattern(1 << 20);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
    for (int64_t off = 0; off < rows * kW; off += pattern.size())
      CUDA_OK(cudaMemcpy(pool + off, pattern.data(), std::min<int64_t>(pattern.size(), rows * kW - off) * 2,
                         cudaMemcpyHostToDevice));
  }
  std::vector<int> ids(static_cast<size_t>(blocks) * stages * kStage);
  std::mt19937_64 rng(2026);
  for (int& id : ids) id = static_cast<int>(rng() % rows);
  int* d_ids;
  uint8_t* dump;
  uint32_t* sink;
  CUDA_OK(cudaMalloc(&sink, static_cast<size_t>(blocks) * kThreads * 4));
  CUDA_OK(cudaMalloc(&d_ids, ids.size() * 4));
  CUDA_OK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&dump, kStageBytes));

  // The tensor map of the pool as [rows, 576] bf16, a box of 1 row x 64 elements, 128-byte swizzle.
  CUtensorMap map;
  {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn) std::fprintf(stderr, "no cuTensorMapEncodeTiled\n"), std::exit(1);
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kW), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kRowBytes)};
    const cuuint32_t box[2] = {64, 1}, elem[2] = {1, 1};
    const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r)), std::exit(1);
  }

  const char* names[3] = {"cpasync16", "tma-slab", "bulk-row"};
  void (*kernels[3])(CUtensorMap, Args) = {Gather<0>, Gather<1>, Gather<2>};
  const int smem = 2 * kStageBytes + 1024;
  Args args{pool, d_ids, stages, dump, sink};
  FILE* json = json_path ? harness::OpenJson(json_path) : nullptr;
  if (json) std::fprintf(json, "{\"device\": \"%s\", \"stages\": %d, \"blocks\": %d, \"variants\": [", dev.prop.name, stages, blocks);
  int failures = 0;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (int v = 0; v < 3; ++v) {  // tma-slab's box is the unproven one: it runs after the others
    const int order[3] = {0, 2, 1};
    const int k = order[v];
    CUDA_OK(cudaFuncSetAttribute(kernels[k], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    auto launch = [&](int) { kernels[k]<<<blocks, kThreads, smem, stream>>>(map, args); };
    launch(0);
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      std::printf("%-10s FAIL: %s (the launch error ends the run)\n", names[k], cudaGetErrorString(err));
      return 1;
    }
    // Block 0's last stage against the layout: piece p of record t where the variant puts it.
    std::vector<uint8_t> got(kStageBytes), want(kStageBytes);
    CUDA_OK(cudaMemcpy(got.data(), dump, kStageBytes, cudaMemcpyDeviceToHost));
    std::vector<uint16_t> row(kW);
    for (int t = 0; t < kStage; ++t) {
      const int64_t id = ids[static_cast<size_t>(stages - 1) * kStage + t];
      CUDA_OK(cudaMemcpy(row.data(), pool + id * kW, kRowBytes, cudaMemcpyDeviceToHost));
      for (int p = 0; p < kPieces; ++p) {
        const int off = k == 0 ? CoreMatrixOffset(t, p) : k == 1 ? Swizzled128Offset(t, p) : t * kRowBytes + p * 16;
        std::memcpy(want.data() + off, reinterpret_cast<const uint8_t*>(row.data()) + p * 16, 16);
      }
    }
    const bool ok = got == want;
    failures += !ok;
    const harness::Stats st = harness::TimeLaunches(stream, iters, launch);
    const double bytes = static_cast<double>(blocks) * stages * kStage * kRowBytes;
    std::printf("%-10s layout %s | us min %8.2f med %8.2f max %8.2f | %6.0f GB/s (%5.1f GB/s an SM) at the median\n",
                names[k], ok ? "ok  " : "FAIL", st.min_us, st.median_us, st.max_us, bytes / st.median_us * 1e-3,
                bytes / st.median_us * 1e-3 / blocks);
    if (json)
      std::fprintf(json, "%s{\"variant\": \"%s\", \"layout_ok\": %s, \"us_min\": %.3f, \"us_median\": %.3f, \"us_max\": %.3f, "
                         "\"gb_per_s\": %.1f}", v ? ", " : "", names[k], ok ? "true" : "false", st.min_us, st.median_us,
                   st.max_us, bytes / st.median_us * 1e-3);
  }
  if (json) std::fprintf(json, "]}\n"), std::fclose(json);
  return failures ? 1 : 0;
}

// The grouped matmul kernel (grouped_matmul_cuda.h has the plan; the
// contract is grouped_matmul.h).
//
// Tensor-core tiles (mma.sync m16n8k16 row.col, PTX fragment layouts;
// g = lane / 4, c = lane % 4):
//   A = weights, 16 rows x 16 k:  a0 (row g, k 2c..2c+1)     a1 (row g+8, k 2c..2c+1)
//                                 a2 (row g, k 2c+8..2c+9)   a3 (row g+8, k 2c+8..2c+9)
//   B = x,       16 k x 8 tokens: b0 (k 2c..2c+1, token g)   b1 (k 2c+8..2c+9, token g)
//   C = y^T,     16 rows x 8 tokens: c0, c1 (row g, tokens 2c, 2c+1), c2, c3 (row g+8, same)
// A warp-wide load of a weight row is 64 bytes (a "chunk": 32 bf16 or 64 fp8
// values of k); lane c loads bytes 16c..16c+15 of rows g and g+8, i.e. k
// values kc..kc+P-1 with P = 8 (bf16) or 16 (fp8) and kc = chunk * 4P + c P.
// Each lane's P values feed the mma k slots of P / 4 k-steps: in step s the
// slots 2c, 2c+1 hold k = kc + 4s + {0, 1} and the slots 2c+8, 2c+9 hold
// k = kc + 4s + {2, 3}. Over a chunk's steps and lanes every k of the chunk is
// used once; x is loaded in the same order (its P values at kc of token g:
// 32-bit word 2s goes to b0, word 2s+1 to b1), so every product is x[m, k] *
// w[e, n, k] with matching k.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "async_copy.cuh"
#include "common.h"
#include "grouped_matmul.h"
#include "grouped_matmul_cuda.h"
#include "grouped_matmul_tiled.h"
#include "tensor_map.h"

namespace hisparse {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kChunkBytes = 64;        // one warp-wide load of a weight row
constexpr int kRowsPerWeightTile = 16;  // mma M
constexpr int kTokensPerTile = 8;       // mma N
constexpr uint32_t kBf16x2Two120 = 0x7b807b80u;  // bf16 2^120 in both halves

struct GroupedArgs {
  const uint8_t* x;        // [M, K] bf16
  const uint8_t* w;        // [E, N, K] bf16 or fp8 e4m3fn
  const float* scale;      // [E, N]
  const int32_t* sizes;    // [E]
  float* y;                // [M, N]
  int64_t rows;            // M
  int64_t n;               // N
  int64_t w_row_bytes;     // K * (1 or 2)
  int64_t x_row_bytes;     // 2 K
  int32_t experts;         // E
  int32_t chunks;          // ceil(w_row_bytes / kChunkBytes)
  int32_t blocks_per_expert;
  int32_t tiles_per_warp;  // warp tiles (16 kWeightTiles rows each) a warp streams one after another
  int32_t zero_blocks;     // blocks [0, zero_blocks) write the rows past the last group
  int32_t k_slices;        // S: slices of K per weight row (grouped_matmul.h), one warp each
  int32_t slice_chunks;    // chunks per slice: ceil(chunks / S)
};

// --------------------------------------------------------------------------- PTX wrappers

// 16 bytes of a weight row: read once, so not kept in L1 (x is); the L2 is asked
// to fetch 256-byte sectors, which the following chunks of the row use.
__device__ __forceinline__ uint4 LoadWeights(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 LoadTokens(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// c += a b on the tensor cores, bf16 inputs, f32 accumulation.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 bytes of `word` (selector 0x9180: bytes 0, 1; 0xb3a2: bytes 2, 3) as
// two bf16 values, first byte in the low half. prmt puts each byte in the low
// half of a 16-bit lane with its sign replicated above it; << 4 moves eeee.mmm
// under the bf16 exponent's low bits and a sign copy to bit 15; the mask drops
// the rest. Those bits are the value times 2^-120 (subnormal codes become bf16
// subnormals); the product by 2^120 is exact and normal for every code.
__device__ __forceinline__ uint32_t Fp8PairAsBf16(uint32_t word, uint32_t selector) {
  uint32_t lanes, out;
  asm("prmt.b32 %0, %1, %1, %2;\n" : "=r"(lanes) : "r"(word), "r"(selector));
  lanes = (lanes << 4) & 0x87f087f0u;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(out) : "r"(lanes), "r"(kBf16x2Two120));
  return out;
}

// Waits for `threads` threads (whole warps) at barrier `id` (1..15; 0 is __syncthreads').
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" : : "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The A fragments of k-step `step` of a chunk from a lane's 16 bytes of rows g
// (`top`) and g + 8 (`bottom`).
template <bool kFp8>
__device__ __forceinline__ void WeightFragment(const uint4& top, const uint4& bottom, int step,
                                               uint32_t (&a)[4]) {
  if constexpr (kFp8) {
    a[0] = Fp8PairAsBf16(Word(top, step), 0x9180u);
    a[1] = Fp8PairAsBf16(Word(bottom, step), 0x9180u);
    a[2] = Fp8PairAsBf16(Word(top, step), 0xb3a2u);
    a[3] = Fp8PairAsBf16(Word(bottom, step), 0xb3a2u);
  } else {
    a[0] = Word(top, 2 * step);
    a[1] = Word(bottom, 2 * step);
    a[2] = Word(top, 2 * step + 1);
    a[3] = Word(bottom, 2 * step + 1);
  }
}

// --------------------------------------------------------------------------- the output

// One output channel n of a pass (half h of a 16-row mma tile: its row g or g + 8): y[token, n] =
// acc * scale[expert, n] for the pass's tokens below `end`. The C fragment holds tokens 2c, 2c + 1
// of each 8-token tile in elements 2h, 2h + 1.
template <int kTokenTiles>
__device__ __forceinline__ void StoreChannel(const GroupedArgs& p, int expert, int64_t n, int h,
                                             const float (&acc)[kTokenTiles][4], int64_t t0, int64_t end,
                                             int tiles, int c) {
  const float factor = p.scale[static_cast<int64_t>(expert) * p.n + n];
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t) {
    if (t >= tiles) break;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t token = t0 + kTokensPerTile * t + 2 * c + i;
      if (token < end) p.y[token * p.n + n] = acc[t][2 * h + i] * factor;
    }
  }
}

// --------------------------------------------------------------------------- group offsets

// sum over i < count of max(sizes[i], 0), in 64 bits, on every thread of the
// block. Every thread must call it (it synchronizes the block once).
__device__ int64_t ClampedSizeSum(const int32_t* sizes, int count, int64_t* warp_sums) {
  int64_t sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += max(sizes[i], 0);
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = sum;
  __syncthreads();
  sum = 0;
  for (int i = 0; i < static_cast<int>(blockDim.x / kWarp); ++i) sum += warp_sums[i];
  return sum;
}

// Rows [min(total, M), M) belong to no group: +0 in every column. Block `block`
// of `blocks` writes rows first + block, first + block + blocks, ...
__device__ void WriteZeroRows(const GroupedArgs& p, int block, int64_t* warp_sums) {
  const int64_t first = min(ClampedSizeSum(p.sizes, p.experts, warp_sums), p.rows);
  for (int64_t row = first + block; row < p.rows; row += p.zero_blocks) {
    float* out = p.y + row * p.n;
    for (int64_t col = threadIdx.x; col < p.n; col += blockDim.x) out[col] = 0.0f;
  }
}

// --------------------------------------------------------------------------- the kernel

// kFp8: fp8 weights (else bf16). kWeightTiles: 16-row weight tiles per warp
// tile. kInFlight: chunks loaded per row before any is used. kTokenTiles:
// 8-token tiles per pass. kSplit: K is split over S > 1 warps (a template flag, so the
// unsplit kernels compile exactly as before the split: its runtime bounds cost the routed
// experts 5-15% on the H200 when they were shared by both).
template <bool kFp8, int kWeightTiles, int kInFlight, int kTokenTiles, bool kSplit>
struct WarpTile {
  static constexpr int kSteps = kFp8 ? 4 : 2;  // k-steps per chunk
  static constexpr int kTokensPerPass = kTokensPerTile * kTokenTiles;

  // y of weight rows [row0, row0 + 16 kWeightTiles) of `expert` for its tokens [begin, end).
  // With S > 1 the S warps of a tile group (warps slice * 32 ..) run this together, each over
  // its slice's chunks [chunk_begin, chunk_end), and meet at named barrier `barrier`.
  static __device__ __forceinline__ void Run(const GroupedArgs& p, int expert, int64_t row0, int64_t begin,
                                             int64_t end, int lane, int slice, int chunk_begin, int chunk_end,
                                             int barrier, float* partials) {
    const int g = lane / 4, c = lane % 4;
    // The weights' layout: row-major (0, the contract's), or tiles of kTile rows in an experiment
    // build (grouped_matmul_tiled.h), where a row's next chunk is a whole tile's chunk further.
    constexpr int64_t kTile = kGroupedMatmulTileRows;
    constexpr int64_t kChunkStride = (kTile > 0 ? kTile : 1) * kChunkBytes;
    // This lane's weight rows: g and g + 8 of each tile (rows past N read as zeros); the lane's
    // 16 bytes of a chunk (16 c) are added with the chunk's offset below.
    const uint8_t* w_rows[kWeightTiles][2];
    bool row_ok[kWeightTiles][2];
#pragma unroll
    for (int j = 0; j < kWeightTiles; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = row0 + kRowsPerWeightTile * j + 8 * h + g;
        row_ok[j][h] = n < p.n;
        const int64_t row = static_cast<int64_t>(expert) * p.n + (row_ok[j][h] ? n : 0);
        if constexpr (kTile > 0) w_rows[j][h] = p.w + TiledWeightOffset(row, 0, p.w_row_bytes, kTile);
        else w_rows[j][h] = p.w + row * p.w_row_bytes;
      }
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int k_first = kSplit ? chunk_begin : 0, k_last = kSplit ? chunk_end : p.chunks;

    for (int64_t t0 = begin; t0 < end; t0 += kTokensPerPass) {
      const int tiles =
          static_cast<int>(min(static_cast<int64_t>(kTokenTiles), (end - t0 + kTokensPerTile - 1) / kTokensPerTile));
      float acc[kWeightTiles][kTokenTiles][4];
#pragma unroll
      for (int j = 0; j < kWeightTiles; ++j)
#pragma unroll
        for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[j][t][i] = 0.0f;

      for (int chunk0 = k_first; chunk0 < k_last; chunk0 += kInFlight) {
        // Every load of the group first (memory-level parallelism), then the math.
        uint4 wv[kInFlight][kWeightTiles][2];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int64_t offset = static_cast<int64_t>(chunk0 + u) * kChunkBytes + 16 * c;
          int64_t at = offset;  // where the lane's 16 bytes are: the row's offset, row-major
          if constexpr (kTile > 0) at = static_cast<int64_t>(chunk0 + u) * kChunkStride + 16 * c;
          // The last chunk of a row may be partial; chunks past the slice are another warp's.
          const bool k_ok = (!kSplit || chunk0 + u < k_last) && offset < p.w_row_bytes;
#pragma unroll
          for (int j = 0; j < kWeightTiles; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              wv[u][j][h] = k_ok && row_ok[j][h] ? LoadWeights(w_rows[j][h] + at) : zero;
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          if (chunk0 + u >= k_last) break;  // warp-uniform
          const int64_t w_offset = static_cast<int64_t>(chunk0 + u) * kChunkBytes + 16 * c;
          const bool k_ok = w_offset < p.w_row_bytes;
          const int64_t x_offset = kFp8 ? 2 * w_offset : w_offset;  // the same k in x's bf16
          uint32_t a[kSteps][kWeightTiles][4];
#pragma unroll
          for (int s = 0; s < kSteps; ++s)
#pragma unroll
            for (int j = 0; j < kWeightTiles; ++j) WeightFragment<kFp8>(wv[u][j][0], wv[u][j][1], s, a[s][j]);
#pragma unroll
          for (int t = 0; t < kTokenTiles; ++t) {
            if (t >= tiles) break;  // warp-uniform
            const int64_t token = t0 + kTokensPerTile * t + g;
            uint4 lo = zero, hi = zero;
            if (token < end && k_ok) {
              const uint8_t* src = p.x + token * p.x_row_bytes + x_offset;
              lo = LoadTokens(src);
              if constexpr (kFp8) hi = LoadTokens(src + 16);
            }
            const uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int s = 0; s < kSteps; ++s)
#pragma unroll
              for (int j = 0; j < kWeightTiles; ++j) Mma(acc[j][t], a[s][j], xw[2 * s], xw[2 * s + 1]);
          }
        }
      }

      // The slices' partial sums, added in slice order by slice 0's warp: p_0 + p_1 + ... + p_{S-1}.
      if constexpr (kSplit) {
        float* mine = partials + (slice * 4) * kWarp + lane;  // [S][4][32] floats of this tile group
#pragma unroll
        for (int j = 0; j < kWeightTiles; ++j) {
#pragma unroll
          for (int t = 0; t < kTokenTiles; ++t) {
            if (t >= tiles) break;  // warp-uniform, and the same for the group's warps
            if (slice > 0) {
#pragma unroll
              for (int i = 0; i < 4; ++i) mine[i * kWarp] = acc[j][t][i];
            }
            NamedBarrier(barrier, p.k_slices * kWarp);
            if (slice == 0) {
              for (int s = 1; s < p.k_slices; ++s) {
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[j][t][i] += partials[(s * 4 + i) * kWarp + lane];
              }
            }
            NamedBarrier(barrier, p.k_slices * kWarp);  // the buffer is free again
          }
        }
        if (slice > 0) continue;  // slice 0 writes y
      }

      // y = acc * scale: rows g (h = 0) and g + 8 (h = 1) of each weight tile.
#pragma unroll
      for (int j = 0; j < kWeightTiles; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (row_ok[j][h]) StoreChannel<kTokenTiles>(p, expert, row0 + kRowsPerWeightTile * j + 8 * h + g, h, acc[j], t0, end, tiles, c);
        }
      }
    }
  }
};

// Blocks [0, zero_blocks) write the zero rows; then blocks_per_expert blocks
// per expert, expert-major. Warp w of an expert's warps owns its warp tiles
// [w * tiles_per_warp, (w + 1) * tiles_per_warp), each 16 kWeightTiles rows.
template <bool kFp8, int kWeightTiles, int kInFlight, int kTokenTiles, bool kSplit>
__global__ void __launch_bounds__(kGroupedMatmulMaxWarps * kWarp)
    GroupedMatmulKernel(const GroupedArgs p) {
  __shared__ int64_t warp_sums[kGroupedMatmulMaxWarps];
  if (static_cast<int>(blockIdx.x) < p.zero_blocks) {
    WriteZeroRows(p, blockIdx.x, warp_sums);
    return;
  }
  const int block = blockIdx.x - p.zero_blocks;
  const int expert = block / p.blocks_per_expert;
  const int own = p.sizes[expert];
  if (own <= 0) return;  // the whole block: an expert without rows reads nothing
  const int64_t begin = ClampedSizeSum(p.sizes, expert, warp_sums);
  if (begin >= p.rows) return;
  const int64_t end = min(begin + own, p.rows);

  // Warp w of the block: tile group w / S (warp tiles like one warp without a split), slice w % S.
  constexpr int64_t kRowsPerWarpTile = kRowsPerWeightTile * kWeightTiles;
  // The slices' partial sums: dynamic, so a launch without a split (S = 1) has no shared memory
  // beyond warp_sums, as before the split, and the L1 left for x stays the largest.
  extern __shared__ float partials[];  // [warps_per_block][4][32] when S > 1
  const int warp_in_block = threadIdx.x / kWarp;
  const int k_slices = kSplit ? p.k_slices : 1;
  const int slice = warp_in_block % k_slices, group_in_block = warp_in_block / k_slices;
  const int groups_per_block = static_cast<int>(blockDim.x / kWarp) / k_slices;
  const int64_t group = static_cast<int64_t>(block % p.blocks_per_expert) * groups_per_block + group_in_block;
  const int chunk_begin = min(p.chunks, slice * p.slice_chunks);
  const int chunk_end = min(p.chunks, chunk_begin + p.slice_chunks);
  const int64_t first = group * p.tiles_per_warp;
  for (int64_t tile = first; tile < first + p.tiles_per_warp && tile * kRowsPerWarpTile < p.n; ++tile)
    WarpTile<kFp8, kWeightTiles, kInFlight, kTokenTiles, kSplit>::Run(
        p, expert, tile * kRowsPerWarpTile, begin, end, threadIdx.x % kWarp, slice, chunk_begin, chunk_end,
        1 + group_in_block, partials + group_in_block * k_slices * 4 * kWarp);
}

#include "grouped_matmul_stream.cuh"

// --------------------------------------------------------------------------- plan and dispatch

using KernelFn = void (*)(GroupedArgs);

template <bool kFp8, int kWeightTiles, int kInFlight, bool kSplit>
KernelFn ForTokenTiles(int token_tiles) {
  switch (token_tiles) {
    case 1: return GroupedMatmulKernel<kFp8, kWeightTiles, kInFlight, 1, kSplit>;
    case 2: return GroupedMatmulKernel<kFp8, kWeightTiles, kInFlight, 2, kSplit>;
    case 4: return GroupedMatmulKernel<kFp8, kWeightTiles, kInFlight, 4, kSplit>;
    case 8: return GroupedMatmulKernel<kFp8, kWeightTiles, kInFlight, 8, kSplit>;
  }
  return nullptr;
}

template <bool kFp8, bool kSplit>
KernelFn ForShape(int weight_tiles, int chunks_in_flight, int token_tiles) {
  if (weight_tiles == 1 && chunks_in_flight == 2) return ForTokenTiles<kFp8, 1, 2, kSplit>(token_tiles);
  if (weight_tiles == 1 && chunks_in_flight == 4) return ForTokenTiles<kFp8, 1, 4, kSplit>(token_tiles);
  if (weight_tiles == 2 && chunks_in_flight == 2) return ForTokenTiles<kFp8, 2, 2, kSplit>(token_tiles);
  if (weight_tiles == 2 && chunks_in_flight == 4) return ForTokenTiles<kFp8, 2, 4, kSplit>(token_tiles);
  return nullptr;
}

template <bool kSplit>
KernelFn ForWeights(const GroupedMatmulDims& dims, const GroupedMatmulPlan& plan) {
  return dims.weight_type == GroupedWeightType::kFp8E4m3
             ? ForShape<true, kSplit>(plan.weight_tiles, plan.chunks_in_flight, plan.token_tiles)
             : ForShape<false, kSplit>(plan.weight_tiles, plan.chunks_in_flight, plan.token_tiles);
}

KernelFn KernelFor(const GroupedMatmulDims& dims, const GroupedMatmulPlan& plan) {
  return plan.k_slices > 1 ? ForWeights<true>(dims, plan) : ForWeights<false>(dims, plan);
}

// The fewest 8-token tiles (1, 2, 4 or 8) that hold an expert's rows in one
// pass when M rows are routed about uniformly over E experts: the mean plus
// three standard deviations of a Poisson count, and at least twice the mean
// for skewed routing; never more than M needs.
int AutoTokenTiles(int64_t rows, int64_t experts) {
  const double mean = static_cast<double>(rows) / static_cast<double>(experts);
  const double want = std::min(static_cast<double>(rows), std::max(mean + 3.0 * std::sqrt(mean), 2.0 * mean));
  int tiles = 1;
  while (tiles < 8 && tiles * kTokensPerTile < want) tiles *= 2;
  return tiles;
}

// --------------------------------------------------------------------------- the streaming kernel's plan

using StreamKernelFn = void (*)(CUtensorMap, CUtensorMap, GroupedArgs, int);

template <bool kFp8, int kSliceGroups>
StreamKernelFn StreamForTokenTiles(int token_tiles) {
  switch (token_tiles) {
    case 1: return GroupedMatmulStreamKernel<kFp8, 1, kSliceGroups>;
    case 2: return GroupedMatmulStreamKernel<kFp8, 2, kSliceGroups>;
    case 4: return GroupedMatmulStreamKernel<kFp8, 4, kSliceGroups>;
    case 8: return GroupedMatmulStreamKernel<kFp8, 8, kSliceGroups>;
  }
  return nullptr;
}

template <int kSliceGroups>
StreamKernelFn StreamForWeights(const GroupedMatmulDims& dims, int token_tiles) {
  return dims.weight_type == GroupedWeightType::kFp8E4m3 ? StreamForTokenTiles<true, kSliceGroups>(token_tiles)
                                                        : StreamForTokenTiles<false, kSliceGroups>(token_tiles);
}

// The kernel's slice groups: 0 without a split of K, else the plan's 1, 2 or 4.
int StreamKernelGroups(const GroupedMatmulPlan& plan) { return plan.k_slices > 1 ? plan.stream_slice_groups : 0; }

StreamKernelFn StreamKernelFor(const GroupedMatmulDims& dims, const GroupedMatmulPlan& plan) {
  switch (StreamKernelGroups(plan)) {
    case 0: return StreamForWeights<0>(dims, plan.token_tiles);
    case 1: return StreamForWeights<1>(dims, plan.token_tiles);
    case 2: return StreamForWeights<2>(dims, plan.token_tiles);
    case 4: return StreamForWeights<4>(dims, plan.token_tiles);
  }
  return nullptr;
}

// A stage's bytes (each group's 4 chunks of weight rows and x) and the slice sums' area after the
// stages, for `groups` = StreamKernelGroups (0 or 1: no slice groups).
int64_t StreamStageBytes(const GroupedMatmulDims& dims, int token_tiles, int groups) {
  const int g = std::max(groups, 1);
  return dims.weight_type == GroupedWeightType::kFp8E4m3 ? StreamShape<true>::StageBytes(token_tiles, g)
                                                        : StreamShape<false>::StageBytes(token_tiles, g);
}

// Rows of a unit: 128, or 128 / G with G slice groups.
int StreamUnitRows(int groups) { return kStreamRows / std::max(groups, 1); }

// What the streaming kernel needs to know of the current device, asked once per device.
struct StreamDevice {
  bool runs = false;   // compute capability 9.0 or up: TMA bulk copies and mbarrier transactions
  int sms = 0;
  int max_shared = 0;  // dynamic shared memory a block may opt into
  int shared_per_sm = 0;
  int reserved_per_block = 0;  // shared memory the system keeps of each resident block
};

constexpr int kStreamMaxDevices = 64;
// The automatic launch shape of the streaming kernel (GroupedMatmulTuning's stream_* fields): two
// blocks an SM, a block a unit. H100, the slices' shapes (grouped_matmul_bench --slices --ab,
// BENCHMARKS.md): within 1-5% of the fastest of the four shapes everywhere; one persistent block
// an SM lost 5-25% where experts have few rows (the hardware's block scheduler balances units of
// uneven passes better than a fixed round-robin).
constexpr int kStreamAutoBlocksPerSm = 2;
constexpr bool kStreamAutoPersistent = false;
// The streaming kernel by default where experts average at least 2.5 rows (2 M >= 5 E), and below
// that where its units fill between one and two blocks an SM (at most min(E, M) x ceil(N / 128)
// of them have rows). Below 2.5 rows with more units the warp-tile kernel's smaller, more
// numerous blocks measured up to 24% faster (down at 8 and 16 pairs over 32 experts: 384 and 768
// units at most; gate_up at 16 pairs: 512), within one wave the streaming kernel 19-34% faster
// (gate_up at 8 pairs, 256 units at most: 70.2 against 86.4 us on an H100, 56.9 against 86.0 on
// an H200; full-KV's step at batch 1 3.5% shorter, BENCHMARKS.md's sixteenth pass); above 2.5 rows
// the streaming kernel 0-28% faster. Fewer units than SMs were not measured and stay on the
// warp-tile kernel. A split weight stays on the warp-tile kernel by default: the streaming kernel
// runs it (the slices' sums kept in each consumer warp, or in slice groups) when asked
// (GroupedMatmulTuning::stream = 1): on an H200 6-130% slower than the warp-tile kernel at the
// shared expert's shapes but two (even at gate_up's 17 rows, 14% faster at down's).
constexpr int64_t kStreamAutoMinRowsTimes2PerExpert = 5;
// HISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE=0 drops the one-wave rule (the A/B build of the
// deployment slices, benchmarks/gpu_run.sh one-wave-slices); the same bits either way.
#ifndef HISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE
#define HISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE 1
#endif
constexpr bool kStreamAutoOneWave = HISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE != 0;
// 64-token passes stream in 32-token ones where two streaming blocks an SM cannot hold them (see
// GroupedMatmulPlanFor): on an H100, dsv32-h200's 560 pairs over 32 experts 337 against 600 us
// (gate_up) and 181 against 257 us (down) alone, and HiSparse's step at 32K 30.09 -> 27.41 ms
// (BENCHMARKS.md, nineteenth pass). HISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES=0 puts those
// shapes back on the warp-tile kernel (the A/B build, benchmarks/gpu_run.sh token-tiles-slices).
// The same bits either way.
#ifndef HISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES
#define HISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES 1
#endif
constexpr bool kStreamAutoFewerTokenTiles = HISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES != 0;
// HISPARSE_GROUPED_MATMUL_STREAM_SPLIT=G, G = 1, 2 or 4 (CMake: -DHISPARSE_GROUPED_MATMUL_STREAM_SPLIT=ON
// builds G = 1): the automatic plan streams split weights too, whatever their rows, in G slice
// groups: the A/B build of the deployment slices (benchmarks/gpu_run.sh
// grouped-matmul-split-slices). The same bits either way.
#ifndef HISPARSE_GROUPED_MATMUL_STREAM_SPLIT
#define HISPARSE_GROUPED_MATMUL_STREAM_SPLIT 0
#endif
constexpr bool kStreamAutoSplit = HISPARSE_GROUPED_MATMUL_STREAM_SPLIT != 0;
constexpr int kStreamAutoSliceGroups = kStreamAutoSplit ? HISPARSE_GROUPED_MATMUL_STREAM_SPLIT : 1;
static_assert(kStreamAutoSliceGroups == 1 || kStreamAutoSliceGroups == 2 || kStreamAutoSliceGroups == kStreamMaxSliceGroups,
              "HISPARSE_GROUPED_MATMUL_STREAM_SPLIT must be 0, 1, 2 or 4");

// At most this many units of `unit_rows` rows have rows (an expert with rows has at least one).
int64_t StreamUnitsBound(const GroupedMatmulDims& dims, int unit_rows) {
  return std::min<int64_t>(dims.experts, std::max<int64_t>(dims.rows, 1)) * ((dims.n + unit_rows - 1) / unit_rows);
}

cudaError_t StreamDeviceInfo(int* device, StreamDevice* out) {
  static std::array<StreamDevice, kStreamMaxDevices> cache{};
  static std::mutex mutex;
  if (cudaError_t err = cudaGetDevice(device); err != cudaSuccess) return err;
  if (*device < 0 || *device >= kStreamMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mutex);
  StreamDevice& d = cache[*device];
  if (d.sms == 0) {
    int major = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *device); err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&d.max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, *device);
        err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&d.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, *device);
        err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&d.reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, *device);
        err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, *device); err != cudaSuccess)
      return err;
    d.runs = major >= 9;
  }
  *out = d;
  return cudaSuccess;
}

// Opts `kernel` in to all the dynamic shared memory a block may have on `device`, once (a launch
// may then ask for any amount up to it).
cudaError_t StreamOptIn(StreamKernelFn kernel, int device, int64_t bytes) {
  struct Entry {
    StreamKernelFn kernel;
    int device;
  };
  static std::vector<Entry> done;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : done)
    if (e.kernel == kernel && e.device == device) return cudaSuccess;
  if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      err != cudaSuccess)
    return err;
  done.push_back({kernel, device});
  return cudaSuccess;
}

// The stages each of `blocks_per_sm` resident blocks of the streaming kernel keeps in flight for
// `dims` (0: it does not run them here).
int StreamStages(const GroupedMatmulDims& dims, int token_tiles, int groups, int k_slices, int blocks_per_sm,
                 const StreamDevice& device) {
  // The tensor copies' coordinates are int32: a weight row of 2^31 bytes or more stays on the
  // warp-tile kernel.
  const int64_t row_bytes = dims.k * GroupedWeightBytes(dims.weight_type);
  if (!device.runs || kGroupedMatmulTileRows > 0 || row_bytes > INT32_MAX) return 0;
  const int64_t budget =
      std::min<int64_t>(device.max_shared, device.shared_per_sm / blocks_per_sm - device.reserved_per_block);
  const int64_t fit = (budget - kStreamBarrierBytes - StreamPartialBytes(token_tiles, groups, k_slices)) /
                      StreamStageBytes(dims, token_tiles, groups);
  const int stages = static_cast<int>(std::min<int64_t>(kStreamMaxStages, fit));
  return stages >= 2 ? stages : 0;
}

// One launch of the streaming kernel under `plan` (stream_stages > 0) with the warp-tile kernel's
// arguments `p`. *maps_refused: the driver refused a tensor map of w or x (nothing launched).
cudaError_t LaunchStream(const GroupedMatmulDims& dims, const GroupedMatmulBuffers& io, const GroupedMatmulPlan& plan,
                         GroupedArgs p, cudaStream_t stream, bool* maps_refused) {
  int device = 0;
  StreamDevice info;
  if (cudaError_t err = StreamDeviceInfo(&device, &info); err != cudaSuccess) return err;
  const StreamKernelFn kernel = StreamKernelFor(dims, plan);
  const int groups = StreamKernelGroups(plan), unit_rows = StreamUnitRows(groups);
  const int64_t shared = kStreamBarrierBytes + plan.stream_stages * StreamStageBytes(dims, plan.token_tiles, groups) +
                         StreamPartialBytes(plan.token_tiles, groups, plan.k_slices);
  if (cudaError_t err = StreamOptIn(kernel, device, info.max_shared); err != cudaSuccess) return err;
  // w as [E][N][row bytes] in boxes of a unit's rows (128, or 128 / G) x a chunk; x as [M][K] bf16
  // in boxes of a pass's tokens x a chunk's k. Zeros past every edge (grouped_matmul_stream.cuh).
  const bool fp8 = dims.weight_type == GroupedWeightType::kFp8E4m3;
  CUtensorMap w_map, x_map;
  const cuuint64_t w_dims[3] = {static_cast<cuuint64_t>(p.w_row_bytes), static_cast<cuuint64_t>(dims.n),
                                static_cast<cuuint64_t>(dims.experts)};
  const cuuint64_t w_strides[2] = {static_cast<cuuint64_t>(p.w_row_bytes),
                                   static_cast<cuuint64_t>(p.w_row_bytes * dims.n)};
  const cuuint32_t w_box[3] = {kChunkBytes, static_cast<cuuint32_t>(unit_rows), 1};
  const cuuint64_t x_dims[2] = {static_cast<cuuint64_t>(dims.k), static_cast<cuuint64_t>(dims.rows)};
  const cuuint64_t x_strides[1] = {static_cast<cuuint64_t>(p.x_row_bytes)};
  const cuuint32_t x_box[2] = {static_cast<cuuint32_t>(fp8 ? StreamShape<true>::kXChunkElements
                                                           : StreamShape<false>::kXChunkElements),
                               static_cast<cuuint32_t>(kTokensPerTile * plan.token_tiles)};
  if (cudaError_t err = EncodeTensorMap(&w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, io.w, w_dims, w_strides, w_box,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
      err != cudaSuccess)
    return *maps_refused = true, err;
  if (cudaError_t err = EncodeTensorMap(&x_map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, io.x, x_dims, x_strides, x_box,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
      err != cudaSuccess)
    return *maps_refused = true, err;
  const int64_t units = dims.experts * ((dims.n + unit_rows - 1) / unit_rows);
  p.zero_blocks = 0;  // the streaming kernel's blocks write the zero rows themselves
  // Persistent: each resident block takes every grid-th unit. Else a block a unit, and the
  // hardware hands the next unit to whichever SM frees first.
  const int64_t grid = plan.stream_persistent ? std::min<int64_t>(units, int64_t{info.sms} * plan.stream_blocks_per_sm)
                                              : units;
  if (grid > INT32_MAX) return cudaErrorInvalidValue;
  kernel<<<static_cast<unsigned>(grid), kStreamThreads, shared, stream>>>(w_map, x_map, p, plan.stream_stages);
  return cudaGetLastError();
}

}  // namespace

int GroupedMatmulKSlices(const GroupedMatmulDims& dims) {
  const int64_t chunks = (dims.k * GroupedWeightBytes(dims.weight_type) + kChunkBytes - 1) / kChunkBytes;
  const int64_t row_tiles = std::max<int64_t>(1, dims.experts * ((dims.n + kRowsPerWeightTile - 1) / kRowsPerWeightTile));
  int slices = 1;
  while (slices < kGroupedMatmulMaxKSlices && row_tiles * slices < kGroupedMatmulSplitTargetWarps &&
         2 * slices <= chunks)
    slices *= 2;
  return slices;
}

cudaError_t GroupedMatmulPlanFor(const GroupedMatmulDims& dims, const GroupedMatmulTuning& tuning,
                                 GroupedMatmulPlan* plan) {
  if (GroupedMatmulSizeError(dims)[0] != '\0') return cudaErrorInvalidValue;
  GroupedMatmulPlan p;
  p.token_tiles =
      tuning.token_tiles > 0 ? tuning.token_tiles : AutoTokenTiles(std::max<int64_t>(dims.rows, 1), dims.experts);
  // From the sweep of ffi/bench/grouped_matmul_bench.cu on an H200 (BENCHMARKS.md): 2 chunks in
  // flight per row and 4 warps per block were within ~5% of the best variant at every shape;
  // two 16-row weight tiles per warp share each x fragment, except on short weight rows (fp8
  // with K <= 2048, e.g. the down projection), where one tile per warp gives twice the warps
  // to hide the latency of a row that is only a few chunks long.
  const int64_t row_bytes = dims.k * GroupedWeightBytes(dims.weight_type);
  p.chunks_in_flight = tuning.chunks_in_flight > 0 ? tuning.chunks_in_flight : 2;
  // A split K (few weight rows: the shared expert) also takes one tile per warp, for twice the tile groups.
  const bool split = GroupedMatmulKSlices(dims) > 1;
  p.weight_tiles = tuning.weight_tiles > 0 ? tuning.weight_tiles : (row_bytes <= 2048 || split ? 1 : 2);
  p.warps_per_block = tuning.warps_per_block > 0 ? tuning.warps_per_block : 4;
  if (p.warps_per_block > kGroupedMatmulMaxWarps || tuning.tiles_per_warp < 0) return cudaErrorInvalidValue;
  // A split of K, from the weight's shape alone (it fixes y's bits: grouped_matmul.h).
  p.k_slices = GroupedMatmulKSlices(dims);
  // The streaming kernel's fields are checked whichever kernel runs: a value outside the variants
  // is an error, never ignored.
  const int asked_groups = tuning.stream_slice_groups;
  if (tuning.stream < -1 || tuning.stream > 1 || tuning.stream_blocks_per_sm < 0 || tuning.stream_blocks_per_sm > 2 ||
      tuning.stream_persistent < -1 || tuning.stream_persistent > 1 ||
      (asked_groups != 0 && asked_groups != 1 && asked_groups != 2 && asked_groups != kStreamMaxSliceGroups))
    return cudaErrorInvalidValue;
  if (tuning.stream >= 0) {
    int device = 0;
    StreamDevice info;
    if (cudaError_t err = StreamDeviceInfo(&device, &info); err != cudaSuccess) return err;
    // Slice groups group whole slices: at most S of them (none for a weight without a split). The
    // automatic count (the split build's G) is capped at S; S and G are powers of two.
    if (asked_groups > p.k_slices) return cudaErrorNotSupported;
    p.stream_slice_groups = asked_groups > 0 ? asked_groups : std::min(kStreamAutoSliceGroups, p.k_slices);
    const int groups = split ? p.stream_slice_groups : 0;
    // A split weight's units that fit the SMs (the shared expert: 32 or 48 of 128 rows): one block
    // an SM, as many stages as a block alone may hold.
    const int auto_blocks =
        split && StreamUnitsBound(dims, StreamUnitRows(groups)) <= info.sms ? 1 : kStreamAutoBlocksPerSm;
    p.stream_blocks_per_sm = tuning.stream_blocks_per_sm > 0 ? tuning.stream_blocks_per_sm : auto_blocks;
    p.stream_persistent = tuning.stream_persistent != 0 ? tuning.stream_persistent > 0 : kStreamAutoPersistent;
    p.stream_stages = StreamStages(dims, p.token_tiles, groups, p.k_slices, p.stream_blocks_per_sm, info);
    // Passes of 64 tokens (8 tiles: experts averaging ~14 rows or more, e.g. dsv32's 70 tokens x 8
    // of 32 experts) leave two fp8 blocks an SM no room for two stages; on the warp-tile kernel
    // they ran at about half of HBM (BENCHMARKS.md, seventeenth pass). With
    // kStreamAutoFewerTokenTiles (the default) they stream in passes of 32 tokens instead (an
    // expert above 32 rows reads its weights once more; the same bits: a pass's size changes no
    // sum).
    const int warp_tile_token_tiles = p.token_tiles;
    if (p.stream_stages == 0 && tuning.token_tiles <= 0 && p.token_tiles == 8 && kStreamAutoFewerTokenTiles) {
      const int stages = StreamStages(dims, 4, groups, p.k_slices, p.stream_blocks_per_sm, info);
      if (stages > 0) {
        p.token_tiles = 4;
        p.stream_stages = stages;
      }
    }
    if (tuning.stream == 1 && p.stream_stages == 0) return cudaErrorNotSupported;
    const int64_t units = StreamUnitsBound(dims, kStreamRows);
    const bool one_wave = kStreamAutoOneWave && units >= info.sms && units <= int64_t{info.sms} * kStreamAutoBlocksPerSm;
    const bool streams_by_default =
        split ? kStreamAutoSplit : 2 * dims.rows >= kStreamAutoMinRowsTimes2PerExpert * dims.experts || one_wave;
    if (tuning.stream == 0 && !streams_by_default) p.stream_stages = 0;
    if (p.stream_stages == 0) p.token_tiles = warp_tile_token_tiles;  // the warp-tile kernel keeps its passes
  }
  const KernelFn kernel = KernelFor(dims, p);
  if (kernel == nullptr) return cudaErrorInvalidValue;  // a tuning value outside the variants

  // The block's warps are whole tile groups of k_slices warps each; a warp count below one
  // group becomes one group, and a count that is not a multiple of k_slices is cut to one.
  p.warps_per_block = std::max(1, p.warps_per_block / p.k_slices) * p.k_slices;
  if (p.warps_per_block > kGroupedMatmulMaxWarps) return cudaErrorInvalidValue;

  // One warp tile per warp by default: more warps than fit at once (several waves) measured
  // faster than one wave of warps that each stream several tiles (the sweep's q1 column).
  const int64_t warp_tiles = std::max<int64_t>(1, (dims.n + 16 * p.weight_tiles - 1) / (16 * p.weight_tiles));
  p.tiles_per_warp = tuning.tiles_per_warp > 0 ? static_cast<int>(std::min<int64_t>(tuning.tiles_per_warp, warp_tiles))
                                                : 1;
  const int64_t groups_per_expert = (warp_tiles + p.tiles_per_warp - 1) / p.tiles_per_warp;
  const int64_t groups_per_block = p.warps_per_block / p.k_slices;
  p.blocks_per_expert = static_cast<int>((groups_per_expert + groups_per_block - 1) / groups_per_block);
  *plan = p;
  return cudaSuccess;
}

cudaError_t LaunchGroupedMatmul(const GroupedMatmulDims& dims, const GroupedMatmulBuffers& io,
                                cudaStream_t stream, const GroupedMatmulTuning& tuning) {
  GroupedMatmulPlan plan;
  if (cudaError_t err = GroupedMatmulPlanFor(dims, tuning, &plan); err != cudaSuccess) return err;
  if (kGroupedMatmulTileRows > 0 &&
      !TiledWeightsFit(dims.n, dims.k * GroupedWeightBytes(dims.weight_type), kGroupedMatmulTileRows))
    return cudaErrorNotSupported;  // the tiled experiment's domain (grouped_matmul_tiled.h)
  if (dims.rows == 0 || dims.n == 0) return cudaSuccess;
  if (!Aligned(io.x, 16) || !Aligned(io.w, 16) || !Aligned(io.scale, 4) || !Aligned(io.group_sizes, 4) ||
      !Aligned(io.y, 4))
    return cudaErrorInvalidValue;

  GroupedArgs p;
  p.x = static_cast<const uint8_t*>(io.x);
  p.w = static_cast<const uint8_t*>(io.w);
  p.scale = io.scale;
  p.sizes = io.group_sizes;
  p.y = io.y;
  p.rows = dims.rows;
  p.n = dims.n;
  p.w_row_bytes = dims.k * GroupedWeightBytes(dims.weight_type);
  p.x_row_bytes = 2 * dims.k;
  p.experts = static_cast<int32_t>(dims.experts);
  p.chunks = static_cast<int32_t>((p.w_row_bytes + kChunkBytes - 1) / kChunkBytes);
  p.blocks_per_expert = plan.blocks_per_expert;
  p.tiles_per_warp = plan.tiles_per_warp;
  p.zero_blocks = static_cast<int32_t>(std::min<int64_t>(kGroupedMatmulMaxZeroBlocks, dims.rows));
  p.k_slices = plan.k_slices;
  p.slice_chunks = (p.chunks + plan.k_slices - 1) / plan.k_slices;
  if (plan.stream_stages > 0) {
    bool maps_refused = false;
    const cudaError_t err = LaunchStream(dims, io, plan, p, stream, &maps_refused);
    // A shape the driver's tensor maps refuse runs on the warp-tile kernel, unless the caller
    // asked for the streaming kernel.
    if (!maps_refused || tuning.stream == 1) return err;
  }
  const int64_t blocks = p.zero_blocks + dims.experts * plan.blocks_per_expert;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const size_t partial_bytes = plan.k_slices > 1 ? plan.warps_per_block * 4 * kWarp * sizeof(float) : 0;
  KernelFor(dims, plan)<<<static_cast<unsigned>(blocks), plan.warps_per_block * kWarp, partial_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace hisparse

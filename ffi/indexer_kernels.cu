// The lightning indexer's scores on CUDA: the contract of indexer.h, the plan
// of indexer_cuda.h, the shared device pieces (fragment layouts, fp8
// widening, q staging, key copies) in indexer_device.cuh.
//
// Both kernels run the same tensor-core steps on the same operands in the
// same order: for each 16-token m-tile and n-tile of 8 heads, one
// m16n8k16 per 16-wide chunk of d, chunks in increasing order, accumulated
// from zero; then each lane folds its heads 8n + 2c + j (n, then j,
// increasing) into one FMA chain per token, and the quad adds its chains as
// (c0 + c1) + (c2 + c3). So they write the same bits (the benchmark checks it).
//
// Shared memory of a block: [q: kQSplit copies of heads_padded rows][w:
// heads_padded floats][per warp: kStages stages of tile-tokens key rows (+ as
// many fp8 scales)]. Each warp runs its own cp.async ring over its tiles (tile
// k of the warp in stage k mod kStages, kStages - 1 tiles in flight);
// __syncwarp orders the ring's reuse, __syncthreads only brackets the staging
// of a new row's q.
//
// The general kernel reads q's B fragments from shared memory for every tile
// (ldmatrix), in passes of 8 * kNTiles heads. The register-q kernel loads them
// into registers once per row (2 * kNTiles * d / 16 registers: 128 at H = 64,
// d = 128), so per 16-token tile a warp reads only the tile's keys from shared
// memory (one ldmatrix x4 per k-step, bf16; per two k-steps, fp8), loads the
// next k-step's keys while the current one's 8 MMAs run, and its ring runs on
// across a row change (the issue cursor walks the warp's tiles in all the
// block's rows; only the scoring waits for the new row's q).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common.h"
#include "indexer_cuda.h"
#include "wgmma.cuh"
#include "indexer_device.cuh"

namespace hisparse {
namespace {

using namespace indexer_device;  // NOLINT: this file is their one user

constexpr int kMaxDevices = 64;

// =========================================================================== the general kernel

constexpr int kTile = kIndexerTileTokens;
constexpr int kMTiles = kTile / 16;
static_assert(kTile == 32, "the epilogue gives each lane of a warp one token of the tile");

// Scores tile rows [0, valid) from a landed stage and writes the tile's
// tokens (-inf from `valid` on).
template <int kQSplit, bool kFp8, int kNTiles>
__device__ __forceinline__ void ScoreTile(const IndexerArgs& p, const uint8_t* q_smem, const float* w_smem,
                                          const uint8_t* stage, int64_t row, int64_t t0, int valid,
                                          float factor, int lane) {
  if (valid <= 0) {  // past lengths[row]: no key was copied
    if (t0 + lane < p.tokens) p.scores[row * p.tokens + t0 + lane] = -INFINITY;
    return;
  }
  const int g = lane / 4, c4 = lane % 4;
  const uint32_t q_base = SharedAddress(q_smem);
  const uint32_t stage_base = SharedAddress(stage);
  const int chunks = p.dim / 16;
  float token_sum[kMTiles][2], scale[kMTiles][2];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      token_sum[m][half] = 0.0f;
      scale[m][half] = kFp8 ? reinterpret_cast<const float*>(stage + kTile * p.key_stride)[16 * m + g + 8 * half]
                            : 1.0f;
    }
  }

  for (int pass = 0; pass < p.passes; ++pass) {
    const int head0 = pass * 8 * kNTiles;
    float acc[kMTiles][kNTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

#pragma unroll 2
    for (int c = 0; c < chunks; ++c) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        if constexpr (kFp8) {
          const uint8_t* top = stage + (16 * m + g) * p.key_stride + 16 * c + 4 * c4;
          const uint32_t w0 = *reinterpret_cast<const uint32_t*>(top);
          const uint32_t w1 = *reinterpret_cast<const uint32_t*>(top + 8 * p.key_stride);
          Fp8Fragment(w0, w1, a[m]);
        } else {
          // Lane l addresses row l % 8 of matrix l / 8: (tokens 0-7 | 8-15) x (k 0-7 | 8-15).
          LoadMatrixX4(stage_base + (16 * m + lane % 16) * p.key_stride + 16 * (2 * c + lane / 16), a[m]);
        }
      }
#pragma unroll
      for (int s = 0; s < kQSplit; ++s) {
#pragma unroll
        for (int n = 0; n < kNTiles; n += 2) {
          // Matrices: (heads of tile n | n + 1) x (k 0-7 | 8-15) -> b0, b1 of tile n, then of n + 1.
          uint32_t b[4];
          const int head = head0 + 8 * (n + lane / 16) + lane % 8;
          LoadMatrixX4(q_base + s * p.q_copy_bytes + head * p.q_stride + 16 * (2 * c + (lane / 8) % 2), b);
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
            Mma(acc[m][n], a[m], b[0], b[1]);
            Mma(acc[m][n + 1], a[m], b[2], b[3]);
          }
        }
      }
    }

    // relu(dot * scale) * w, summed into this lane's chain: heads 2 c4 + j of each n-tile.
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int head = head0 + 8 * n + 2 * c4 + j;
        if (head >= p.heads) continue;
        const float w = w_smem[head];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float x = acc[m][n][2 * half + j];
            if constexpr (kFp8) x *= scale[m][half];
            token_sum[m][half] = fmaf(w, Relu(x), token_sum[m][half]);
          }
        }
      }
    }
  }

  // (chain 0 + chain 1) + (chain 2 + chain 3); every lane of the quad ends with the same bits.
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      token_sum[m][half] += __shfl_xor_sync(kFullMask, token_sum[m][half], 1);
      token_sum[m][half] += __shfl_xor_sync(kFullMask, token_sum[m][half], 2);
    }
  }
  // Lane (g, c4) writes token 16 (c4 / 2) + g + 8 (c4 % 2): the 32 lanes cover the tile once.
  const int m = c4 / 2, half = c4 % 2;
  const float sum = m == 0 ? (half == 0 ? token_sum[0][0] : token_sum[0][1])
                           : (half == 0 ? token_sum[1][0] : token_sum[1][1]);
  const int r = 16 * m + g + 8 * half;
  if (t0 + r < p.tokens) {
    float out = -INFINITY;
    if (r < valid) out = kFp8 ? sum * factor : sum;
    p.scores[row * p.tokens + t0 + r] = out;
  }
}

template <int kQSplit, bool kFp8, int kNTiles, int kStages>
__global__ void __launch_bounds__(kIndexerMaxWarps* kWarp, 1) IndexScoresKernel(const IndexerArgs p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t warp_max[kIndexerMaxWarps];
  uint8_t* q_smem = smem;
  float* w_smem = reinterpret_cast<float*>(smem + kQSplit * p.q_copy_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  uint8_t* ring = smem + kQSplit * p.q_copy_bytes + p.w_bytes + warp * kStages * p.stage_bytes;
  const uint32_t ring_base = SharedAddress(ring);
  const CopyWalk walk = CopyWalkFor(p, lane);

  // This block's tiles: a contiguous range of the row-major (row, tile) list.
  const int64_t share = p.total_tiles / gridDim.x, extra = p.total_tiles % gridDim.x;
  const int64_t begin = blockIdx.x * share + Min64(blockIdx.x, extra);
  const int64_t end = begin + share + (blockIdx.x < extra ? 1 : 0);

  for (int64_t lo = begin; lo < end;) {
    const int64_t row = lo / p.tiles_per_row;
    const int64_t row_end = Min64(end, (row + 1) * p.tiles_per_row);
    __syncthreads();  // the previous row's q and w are no longer read
    const float factor = StageQuery<kQSplit, kFp8>(p, row, q_smem, w_smem, warp_max);
    __syncthreads();
    const int64_t limit = RowLimit(p, row);
    const int64_t first = lo - row * p.tiles_per_row + warp, last = row_end - row * p.tiles_per_row;
    const int64_t count = first < last ? (last - first + warps - 1) / warps : 0;
    auto tile_start = [&](int64_t k) { return (first + k * warps) * kTile; };

#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) {
      if (k < count) {
        const int64_t t0 = tile_start(k);
        IssueTile<kTile, kFp8>(p, ring_base + k * p.stage_bytes, row, t0, TileValid<kTile>(limit, t0), lane, walk);
      }
      CommitAsync();
    }
    for (int64_t k = 0; k < count; ++k) {
      const int64_t ahead = k + kStages - 1;
      if (ahead < count) {
        const int64_t t0 = tile_start(ahead);
        IssueTile<kTile, kFp8>(p, ring_base + static_cast<int>(ahead % kStages) * p.stage_bytes, row, t0,
                               TileValid<kTile>(limit, t0), lane, walk);
      }
      CommitAsync();
      WaitAsync<kStages - 1>();  // tile k's group has landed (this lane's copies)
      __syncwarp();              // ... and every lane's
      const int64_t t0 = tile_start(k);
      ScoreTile<kQSplit, kFp8, kNTiles>(p, q_smem, w_smem, ring + static_cast<int>(k % kStages) * p.stage_bytes,
                                        row, t0, TileValid<kTile>(limit, t0), factor, lane);
      __syncwarp();  // the stage is read before a later issue overwrites it
    }
    WaitAsync<0>();
    lo = row_end;
  }
}

// =========================================================================== the register-q kernel

constexpr int kRegMaxKSteps = static_cast<int>(kIndexerRegisterMaxDim / 16);
static_assert(kRegMaxKSteps % 2 == 0, "fp8 keys are loaded two k-steps at a time");

// This lane's B fragments of every k-step and n-tile of the staged q: the q
// operands of every tensor-core step of a tile, loaded once per row.
template <int kMaxK, int kNTiles>
__device__ __forceinline__ void LoadQueryFragments(const IndexerArgs& p, const uint8_t* q_smem, int ksteps,
                                                   int lane, uint32_t (&qf)[kMaxK][kNTiles][2]) {
  // Matrices: (heads of n-tile n | n + 1) x (k 0-7 | 8-15) -> b0, b1 of n-tile n, then of n + 1.
  const uint32_t base =
      SharedAddress(q_smem) + (8 * (lane / 16) + lane % 8) * p.q_stride + 16 * ((lane / 8) % 2);
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    if (k >= ksteps) break;
#pragma unroll
    for (int n = 0; n < kNTiles; n += 2) {
      uint32_t b[4];
      LoadMatrixX4(base + 8 * n * p.q_stride + 32 * k, b);
      qf[k][n][0] = b[0];
      qf[k][n][1] = b[1];
      qf[k][n + 1][0] = b[2];
      qf[k][n + 1][1] = b[3];
    }
  }
}

// The 32 bytes of d of k-steps 2j, 2j + 1 (or the 16 of step 2j alone when
// `both` is false) of the tile's tokens g and g + 8: words[0], words[1] for
// step 2j, words[2], words[3] for step 2j + 1. Matrices (tokens 0-7 | 8-15) x
// (bytes 0-15 | 16-31); lane l addresses token l % 16, 16-byte half l / 16.
__device__ __forceinline__ void LoadFp8Pair(uint32_t address, bool both, uint32_t (&words)[4]) {
  if (both) {
    LoadMatrixX4(address, words);
  } else {
    LoadMatrixX2(address, words[0], words[1]);
  }
}

// acc[m][n] = the dot products of m-tile m's 16 tokens with the heads of
// n-tile n (C fragments): k-steps in increasing order, accumulated from zero.
// a_base is this lane's ldmatrix address of k-step 0 of m-tile 0 (token
// lane % 16, 16-byte half lane / 16); m-tile m is 16 key rows further, k-step
// k 32 bytes further per step (bf16), per pair (fp8). The m-tiles' MMAs are
// interleaved within each k-step: kMTiles x kNTiles independent accumulator
// chains keep the tensor pipe busy while one MMA's result is pending.
template <bool kFp8, int kNTiles, int kMaxK, int kMTiles>
__device__ __forceinline__ void TileDots(uint32_t a_base, int key_stride, int ksteps,
                                         const uint32_t (&qf)[kMaxK][kNTiles][2],
                                         float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
  if constexpr (!kFp8) {
    uint32_t a[2][kMTiles][4];  // k-step k in a[k % 2]; the next one loads while k's MMAs run
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) LoadMatrixX4(a_base + 16 * m * key_stride, a[0][m]);
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      if (k >= ksteps) break;
      if (k + 1 < kMaxK && k + 1 < ksteps) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
          LoadMatrixX4(a_base + 16 * m * key_stride + 32 * (k + 1), a[(k + 1) % 2][m]);
      }
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) Mma(acc[m][n], a[k % 2][m], qf[k][n][0], qf[k][n][1]);
    }
  } else {
    uint32_t words[2][kMTiles][4];  // pair j in words[j % 2]; the next pair loads while j's MMAs run
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) LoadFp8Pair(a_base + 16 * m * key_stride, ksteps > 1, words[0][m]);
#pragma unroll
    for (int j = 0; 2 * j < kMaxK; ++j) {
      if (2 * j >= ksteps) break;
      if (2 * j + 2 < kMaxK && 2 * j + 2 < ksteps) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
          LoadFp8Pair(a_base + 16 * m * key_stride + 32 * (j + 1), 2 * j + 3 < ksteps, words[(j + 1) % 2][m]);
      }
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        uint32_t a[4];
        Fp8Fragment(words[j % 2][m][0], words[j % 2][m][1], a);
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) Mma(acc[m][n], a, qf[2 * j][n][0], qf[2 * j][n][1]);
      }
      if (2 * j + 1 < ksteps) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          uint32_t a[4];
          Fp8Fragment(words[j % 2][m][2], words[j % 2][m][3], a);
#pragma unroll
          for (int n = 0; n < kNTiles; ++n) Mma(acc[m][n], a, qf[2 * j + 1][n][0], qf[2 * j + 1][n][1]);
        }
      }
    }
  }
}

// relu(dot * scale) * w of this lane's heads 8n + 2 c4 + j (n, then j,
// increasing; heads >= H skipped when kCheckHeads) summed into one chain per
// token: `top` for token g, `bottom` for token g + 8.
template <bool kFp8, int kNTiles, bool kCheckHeads>
__device__ __forceinline__ void TileChains(const float (&acc)[kNTiles][4], const float (&w)[kNTiles][2],
                                           float scale_top, float scale_bottom, int heads, int c4, float& top,
                                           float& bottom) {
  top = 0.0f;
  bottom = 0.0f;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (kCheckHeads && 8 * n + 2 * c4 + j >= heads) continue;
      float x_top = acc[n][j], x_bottom = acc[n][2 + j];
      if constexpr (kFp8) {
        x_top *= scale_top;
        x_bottom *= scale_bottom;
      }
      top = fmaf(w[n][j], Relu(x_top), top);
      bottom = fmaf(w[n][j], Relu(x_bottom), bottom);
    }
  }
}

// Scores tile rows [0, valid) of a landed stage of kMTiles m16 tiles and
// writes the tile's tokens (-inf from `valid` on). Each token goes through
// the same steps whatever kMTiles is, so every shape writes the same bits.
template <bool kFp8, int kNTiles, int kMaxK, int kMTiles>
__device__ __forceinline__ void ScoreRegisterTile(const IndexerArgs& p, const uint32_t (&qf)[kMaxK][kNTiles][2],
                                                  const float (&w)[kNTiles][2], bool all_heads, const uint8_t* stage,
                                                  int key_stride, int64_t row, int64_t t0, int valid, int ksteps,
                                                  float factor, int lane) {
  constexpr int kTokens = 16 * kMTiles;
  float* out = p.scores + row * p.tokens + t0;
  if (valid <= 0) {  // past lengths[row]: no key was copied
    for (int i = lane; i < kTokens; i += kWarp)
      if (t0 + i < p.tokens) out[i] = -INFINITY;
    return;
  }
  const int g = lane / 4, c4 = lane % 4;
  float acc[kMTiles][kNTiles][4];
  TileDots<kFp8, kNTiles, kMaxK, kMTiles>(SharedAddress(stage) + (lane % 16) * key_stride + 16 * (lane / 16),
                                          key_stride, ksteps, qf, acc);
  const float* scale = reinterpret_cast<const float*>(stage + kTokens * key_stride);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    const float scale_top = kFp8 ? scale[16 * m + g] : 1.0f;
    const float scale_bottom = kFp8 ? scale[16 * m + g + 8] : 1.0f;
    float top, bottom;
    if (all_heads) {
      TileChains<kFp8, kNTiles, false>(acc[m], w, scale_top, scale_bottom, p.heads, c4, top, bottom);
    } else {
      TileChains<kFp8, kNTiles, true>(acc[m], w, scale_top, scale_bottom, p.heads, c4, top, bottom);
    }
    // (chain 0 + chain 1) + (chain 2 + chain 3); every lane of the quad ends with the same bits.
    top += __shfl_xor_sync(kFullMask, top, 1);
    top += __shfl_xor_sync(kFullMask, top, 2);
    bottom += __shfl_xor_sync(kFullMask, bottom, 1);
    bottom += __shfl_xor_sync(kFullMask, bottom, 2);
    // Lanes c4 = 0 and 1 of quad g write tokens g and g + 8 of the m-tile.
    if (c4 < 2) {
      const int r = 16 * m + g + 8 * c4;
      const float sum = c4 == 0 ? top : bottom;
      if (t0 + r < p.tokens) out[r] = r < valid ? (kFp8 ? sum * factor : sum) : -INFINITY;
    }
  }
}

// Where a warp's next key copy goes: tile `tile` of row `row`, whose scored
// tokens are [0, limit). Advancing by the block's warp count walks into the
// next rows without a division.
struct IssueCursor {
  int64_t row, tile, limit;
};

// kKSteps: d / 16 fixed at compile time (d = 128: the key row widths, strides
// and copies are constants), or 0 for any d <= 128 counted at run time.
// kMTiles: m16 tiles per warp tile (16 kMTiles tokens); kMaxWarps: the block's
// warps at most (their registers: 64K / (32 kMaxWarps) per thread).
template <bool kFp8, int kNTiles, int kKSteps, int kStages, int kMTiles, int kMaxWarps>
__global__ void __launch_bounds__(kMaxWarps* kWarp, 1) IndexScoresRegisterKernel(const IndexerArgs p) {
  constexpr int kMaxK = kKSteps > 0 ? kKSteps : kRegMaxKSteps;
  constexpr int kRegTile = 16 * kMTiles;
  constexpr int kUnits = kKSteps > 0 ? (kFp8 ? kKSteps : 2 * kKSteps) : 0;  // 16-byte units per key row
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t warp_max[kMaxWarps];
  uint8_t* q_smem = smem;
  float* w_smem = reinterpret_cast<float*>(smem + p.q_copy_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  const uint8_t* ring = smem + p.q_copy_bytes + p.w_bytes + warp * kStages * p.stage_bytes;
  const uint32_t ring_base = SharedAddress(ring);
  const CopyWalk walk = CopyWalkFor(p, lane);
  const int ksteps = kKSteps > 0 ? kKSteps : p.dim / 16;
  const int key_stride = kUnits > 0 ? PaddedKeyStride<(kUnits > 0 ? kUnits : 1)>() : p.key_stride;
  const bool all_heads = p.heads == 8 * kNTiles;

  // This block's tiles: a contiguous range of the row-major (row, tile) list.
  // This warp's: begin + warp + k * warps for k < count, across the range's rows.
  const int64_t share = p.total_tiles / gridDim.x, extra = p.total_tiles % gridDim.x;
  const int64_t begin = blockIdx.x * share + Min64(blockIdx.x, extra);
  const int64_t end = begin + share + (blockIdx.x < extra ? 1 : 0);
  const int64_t first = begin + warp;
  const int64_t count = first < end ? (end - first + warps - 1) / warps : 0;

  IssueCursor next;  // the warp's tile number `issued`
  next.row = first / p.tiles_per_row;
  next.tile = first - next.row * p.tiles_per_row;
  next.limit = count > 0 ? RowLimit(p, next.row) : 0;
  int64_t issued = 0;
  // Starts tile `issued` into stage `stage` (when the warp has one) and commits one group either way:
  // one group per tile, empty past the end, so the wait_group counts stay exact.
  auto issue_next = [&](int stage) {
    if (issued < count) {
      const int64_t t0 = next.tile * kRegTile;
      const int valid = TileValid<kRegTile>(next.limit, t0);
      const uint32_t dst = ring_base + stage * p.stage_bytes;
      if constexpr (kUnits > 0) {
        IssueTileFixed<kRegTile, kFp8, (kUnits > 0 ? kUnits : 1)>(p, dst, next.row, t0, valid, lane);
      } else {
        IssueTile<kRegTile, kFp8>(p, dst, next.row, t0, valid, lane, walk);
      }
      next.tile += warps;
      if (next.tile >= p.tiles_per_row) {
        do {
          next.tile -= p.tiles_per_row;
          ++next.row;
        } while (next.tile >= p.tiles_per_row);
        if (issued + 1 < count) next.limit = RowLimit(p, next.row);
      }
    }
    ++issued;
    CommitAsync();
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next(s);
  int64_t k = 0;  // the warp's next tile to score, in stage `stage`
  int stage = 0;
  for (int64_t lo = begin; lo < end;) {
    const int64_t row = lo / p.tiles_per_row;
    const int64_t row_end = Min64(end, (row + 1) * p.tiles_per_row);
    __syncthreads();  // the previous row's q and w are no longer read
    const float factor = StageQuery<1, kFp8>(p, row, q_smem, w_smem, warp_max);
    __syncthreads();
    uint32_t qf[kMaxK][kNTiles][2];
    LoadQueryFragments<kMaxK, kNTiles>(p, q_smem, ksteps, lane, qf);
    float w[kNTiles][2];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      w[n][0] = w_smem[8 * n + 2 * (lane % 4)];
      w[n][1] = w_smem[8 * n + 2 * (lane % 4) + 1];
    }
    const int64_t limit = RowLimit(p, row);
    const int64_t k_end = first < row_end ? (row_end - first + warps - 1) / warps : 0;
    int64_t t0 = (first + k * warps - row * p.tiles_per_row) * kRegTile;  // of tile k
    for (; k < k_end; ++k, t0 += warps * kRegTile) {
      issue_next(stage == 0 ? kStages - 1 : stage - 1);  // tile k + kStages - 1, in tile k - 1's stage
      WaitAsync<kStages - 1>();                          // tile k's group has landed (this lane's copies)
      __syncwarp();                                      // ... and every lane's
      ScoreRegisterTile<kFp8, kNTiles, kMaxK, kMTiles>(p, qf, w, all_heads, ring + stage * p.stage_bytes,
                                                       key_stride, row, t0, TileValid<kRegTile>(limit, t0), ksteps,
                                                       factor, lane);
      __syncwarp();  // the stage is read before a later issue overwrites it
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    lo = row_end;
  }
  WaitAsync<0>();
}

#include "indexer_wgmma.cuh"

// =========================================================================== launch

struct Layout {
  int32_t heads_padded, passes, q_stride, q_copy_bytes, w_bytes, key_units, key_stride, stage_bytes;
};

// Odd 16-byte units per row: 8 rows at one column hit 8 different bank groups.
int32_t PaddedStride(int64_t row_bytes) { return static_cast<int32_t>(16 * ((row_bytes / 16) | 1)); }

int NTilesFor(int64_t heads) { return heads <= 16 ? 2 : heads <= 32 ? 4 : 8; }

// Which kernel runs and the shape its launch needs.
struct Plan {
  bool registers;   // the register-q kernel (else the general one)
  bool wgmma;       // the wgmma kernel (shape k64wg)
  int stage_tokens;  // key rows of one ring stage (tile_tokens, or the warp's 16 of a warpgroup tile)
  IndexerRegisterShape shape;  // of the register-q kernel
  int tile_tokens;  // per warp tile
  int n_tiles;      // n-tiles of 8 heads per pass
  int stages;       // per warp ring
  int max_warps;    // per block
  int q_split;      // bf16 copies of q (3 for float32 q)
};

// The register-q shapes' compile-time parameters (IndexerRegisterShape).
// Stages: fp8 / bf16 per warp ring, so that the block's rings hold ~150-190
// KB (k16x8's 10 / 6 are the first version's).
struct ShapeParams {
  int m_tiles, max_warps, stages_fp8, stages_bf16;
};
constexpr ShapeParams kShapeParams[kIndexerRegisterShapes] = {
    {1, 8, kIndexerRegisterStagesFp8, kIndexerRegisterStagesBf16},  // kAuto: unused
    {1, 8, kIndexerRegisterStagesFp8, kIndexerRegisterStagesBf16},  // k16x8
    {2, 8, 5, 3},                                                   // k32x8
    {1, 16, 5, 3},                                                  // k16x16
    {2, 12, 3, 2},                                                  // k32x12
    {4, 6, 3, 2},                                                   // k64x6
    {4, 16, 5, 0},                                                  // k64wg: 64 tokens a warpgroup, 16 a warp
};
constexpr ShapeParams Params(IndexerRegisterShape s) { return kShapeParams[static_cast<int>(s)]; }

// Whether the register-q kernel was built with `shape` for these operands.
bool ShapeBuilt(const IndexerDims& d, IndexerRegisterShape shape) {
  if (shape == IndexerRegisterShape::kAuto || shape == IndexerRegisterShape::k16x8) return true;
  if (static_cast<int>(shape) < 0 || static_cast<int>(shape) >= kIndexerRegisterShapes) return false;
  if (d.dim != kIndexerRegisterMaxDim || d.heads <= 16) return false;
  if (shape == IndexerRegisterShape::k64wg) {
#ifdef HISPARSE_SM90A
    return d.key_type == IndexKeyType::kFp8E4m3;
#else
    return false;
#endif
  }
  return shape == IndexerRegisterShape::k32x8 || d.heads <= 32;
}

// The automatic shape, from the decode table of ffi/bench/indexer_bench.cu
// --decode on an H200 (fp8 keys, d = 128; runs 6 and 8 of 2026-12-04):
//   - 16 < H <= 32 (GLM-5): k32x12, 0.73 (b 17) to 0.85 (b 41) of 4.3 TB/s at
//     128K-256K keys a request, against 0.58-0.65 for k16x8 (b 17 x 128K:
//     94 us, main's kernel 131); up to 2^16 tokens a launch (1-2 x 32K) k32x8,
//     which is 0.4-0.9 us faster there (1 x 32K: 8.4 against 9.1 us).
//   - 32 < H <= 64 (DeepSeek-V3.2): the wgmma kernel where it is built (sm_90a;
//     equal or faster at every batch: b 17 x 128K 134.6 us, k32x8 144.4,
//     k16x8 155.3), else k32x8 from 2^20 tokens a launch (b 10 x 128K and up)
//     and k16x8 below (b 1-2 x 128K: 18.7 / 30.2 us against 19.6 / 31.6).
// The mma.sync shapes write the same bits, so choosing among them by the size
// of the batch keeps a request's scores batch-invariant. The wgmma kernel's
// bits are not promised equal to theirs (they were in every case checked), so
// it is chosen for all batches of its operands or for none.
// bf16 keys keep k16x8: the other shapes were not measured with them.
IndexerRegisterShape RegisterShapeFor(const IndexerDims& d) {
  using S = IndexerRegisterShape;
  if (d.key_type != IndexKeyType::kFp8E4m3 || d.dim != kIndexerRegisterMaxDim || d.heads <= 16) return S::k16x8;
  if (d.heads <= 32) return d.rows * d.tokens <= (int64_t{1} << 16) ? S::k32x8 : S::k32x12;
  if (ShapeBuilt(d, S::k64wg)) return S::k64wg;
  return d.rows * d.tokens >= (int64_t{1} << 20) ? S::k32x8 : S::k16x8;
}

bool RegisterQueryApplies(const IndexerDims& d) {
  return d.query_type == IndexQueryType::kBf16 && d.heads <= kIndexerRegisterMaxHeads &&
         d.dim <= kIndexerRegisterMaxDim;
}

Plan PlanFor(const IndexerDims& d, bool registers, IndexerRegisterShape shape = IndexerRegisterShape::kAuto) {
  const bool fp8 = d.key_type == IndexKeyType::kFp8E4m3;
  Plan plan;
  plan.registers = registers;
  plan.n_tiles = NTilesFor(d.heads);
  plan.shape = IndexerRegisterShape::k16x8;
  plan.wgmma = false;
  if (registers) {
    plan.shape = shape == IndexerRegisterShape::kAuto ? RegisterShapeFor(d) : shape;
    if (!ShapeBuilt(d, plan.shape)) plan.shape = IndexerRegisterShape::k16x8;
    const ShapeParams sp = Params(plan.shape);
    plan.wgmma = plan.shape == IndexerRegisterShape::k64wg;
    plan.tile_tokens = 16 * sp.m_tiles;
    plan.stage_tokens = plan.wgmma ? 16 : plan.tile_tokens;
    plan.stages = fp8 ? sp.stages_fp8 : sp.stages_bf16;
    plan.max_warps = sp.max_warps;
    plan.q_split = 1;
  } else {
    plan.tile_tokens = kIndexerTileTokens;
    plan.stage_tokens = plan.tile_tokens;
    plan.stages = fp8 ? kIndexerStagesFp8 : kIndexerStagesBf16;
    plan.max_warps = kIndexerMaxWarps;
    plan.q_split = d.query_type == IndexQueryType::kF32 ? 3 : 1;
  }
  return plan;
}

Layout LayoutFor(const IndexerDims& d, const Plan& plan) {
  const bool fp8 = d.key_type == IndexKeyType::kFp8E4m3;
  Layout l;
  l.passes = static_cast<int32_t>((d.heads + 8 * plan.n_tiles - 1) / (8 * plan.n_tiles));
  l.heads_padded = l.passes * 8 * plan.n_tiles;
  l.q_stride = PaddedStride(2 * d.dim);
  // wgmma reads q as contiguous core matrices (no padding: its reads are not ldmatrix rows).
  l.q_copy_bytes = plan.wgmma ? static_cast<int32_t>(l.heads_padded * 2 * d.dim) : l.heads_padded * l.q_stride;
  l.w_bytes = (4 * l.heads_padded + 15) / 16 * 16;
  const int64_t key_row_bytes = fp8 ? d.dim : 2 * d.dim;
  l.key_units = static_cast<int32_t>(key_row_bytes / 16);
  l.key_stride = PaddedStride(key_row_bytes);
  l.stage_bytes = plan.stage_tokens * l.key_stride + (fp8 ? plan.stage_tokens * 4 : 0);
  return l;
}

int64_t FixedSharedBytes(const Layout& l, const Plan& plan) {
  return static_cast<int64_t>(plan.q_split) * l.q_copy_bytes + l.w_bytes;
}

int64_t WarpSharedBytes(const Layout& l, const Plan& plan) {
  return static_cast<int64_t>(plan.stages) * l.stage_bytes;
}

struct DeviceLimits {
  int sms = 0;
  int max_shared = 0;  // dynamic shared memory a block may opt into
};

cudaError_t Limits(DeviceLimits* out) {
  static std::array<DeviceLimits, kMaxDevices> cache{};
  static std::mutex mutex;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::lock_guard<std::mutex> lock(mutex);
  DeviceLimits& l = cache[device];
  if (l.sms == 0) {
    int optin = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device);
        err != cudaSuccess)
      return err;
    if (cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        err != cudaSuccess)
      return err;
    l.max_shared = optin - static_cast<int>(sizeof(uint32_t) * kIndexerRegisterMaxWarps);  // minus the static part
  }
  *out = l;
  return cudaSuccess;
}

using KernelFn = void (*)(IndexerArgs);

// Blocks of `warps` warps and `shared` dynamic bytes of `kernel` that fit on
// one SM. Once per kernel and device it opts the kernel in to large shared
// memory; answers are cached, so a call under CUDA-graph capture only
// enqueues the launch.
cudaError_t ResidentBlocks(KernelFn kernel, int max_shared, int warps, int64_t shared, int* blocks) {
  struct Entry {
    KernelFn kernel;
    int device;
    int warps;      // 0: the opt-in record
    int64_t shared;
    int blocks;
  };
  static std::vector<Entry> cache;
  static std::mutex mutex;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mutex);
  bool opted = false;
  for (const Entry& e : cache) {
    if (e.kernel != kernel || e.device != device) continue;
    if (e.warps == 0) opted = true;
    if (e.warps == warps && e.shared == shared) {
      *blocks = e.blocks;
      return cudaSuccess;
    }
  }
  if (!opted) {
    if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared);
        err != cudaSuccess)
      return err;
    cache.push_back({kernel, device, 0, 0, 0});
  }
  int resident = 0;
  if (cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, warps * kWarp,
                                                                      static_cast<size_t>(shared));
      err != cudaSuccess)
    return err;
  if (resident < 1) return cudaErrorInvalidConfiguration;
  cache.push_back({kernel, device, warps, shared, resident});
  *blocks = resident;
  return cudaSuccess;
}

cudaError_t LaunchPlan(KernelFn kernel, const Plan& plan, const IndexerDims& d, const IndexerBuffers& io,
                       cudaStream_t stream, const IndexerTuning& tuning) {
  DeviceLimits limits;
  if (cudaError_t err = Limits(&limits); err != cudaSuccess) return err;
  const Layout l = LayoutFor(d, plan);
  const int64_t fixed = FixedSharedBytes(l, plan), per_warp = WarpSharedBytes(l, plan);
  int warps = static_cast<int>(std::min<int64_t>(plan.max_warps, (limits.max_shared - fixed) / per_warp));
  if (tuning.warps_per_block > 0) warps = std::min(warps, tuning.warps_per_block);
  if (plan.wgmma) warps = std::max(4, warps - warps % 4);  // whole warpgroups (4 always fit)
  if (warps < 1) return cudaErrorInvalidValue;
  const int64_t shared = fixed + warps * per_warp;
  int resident = 0;
  if (cudaError_t err = ResidentBlocks(kernel, limits.max_shared, warps, shared, &resident); err != cudaSuccess)
    return err;
  if (tuning.blocks_per_sm > 0) resident = std::min(resident, tuning.blocks_per_sm);

  IndexerArgs p;
  p.query = io.query;
  p.weights = io.weights;
  p.keys = static_cast<const uint8_t*>(io.keys);
  p.key_scale = io.key_scale;
  p.lengths = io.lengths;
  p.scores = io.scores;
  p.rows = d.rows;
  p.tokens = d.tokens;
  p.tiles_per_row = (d.tokens + plan.tile_tokens - 1) / plan.tile_tokens;
  p.total_tiles = d.rows * p.tiles_per_row;
  p.heads = static_cast<int32_t>(d.heads);
  p.dim = static_cast<int32_t>(d.dim);
  p.heads_padded = l.heads_padded;
  p.passes = l.passes;
  p.q_stride = l.q_stride;
  p.q_copy_bytes = l.q_copy_bytes;
  p.w_bytes = l.w_bytes;
  p.key_units = l.key_units;
  p.key_stride = l.key_stride;
  p.stage_bytes = l.stage_bytes;
  // Enough blocks to fill the GPU once; fewer when there are fewer tiles than warps (warpgroups) in them.
  const int takers = plan.wgmma ? warps / 4 : warps;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(limits.sms) * resident, (p.total_tiles + takers - 1) / takers));
  kernel<<<static_cast<unsigned>(blocks), warps * kWarp, static_cast<size_t>(shared), stream>>>(p);
  return cudaGetLastError();
}

template <int kQSplit, bool kFp8>
KernelFn GeneralKernel(int n_tiles) {
  constexpr int kStages = kFp8 ? kIndexerStagesFp8 : kIndexerStagesBf16;
  switch (n_tiles) {
    case 2:
      return IndexScoresKernel<kQSplit, kFp8, 2, kStages>;
    case 4:
      return IndexScoresKernel<kQSplit, kFp8, 4, kStages>;
    default:
      return IndexScoresKernel<kQSplit, kFp8, 8, kStages>;
  }
}

template <bool kFp8, int kNTiles, int kKSteps, IndexerRegisterShape kShape>
KernelFn RegisterShapeKernel() {
  constexpr ShapeParams sp = Params(kShape);
  return IndexScoresRegisterKernel<kFp8, kNTiles, kKSteps, kFp8 ? sp.stages_fp8 : sp.stages_bf16, sp.m_tiles,
                                   sp.max_warps>;
}

template <bool kFp8, int kKSteps>
KernelFn RegisterKernel(int n_tiles) {
  constexpr IndexerRegisterShape k16x8 = IndexerRegisterShape::k16x8;
  switch (n_tiles) {
    case 2:
      return RegisterShapeKernel<kFp8, 2, kKSteps, k16x8>();
    case 4:
      return RegisterShapeKernel<kFp8, 4, kKSteps, k16x8>();
    default:
      return RegisterShapeKernel<kFp8, 8, kKSteps, k16x8>();
  }
}

// d = 128, H > 16: every shape ShapeBuilt admits.
template <bool kFp8>
KernelFn RegisterKernel128(int n_tiles, IndexerRegisterShape shape) {
  constexpr int kK = kRegMaxKSteps;
  using S = IndexerRegisterShape;
  if (n_tiles == 4) {
    switch (shape) {
      case S::k32x8:
        return RegisterShapeKernel<kFp8, 4, kK, S::k32x8>();
      case S::k16x16:
        return RegisterShapeKernel<kFp8, 4, kK, S::k16x16>();
      case S::k32x12:
        return RegisterShapeKernel<kFp8, 4, kK, S::k32x12>();
      case S::k64x6:
        return RegisterShapeKernel<kFp8, 4, kK, S::k64x6>();
      default:
        return RegisterShapeKernel<kFp8, 4, kK, S::k16x8>();
    }
  }
  return shape == S::k32x8 ? RegisterShapeKernel<kFp8, 8, kK, S::k32x8>()
                           : RegisterShapeKernel<kFp8, 8, kK, S::k16x8>();
}

KernelFn KernelFor(const IndexerDims& d, const Plan& plan) {
  const bool fp8 = d.key_type == IndexKeyType::kFp8E4m3;
  if (plan.wgmma) {
    constexpr ShapeParams sp = Params(IndexerRegisterShape::k64wg);
    return plan.n_tiles == 4 ? IndexScoresWgmmaKernel<4, sp.stages_fp8, sp.max_warps>
                             : IndexScoresWgmmaKernel<8, sp.stages_fp8, sp.max_warps>;
  }
  if (plan.registers) {
    // d = 128 (the DSA shape) with the k-steps fixed at compile time; any other d <= 128 counted at run time.
    if (d.dim == kIndexerRegisterMaxDim && plan.shape != IndexerRegisterShape::k16x8)
      return fp8 ? RegisterKernel128<true>(plan.n_tiles, plan.shape) : RegisterKernel128<false>(plan.n_tiles, plan.shape);
    if (d.dim == kIndexerRegisterMaxDim) {
      return fp8 ? RegisterKernel<true, kRegMaxKSteps>(plan.n_tiles)
                 : RegisterKernel<false, kRegMaxKSteps>(plan.n_tiles);
    }
    return fp8 ? RegisterKernel<true, 0>(plan.n_tiles) : RegisterKernel<false, 0>(plan.n_tiles);
  }
  if (plan.q_split == 3) return fp8 ? GeneralKernel<3, true>(plan.n_tiles) : GeneralKernel<3, false>(plan.n_tiles);
  return fp8 ? GeneralKernel<1, true>(plan.n_tiles) : GeneralKernel<1, false>(plan.n_tiles);
}

}  // namespace

bool IndexerRegisterQueryApplies(const IndexerDims& dims) {
  return IndexerSizeError(dims)[0] == '\0' && RegisterQueryApplies(dims);
}

bool IndexerRegisterShapeApplies(const IndexerDims& dims, IndexerRegisterShape shape) {
  return IndexerRegisterQueryApplies(dims) && ShapeBuilt(dims, shape);
}

int64_t IndexerSharedBytes(const IndexerDims& dims, int warps, IndexerKernel kernel) {
  const bool registers = kernel == IndexerKernel::kRegisterQuery ||
                         (kernel == IndexerKernel::kAuto && RegisterQueryApplies(dims));
  const Plan plan = PlanFor(dims, registers);
  const Layout l = LayoutFor(dims, plan);
  return FixedSharedBytes(l, plan) + static_cast<int64_t>(warps) * WarpSharedBytes(l, plan);
}

cudaError_t LaunchIndexScores(const IndexerDims& dims, const IndexerBuffers& io, cudaStream_t stream,
                              const IndexerTuning& tuning) {
  if (IndexerSizeError(dims)[0] != '\0' || dims.rows < 0 || dims.tokens < 0) return cudaErrorInvalidValue;
  const bool fp8 = dims.key_type == IndexKeyType::kFp8E4m3;
  if (fp8 != (io.key_scale != nullptr)) return cudaErrorInvalidValue;
  const bool applies = RegisterQueryApplies(dims);
  if (tuning.kernel == IndexerKernel::kRegisterQuery && !applies) return cudaErrorInvalidValue;
  if (tuning.shape != IndexerRegisterShape::kAuto && tuning.kernel != IndexerKernel::kGeneral &&
      !(applies && ShapeBuilt(dims, tuning.shape)))
    return cudaErrorInvalidValue;
  if (dims.rows == 0 || dims.tokens == 0) return cudaSuccess;
  if (!Aligned(io.query, 16) || !Aligned(io.keys, 16) || !Aligned(io.weights, 4) ||
      !Aligned(io.lengths, 4) || !Aligned(io.scores, 4) || (fp8 && !Aligned(io.key_scale, 4)))
    return cudaErrorInvalidValue;
  const Plan plan = PlanFor(dims, applies && tuning.kernel != IndexerKernel::kGeneral, tuning.shape);
  return LaunchPlan(KernelFor(dims, plan), plan, dims, io, stream, tuning);
}

}  // namespace hisparse

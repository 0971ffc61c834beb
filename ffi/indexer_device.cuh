// Device pieces shared by the lightning indexer's two kernels
// (indexer_kernels.cu): the kernel arguments, PTX wrappers, the fp8 -> bf16
// widening, the staging of q and w in shared memory, and the copies of key
// tiles into a warp's shared-memory ring. Included by indexer_kernels.cu only.
//
// Tensor-core tiles (mma.sync m16n8k16, PTX fragment layouts; g = lane / 4,
// c = lane % 4):
//   A = keys, 16 tokens x 16 d:  a0 (token g,   k 2c..2c+1)  a1 (token g+8, k 2c..2c+1)
//                                a2 (token g,   k 2c+8..+9)  a3 (token g+8, k 2c+8..+9)
//   B = q,    16 d x 8 heads:    b0 (k 2c..2c+1, head g)     b1 (k 2c+8..+9, head g)
//   C,        16 tokens x 8 heads: c0, c1 (token g, heads 2c, 2c+1), c2, c3 (token g+8, same heads)
// An fp8 lane reads one 32-bit word per token and 16-byte chunk of d, bytes
// 4c..4c+3, and uses bytes 0, 1 as k = 2c, 2c+1 and bytes 2, 3 as k = 2c+8,
// 2c+9: the dot product does not care about the order of d, so q is staged in
// the same permuted order (Fp8Order) and every key byte is read exactly once.
//
// fp8 -> bf16 in registers: an e4m3 byte s.eeee.mmm placed as the bf16
// s.0000eeee.mmm0000 is exactly the value times 2^-120, subnormal codes
// included (they become bf16 subnormals); prmt's sign-replicating selectors,
// a shift and a mask do two bytes at once. So that the products of those
// small keys stay normal floats, q is multiplied by 2^e (e <= 120, chosen per
// row from max |q| so that q 2^e < 2^127 stays finite), and the row's scores
// by 2^(120 - e): powers of two, exact, the same bits as unscaled arithmetic.
//
// Shared-memory row strides are padded to an odd number of 16-byte units so
// the 8 rows that one ldmatrix matrix (or one fp8 load) touches fall in 8
// different bank groups.
#ifndef HISPARSE_FFI_INDEXER_DEVICE_CUH_
#define HISPARSE_FFI_INDEXER_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "indexer_cuda.h"

namespace hisparse {
namespace indexer_device {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The d offset (within a chunk of 16) that an fp8 key fragment holds at
// tensor-core k index k: bytes 4c, 4c+1 at k = 2c, 2c+1; bytes 4c+2, 4c+3 at
// k = 2c+8, 2c+9 (0, 1, 4, 5, ..., 12, 13, then 2, 3, 6, 7, ..., 14, 15).
__host__ __device__ constexpr int Fp8Order(int k) {
  return k < 8 ? 4 * (k / 2) + k % 2 : 4 * ((k - 8) / 2) + 2 + k % 2;
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

struct IndexerArgs {
  const void* query;        // [b, H, d] bf16 or f32
  const float* weights;     // [b, H]
  const uint8_t* keys;      // [b, T, d] bf16 or fp8 e4m3fn
  const float* key_scale;   // [b, T] (fp8 keys only)
  const int32_t* lengths;   // [b]
  float* scores;            // [b, T]
  int64_t rows, tokens;
  int64_t tiles_per_row;    // ceil(T / tile tokens of the kernel)
  int64_t total_tiles;      // rows * tiles_per_row
  int32_t heads, dim;
  int32_t heads_padded;     // passes * 8 * n-tiles of the kernel
  int32_t passes;           // head passes of 8 * n-tiles heads each
  int32_t q_stride;         // bytes between head rows of one q copy in shared memory
  int32_t q_copy_bytes;     // heads_padded * q_stride
  int32_t w_bytes;          // heads_padded floats, rounded up to 16 bytes
  int32_t key_units;        // 16-byte units per key row in global memory
  int32_t key_stride;       // bytes between key rows of a stage
  int32_t stage_bytes;      // one stage: tile-tokens key rows (+ as many fp8 scales)
};

// --------------------------------------------------------------------------- PTX wrappers

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, through L2 only; bytes past src_bytes are zero-filled.
__device__ __forceinline__ void CopyAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CopyAsync4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CommitAsync() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LoadMatrixX4(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// Matrices 0 and 1 only (rows addressed by lanes 0-15; the other lanes' addresses are not read).
__device__ __forceinline__ void LoadMatrixX2(uint32_t address, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(address)
               : "memory");
}

// c += a b on the tensor cores, bf16 inputs, f32 accumulation.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// max(x, 0) with NaN propagated (as jnp.maximum does; fmaxf would drop it).
__device__ __forceinline__ float Relu(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two e4m3 bytes of `word` (picked by `selector`: 0x9180 for bytes 0, 1 and
// 0xb3a2 for bytes 2, 3) as two bf16 of value x 2^-120, first byte in the low
// half. prmt puts each byte in the low half of a 16-bit lane with its sign
// replicated above it; << 4 moves eeee.mmm under the bf16 exponent's low bits
// and the sign copy to bit 15; the mask drops the other copies and the bits
// shifted over from the lane below.
__device__ __forceinline__ uint32_t Fp8PairAsBf16(uint32_t word, uint32_t selector) {
  uint32_t lanes;
  asm("prmt.b32 %0, %1, %1, %2;\n" : "=r"(lanes) : "r"(word), "r"(selector));
  return (lanes << 4) & 0x87f087f0u;
}

// The A fragment of one k-step from an fp8 lane's two words (token g and
// token g + 8, bytes 4c..4c+3 of the step's 16-byte chunk).
__device__ __forceinline__ void Fp8Fragment(uint32_t top, uint32_t bottom, uint32_t (&a)[4]) {
  a[0] = Fp8PairAsBf16(top, 0x9180u);
  a[1] = Fp8PairAsBf16(bottom, 0x9180u);
  a[2] = Fp8PairAsBf16(top, 0xb3a2u);
  a[3] = Fp8PairAsBf16(bottom, 0xb3a2u);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// --------------------------------------------------------------------------- q and w staging

// Sixteen consecutive q values (16-element aligned) as floats.
template <bool kF32Query>
__device__ __forceinline__ void LoadQuery16(const IndexerArgs& p, int64_t index, float (&x)[16]) {
  if constexpr (kF32Query) {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.query) + index);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = src[v];
      x[4 * v] = f.x, x[4 * v + 1] = f.y, x[4 * v + 2] = f.z, x[4 * v + 3] = f.w;
    }
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.query) + index);
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 u = src[v];
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[8 * v + 2 * i] = __uint_as_float(words[i] << 16);
        x[8 * v + 2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
  }
}

// Stages row `row`'s q (kQSplit bf16 copies: float32 q is split exactly into
// hi + mid + lo) and w into shared memory; heads past H are zero. Returns the
// factor the row's scores are multiplied by (1 unless fp8 keys). Every thread
// of the block calls it; the caller brackets it with __syncthreads.
// kCoreMatrices: q in wgmma's no-swizzle K-major layout instead of one padded
// row per head: 8 heads x 8 k of 16-bit values per 128 contiguous bytes (a
// core matrix), core matrix (k-chunk kc, head group hg) at (kc groups + hg)
// 128 bytes, groups = heads_padded / 8 (indexer_wgmma.cuh).
template <int kQSplit, bool kFp8, bool kCoreMatrices = false>
__device__ float StageQuery(const IndexerArgs& p, int64_t row, uint8_t* q_smem, float* w_smem,
                            uint32_t* warp_max) {
  constexpr bool kF32Query = kQSplit == 3;
  const int tid = threadIdx.x, threads = blockDim.x;
  const int64_t base = row * p.heads * p.dim;
  float q_mul = 1.0f, factor = 1.0f;
  if constexpr (kFp8) {
    // Largest finite |q| of the row (as bits: non-negative floats order like integers), 16
    // values a thread at a time (H d is a multiple of 16 and each row's q 16-value aligned):
    // the loads of a block's first row are on the path to its first tile's MMAs.
    uint32_t m = 0;
    for (int i = 16 * tid; i < p.heads * p.dim; i += 16 * threads) {
      float x[16];
      LoadQuery16<kF32Query>(p, base + i, x);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const float a = fabsf(x[k]);
        if (a <= FLT_MAX) m = max(m, __float_as_uint(a));
      }
    }
    m = __reduce_max_sync(kFullMask, m);
    if (tid % kWarp == 0) warp_max[tid / kWarp] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < threads / kWarp; ++w) m = max(m, warp_max[w]);
    // max |q| < 2^(field - 126) for exponent field `field`; q 2^e < 2^127.
    const int field = static_cast<int>(m >> 23);
    const int e = m == 0 ? 120 : min(120, 253 - field);
    q_mul = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
    factor = __uint_as_float(static_cast<uint32_t>(127 + 120 - e) << 23);
  }
  const int chunks = p.dim / 16;
  for (int i = tid; i < p.heads_padded * chunks; i += threads) {
    const int h = i / chunks, c = i % chunks;
    float x[16];
    if (h < p.heads) {
      LoadQuery16<kF32Query>(p, base + static_cast<int64_t>(h) * p.dim + 16 * c, x);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) x[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) x[k] *= q_mul;
#pragma unroll
    for (int s = 0; s < kQSplit; ++s) {
      float part[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        part[k] = __bfloat162float(__float2bfloat16_rn(x[k]));
        x[k] -= part[k];  // exact: the rest of x after its leading bf16 bits
      }
      uint32_t packed[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if constexpr (kFp8) {
          packed[k] = PackBf16(part[Fp8Order(2 * k)], part[Fp8Order(2 * k + 1)]);
        } else {
          packed[k] = PackBf16(part[2 * k], part[2 * k + 1]);
        }
      }
      if constexpr (kCoreMatrices) {
        const int groups = p.heads_padded / 8;
        uint8_t* base_s = q_smem + s * p.q_copy_bytes + 16 * (h % 8);
        *reinterpret_cast<uint4*>(base_s + 128 * (2 * c * groups + h / 8)) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
        *reinterpret_cast<uint4*>(base_s + 128 * ((2 * c + 1) * groups + h / 8)) =
            make_uint4(packed[4], packed[5], packed[6], packed[7]);
      } else {
        uint4* dst = reinterpret_cast<uint4*>(q_smem + s * p.q_copy_bytes + h * p.q_stride + 32 * c);
        dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
      }
    }
  }
  for (int h = tid; h < p.heads_padded; h += threads)
    w_smem[h] = h < p.heads ? p.weights[row * p.heads + h] : 0.0f;
  return factor;
}

// --------------------------------------------------------------------------- key tiles

// The tokens of row `row` that are scored: [0, limit).
__device__ __forceinline__ int64_t RowLimit(const IndexerArgs& p, int64_t row) {
  return Min64(Max64(p.lengths[row], 0), p.tokens);
}

// The scored rows of the tile of kTokens tokens starting at t0, [0, valid).
template <int kTokens>
__device__ __forceinline__ int TileValid(int64_t limit, int64_t t0) {
  return static_cast<int>(Min64(Max64(limit - t0, 0), kTokens));
}

// How lane `lane` walks a tile's 16-byte units when copying it: units lane,
// lane + 32, ... of the tile, row-major; (row0, unit0) is its first and
// (rows_step, units_step) = divmod(32, key_units) the stride.
struct CopyWalk {
  int row0, unit0, rows_step, units_step;
};

__device__ __forceinline__ CopyWalk CopyWalkFor(const IndexerArgs& p, int lane) {
  return {lane / p.key_units, lane % p.key_units, kWarp / p.key_units, kWarp % p.key_units};
}

// Starts the copies of tile rows [0, valid) of keys (and fp8 scales) into a
// stage of kTokens key rows; rows [valid, kTokens) are zero-filled. Nothing is
// copied when valid <= 0 (the tile is past lengths[row]).
template <int kTokens, bool kFp8>
__device__ __forceinline__ void IssueTile(const IndexerArgs& p, uint32_t stage, int64_t row, int64_t t0,
                                          int valid, int lane, const CopyWalk& walk) {
  if (valid <= 0) return;
  const int64_t row_bytes = 16 * static_cast<int64_t>(p.key_units);
  const uint8_t* tile = p.keys + (row * p.tokens + t0) * row_bytes;
  for (int r = walk.row0, u = walk.unit0; r < kTokens;) {
    const bool ok = r < valid;
    CopyAsync16(stage + r * p.key_stride + 16 * u, tile + (ok ? r * row_bytes + 16 * u : 0), ok ? 16 : 0);
    r += walk.rows_step;
    u += walk.units_step;
    if (u >= p.key_units) u -= p.key_units, ++r;
  }
  if constexpr (kFp8) {
    for (int i = lane; i < kTokens; i += kWarp) {
      const bool ok = i < valid;
      CopyAsync4(stage + kTokens * p.key_stride + 4 * i, p.key_scale + row * p.tokens + t0 + (ok ? i : 0), ok ? 4 : 0);
    }
  }
}

// The stage row stride for key rows of kUnits 16-byte units (the launcher's
// PaddedStride of the same row).
template <int kUnits>
__host__ __device__ constexpr int PaddedKeyStride() {
  return 16 * (kUnits | 1);
}

// IssueTile for key rows of kUnits 16-byte units known at compile time (a
// divisor of 32): each warp-wide copy covers 32 / kUnits whole rows, so the
// copies unroll with constant offsets; a full tile (valid == kTokens, all but
// a row's last) needs no per-row test.
template <int kTokens, bool kFp8, int kUnits>
__device__ __forceinline__ void IssueTileFixed(const IndexerArgs& p, uint32_t stage, int64_t row, int64_t t0,
                                               int valid, int lane) {
  static_assert(kWarp % kUnits == 0, "a warp-wide copy covers whole rows");
  constexpr int kRowBytes = 16 * kUnits;
  constexpr int kStride = PaddedKeyStride<kUnits>();
  constexpr int kRowsPerCopy = kWarp / kUnits;
  static_assert(kTokens % kRowsPerCopy == 0, "the copies cover the tile's rows exactly");
  if (valid <= 0) return;
  const int64_t token = row * p.tokens + t0;
  const uint8_t* tile = p.keys + token * kRowBytes;
  const int r0 = lane / kUnits, u = lane % kUnits;
  const uint32_t dst = stage + r0 * kStride + 16 * u;
  const uint8_t* src = tile + r0 * kRowBytes + 16 * u;
  if (valid == kTokens) {
#pragma unroll
    for (int i = 0; i < kTokens / kRowsPerCopy; ++i)
      CopyAsync16(dst + i * kRowsPerCopy * kStride, src + i * kRowsPerCopy * kRowBytes, 16);
  } else {
#pragma unroll
    for (int i = 0; i < kTokens / kRowsPerCopy; ++i) {
      const bool ok = r0 + i * kRowsPerCopy < valid;
      CopyAsync16(dst + i * kRowsPerCopy * kStride, ok ? src + i * kRowsPerCopy * kRowBytes : tile, ok ? 16 : 0);
    }
  }
  if constexpr (kFp8) {
#pragma unroll
    for (int i = lane; i < kTokens; i += kWarp) {
      const bool ok = i < valid;
      CopyAsync4(stage + kTokens * kStride + 4 * i, p.key_scale + token + (ok ? i : 0), ok ? 4 : 0);
    }
  }
}

}  // namespace indexer_device
}  // namespace hisparse

#endif  // HISPARSE_FFI_INDEXER_DEVICE_CUH_

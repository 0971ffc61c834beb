// Sparse MLA decode attention kernels (sparse_attention_cuda.h has the plan, sparse_attention.h
// the arithmetic). Shapes are fixed by the model family: W = 576, value 512, head tile 64.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cmath>
#include <cstdint>

#include "sparse_attention_cuda.h"

namespace hisparse {
namespace {

constexpr int kW = static_cast<int>(kSparseAttentionWidth);
constexpr int kDv = static_cast<int>(kSparseAttentionValueWidth);
constexpr int kHt = static_cast<int>(kSparseAttentionHeadTile);
constexpr int kChunks = static_cast<int>(kSparseAttentionChunks);
constexpr int kStage = static_cast<int>(kSparseAttentionStage);
constexpr int kBufs = 3;          // stages in flight: enough bytes in flight per SM for HBM
constexpr int kThreads = 256;     // 8 warps
constexpr int kRow = kW + 8;      // smem row in bf16: 1168 B, so ldmatrix's 8 rows hit 8 bank groups
constexpr int kProw = kStage + 8; // P tile row: 80 B, conflict-free for the same reason
constexpr int kChunks16B = kW * 2 / 16;  // 72 16-byte pieces per token
constexpr int kSrow = kStage + 4;        // float row of the partial scores
constexpr int kMaxChunkRecords = static_cast<int>(kSparseAttentionMaxTopK / kSparseAttentionChunks) + 1;
constexpr int kTailHeads = kHt / kChunks;  // cluster plan: open-page scores of 4 heads per block

struct Smem {
  uint16_t q[kHt * kRow];
  uint16_t kv[kBufs][kStage * kRow];
  uint16_t p[kHt * kProw];
  float red_max[2][kHt];
  float red_sum[2][kHt];
  float alpha[kHt];
  int valid[kBufs][kStage];
  float red_s[kHt * (kStage + 4)];  // the second half of d's partial scores
  int ids[kMaxChunkRecords];        // the chunk's record ids, loaded once: no load in the issue path
  float tail_s[kTailHeads][kSparseAttentionMaxPage];  // cluster plan: this block's heads' page scores
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes = 0 writes zeros (an invalid token's row then holds no
// NaN that a zero probability could turn into NaN).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldm4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Ldm4T(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float Bf16ToFloat(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

struct ChunkArgs {
  const uint16_t* q;
  const uint16_t* source;  // layer 0's rows; layer l's start l * layer_stride further
  const int32_t* layer;    // [] int32 on the device: which of `layers` stacked sources
  int64_t layer_stride;
  int layers;
  const int32_t* index;
  float* o_part;  // [b, H, C, 512]
  float* ml;      // [b, H, C, 2]
  const uint16_t* tail;       // cluster plan: the merge runs in the chunk kernel
  const uint8_t* tail_valid;
  float* out;
  int heads, top_k, page, records, chunk_tokens;
  float scale;
};

// Issues the cp.async of stage `s` of this block's chunk into buffer `buf` (one commit group).
__device__ __forceinline__ void IssueStage(const ChunkArgs& a, const uint16_t* source, bool layer_ok, Smem& sm,
                                           int req, int chunk, int s, int buf) {
  const int tok0 = chunk * a.chunk_tokens + s * kStage;
  const int rec0 = chunk * a.chunk_tokens / a.page;
  for (int e = threadIdx.x; e < kStage * kChunks16B; e += kThreads) {
    const int row = e / kChunks16B, piece = e % kChunks16B;
    const int j = tok0 + row;
    const int rec = j / a.page, tok = j % a.page;
    const int id = sm.ids[rec - rec0];
    const bool ok = layer_ok && id >= 0 && id < a.records;
    const uint16_t* src =
        ok ? source + ((static_cast<int64_t>(req) * a.records + id) * a.page + tok) * kW + piece * 8 : source;
    CpAsync16(&sm.kv[buf][row * kRow + piece * 8], src, ok ? 16 : 0);
    if (piece == 0) sm.valid[buf][row] = ok;
  }
  CpAsyncCommit();
}


// The open page's score for one head: lane sums d = lane, lane + 32, ... in order, then a fixed
// xor tree. Both plans call this, so their bits agree.
__device__ __forceinline__ float TailScore(const uint16_t* qh, const uint16_t* kt, int lane, float scale) {
  float d = 0.f;
#pragma unroll
  for (int j = 0; j < kW / 32; ++j) d = fmaf(Bf16ToFloat(qh[lane + 32 * j]), Bf16ToFloat(kt[lane + 32 * j]), d);
#pragma unroll
  for (int x = 16; x >= 1; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
  return d * scale;
}

// The merge of sparse_attention.h for `n` value columns of one head: chunks 0..C-1 in order
// (m_c, l_c from ml(c), o_c[col] from o(c, col)), then the open page's tokens in order.
template <int n, typename Ml, typename O, typename Ts>
__device__ __forceinline__ void Merge(Ml ml, O o, Ts tail_s, int page, const uint16_t* tail_v, float* dst) {
  // Unrolled: every partial's loads issue together (a loop waited for each chunk's in turn).
  float2 mls[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) mls[c] = ml(c);
  float vals[kChunks][n];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int r = 0; r < n; ++r) vals[c][r] = o(c, r);
  float big = -INFINITY;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) big = fmaxf(big, mls[c].x);
  for (int t = 0; t < page; ++t) big = fmaxf(big, tail_s(t));
  float total = 0.f, acc[n];
#pragma unroll
  for (int r = 0; r < n; ++r) acc[r] = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float2 v = mls[c];
    const float w = v.x == -INFINITY ? 0.f : expf(v.x - big);
    total = fmaf(w, v.y, total);
#pragma unroll
    for (int r = 0; r < n; ++r) acc[r] = fmaf(w, vals[c][r], acc[r]);
  }
  for (int t = 0; t < page; ++t) {
    const float ts = tail_s(t);
    const float p = ts == -INFINITY ? 0.f : expf(ts - big);
    total += p;
#pragma unroll
    for (int r = 0; r < n; ++r) acc[r] = fmaf(p, Bf16ToFloat(tail_v[t * kW + r]), acc[r]);
  }
#pragma unroll
  for (int r = 0; r < n; ++r) dst[r] = total > 0.f ? acc[r] / total : 0.f;
}

// Cluster plan's merge area, laid over the block's shared memory once the chunk is done.
constexpr int kOrow = kDv + 8;  // float row of o: float2 stores of 8 rows hit distinct banks
struct MergeSmem {
  float o[kHt * kOrow];
  float2 ml[kHt];
};
static_assert(sizeof(MergeSmem) <= offsetof(Smem, ids), "the merge area lies over the chunk's buffers only");
constexpr int kMergeCols = kDv / kChunks;  // 32 columns of every head per block of the cluster

template <bool kCluster>
__global__ void __launch_bounds__(kThreads, 1) ChunkKernel(ChunkArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int chunk = blockIdx.x, tile = blockIdx.y, req = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q4 = lane & 3;
  const int stages = a.chunk_tokens / kStage;
  // A layer outside [0, layers) reads no record (sparse_attention.h): only the open page counts.
  const int layer = *a.layer;
  const bool layer_ok = layer >= 0 && layer < a.layers;
  const uint16_t* source = a.source + (layer_ok ? layer * a.layer_stride : 0);

  // Q tile first (it needs no id), in the first commit group with stage 0.
  const uint16_t* qg = a.q + (static_cast<int64_t>(req) * a.heads + tile * kHt) * kW;
  for (int e = threadIdx.x; e < kHt * kChunks16B; e += kThreads) {
    const int row = e / kChunks16B, piece = e % kChunks16B;
    CpAsync16(&sm.q[row * kRow + piece * 8], qg + row * kW + piece * 8, 16);
  }
  // The chunk's record ids, one load per thread in parallel (a load per 16-byte piece in the issue
  // loop made every stage wait for a chain of dependent global loads: 38 us at b = 1).
  {
    const int rec0 = chunk * a.chunk_tokens / a.page, rec1 = ((chunk + 1) * a.chunk_tokens - 1) / a.page;
    for (int r = threadIdx.x; r <= rec1 - rec0; r += kThreads)
      sm.ids[r] = a.index[static_cast<int64_t>(req) * a.top_k + rec0 + r];
  }
  __syncthreads();

  for (int s = 0; s < kBufs - 1; ++s) {
    if (s < stages) IssueStage(a, source, layer_ok, sm, req, chunk, s, s);
    else CpAsyncCommit();  // empty group: the wait count below stays uniform
  }
  if constexpr (kCluster) {
    // This block's 4 heads' open-page scores (the merge reads every head's from its peers),
    // here, after the first stages' copies are issued, so their loads overlap those.
    const int64_t head0 = static_cast<int64_t>(req) * a.heads + tile * kHt + chunk * kTailHeads;
    for (int job = warp; job < kTailHeads * a.page; job += kThreads / 32) {
      const int hh = job % kTailHeads, t = job / kTailHeads;
      const float sc = TailScore(a.q + (head0 + hh) * kW, a.tail + (static_cast<int64_t>(req) * a.page + t) * kW, lane,
                                 a.scale);
      if (lane == 0) sm.tail_s[hh][t] = a.tail_valid[static_cast<int64_t>(req) * a.page + t] ? sc : -INFINITY;
    }
  }

#ifdef HISPARSE_SPARSE_ATTENTION_Q_IN_SMEM
  // Score-phase role: 16 heads (hg) x 16 tokens (th) of the 64 x 32 stage, Q read from shared
  // memory every stage (the first version; kept for A/B: -DHISPARSE_SPARSE_ATTENTION_Q_IN_SMEM).
  const int hg = warp & 3, th = warp >> 2;
#else
  // Score-phase role: 16 heads (hg) x all 32 tokens over half of d (th: 0..287 or 288..575), the
  // warp's Q slice held in registers for the whole chunk: shared memory then streams only the
  // keys, whose re-reads by the 4 head groups were half of the first version's traffic and Q's
  // the other half. Warps th = 0 add the other half's partial scores and run the softmax.
  const int hg = warp & 3, th = warp >> 2;
  constexpr int kHalfSteps = kW / 32;  // 18 k-steps of 16 per half
  uint32_t qa[kHalfSteps][4];
  CpAsyncWait<kBufs - 2>();  // Q (and stage 0) landed
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < kHalfSteps; ++ks)
    Ldm4(qa[ks], &sm.q[(hg * 16 + (lane & 15)) * kRow + th * (kW / 2) + ks * 16 + (lane >> 4) * 8]);
#endif
  const int rowA = hg * 16 + g, rowB = rowA + 8;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  // P @ V role: all 64 heads x 64 value columns (warp * 64).
  float o[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[i][j][r] = 0.f;

  for (int s = 0; s < stages; ++s) {
    const int buf = s % kBufs;
    CpAsyncWait<kBufs - 2>();
    __syncthreads();  // stage s landed for all; stage s-1 fully consumed
    if (s + kBufs - 1 < stages)
      IssueStage(a, source, layer_ok, sm, req, chunk, s + kBufs - 1, (s + kBufs - 1) % kBufs);
    else CpAsyncCommit();
    const uint16_t* kv = sm.kv[buf];

#ifdef HISPARSE_SPARSE_ATTENTION_Q_IN_SMEM
    // S = Q K^T for 16 heads x 16 tokens, d in order 0..575.
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
    for (int ks = 0; ks < kW / 16; ++ks) {
      uint32_t qa[4], kb[4];
      Ldm4(qa, &sm.q[(hg * 16 + (lane & 15)) * kRow + ks * 16 + (lane >> 4) * 8]);
      Ldm4(kb, &kv[(th * 16 + (lane & 7) + ((lane >> 4) << 3)) * kRow + ks * 16 + ((lane >> 3) & 1) * 8]);
      Mma(acc[0], qa, kb[0], kb[1]);
      Mma(acc[1], qa, kb[2], kb[3]);
    }
    float sc[2][4];
    float maxA = -INFINITY, maxB = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = th * 16 + j * 8 + q4 * 2 + (r & 1);
        sc[j][r] = sm.valid[buf][t] ? acc[j][r] * a.scale : -INFINITY;
        if (r < 2) maxA = fmaxf(maxA, sc[j][r]);
        else maxB = fmaxf(maxB, sc[j][r]);
      }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      maxA = fmaxf(maxA, __shfl_xor_sync(0xffffffffu, maxA, x));
      maxB = fmaxf(maxB, __shfl_xor_sync(0xffffffffu, maxB, x));
    }
    if (q4 == 0) {
      sm.red_max[th][rowA] = maxA;
      sm.red_max[th][rowB] = maxB;
    }
    __syncthreads();
    // Both token halves compute the same new max (max is exact in any order).
    const float nA = fmaxf(mA, fmaxf(sm.red_max[0][rowA], sm.red_max[1][rowA]));
    const float nB = fmaxf(mB, fmaxf(sm.red_max[0][rowB], sm.red_max[1][rowB]));
    const float alA = mA == -INFINITY ? 0.f : expf(mA - nA);
    const float alB = mB == -INFINITY ? 0.f : expf(mB - nB);
    float sumA = 0.f, sumB = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int t = th * 16 + j * 8 + q4 * 2;
      __nv_bfloat16 p[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float n = r < 2 ? nA : nB;
        p[r] = __float2bfloat16_rn(sc[j][r] == -INFINITY ? 0.f : expf(sc[j][r] - n));
      }
      sumA += __bfloat162float(p[0]) + __bfloat162float(p[1]);
      sumB += __bfloat162float(p[2]) + __bfloat162float(p[3]);
      *reinterpret_cast<__nv_bfloat162*>(&sm.p[rowA * kProw + t]) = __nv_bfloat162(p[0], p[1]);
      *reinterpret_cast<__nv_bfloat162*>(&sm.p[rowB * kProw + t]) = __nv_bfloat162(p[2], p[3]);
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      sumA += __shfl_xor_sync(0xffffffffu, sumA, x);
      sumB += __shfl_xor_sync(0xffffffffu, sumB, x);
    }
    if (q4 == 0) {
      sm.red_sum[th][rowA] = sumA;
      sm.red_sum[th][rowB] = sumB;
      if (th == 0) {
        sm.alpha[rowA] = alA;
        sm.alpha[rowB] = alB;
      }
    }
    mA = nA;
    mB = nB;
    __syncthreads();  // P tile, alpha and the halves' sums visible
    lA = alA * lA + (sm.red_sum[0][rowA] + sm.red_sum[1][rowA]);
    lB = alB * lB + (sm.red_sum[0][rowB] + sm.red_sum[1][rowB]);

#else
    // S = Q K^T for 16 heads x 32 tokens over this warp's half of d (in order within the half).
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHalfSteps; ++ks)
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t kb[4];
        Ldm4(kb, &kv[(np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kRow + th * (kW / 2) + ks * 16 +
                     ((lane >> 3) & 1) * 8]);
        Mma(acc[2 * np], qa[ks], kb[0], kb[1]);
        Mma(acc[2 * np + 1], qa[ks], kb[2], kb[3]);
      }
    if (th == 1)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<float2*>(&sm.red_s[rowA * kSrow + j * 8 + q4 * 2]) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(&sm.red_s[rowB * kSrow + j * 8 + q4 * 2]) = make_float2(acc[j][2], acc[j][3]);
      }
    __syncthreads();
    float alA = 0.f, alB = 0.f;
    if (th == 0) {
      // s = (first half + second half) * scale; the row max over all 32 tokens within the warp.
      float maxA = -INFINITY, maxB = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = j * 8 + q4 * 2 + (r & 1);
          const float other = sm.red_s[(r < 2 ? rowA : rowB) * kSrow + t];
          acc[j][r] = sm.valid[buf][t] ? (acc[j][r] + other) * a.scale : -INFINITY;
          if (r < 2) maxA = fmaxf(maxA, acc[j][r]);
          else maxB = fmaxf(maxB, acc[j][r]);
        }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        maxA = fmaxf(maxA, __shfl_xor_sync(0xffffffffu, maxA, x));
        maxB = fmaxf(maxB, __shfl_xor_sync(0xffffffffu, maxB, x));
      }
      const float nA = fmaxf(mA, maxA), nB = fmaxf(mB, maxB);
      alA = mA == -INFINITY ? 0.f : expf(mA - nA);
      alB = mB == -INFINITY ? 0.f : expf(mB - nB);
      float sumA = 0.f, sumB = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int t = j * 8 + q4 * 2;
        __nv_bfloat16 p[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float n = r < 2 ? nA : nB;
          p[r] = __float2bfloat16_rn(acc[j][r] == -INFINITY ? 0.f : expf(acc[j][r] - n));
        }
        sumA += __bfloat162float(p[0]) + __bfloat162float(p[1]);
        sumB += __bfloat162float(p[2]) + __bfloat162float(p[3]);
        *reinterpret_cast<__nv_bfloat162*>(&sm.p[rowA * kProw + t]) = __nv_bfloat162(p[0], p[1]);
        *reinterpret_cast<__nv_bfloat162*>(&sm.p[rowB * kProw + t]) = __nv_bfloat162(p[2], p[3]);
      }
#pragma unroll
      for (int x = 1; x <= 2; x <<= 1) {
        sumA += __shfl_xor_sync(0xffffffffu, sumA, x);
        sumB += __shfl_xor_sync(0xffffffffu, sumB, x);
      }
      if (q4 == 0) {
        sm.alpha[rowA] = alA;
        sm.alpha[rowB] = alB;
      }
      lA = alA * lA + sumA;
      lB = alB * lB + sumB;
      mA = nA;
      mB = nB;
    }
    __syncthreads();  // P tile and alpha visible
#endif

    // O = alpha * O + P V for 64 heads x 64 value columns.
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const float a0 = sm.alpha[mt * 16 + g], a1 = sm.alpha[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kStage / 16; ++ks) {
      uint32_t pa[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        Ldm4(pa[mt], &sm.p[(mt * 16 + (lane & 15)) * kProw + ks * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t vb[4];
        Ldm4T(vb, &kv[(ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kRow + warp * 64 + np * 16 +
                      (lane >> 4) * 8]);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          Mma(o[mt][2 * np], pa[mt], vb[0], vb[1]);
          Mma(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }
  CpAsyncWait<0>();  // no copy outlives the block (the trailing groups are empty)

  const int64_t head0 = static_cast<int64_t>(req) * a.heads + tile * kHt;
  if constexpr (!kCluster) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t h = head0 + mt * 16 + g + half * 8;
        float* dst = a.o_part + (h * kChunks + chunk) * kDv + warp * 64 + q4 * 2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[mt][nt][half * 2], o[mt][nt][half * 2 + 1]);
      }
    if (th == 0 && q4 == 0) {
      *reinterpret_cast<float2*>(a.ml + ((head0 + rowA) * kChunks + chunk) * 2) = make_float2(mA, lA);
      *reinterpret_cast<float2*>(a.ml + ((head0 + rowB) * kChunks + chunk) * 2) = make_float2(mB, lB);
    }
  } else {
    // The 16 chunk blocks of (request, tile) form one cluster: each parks its (m, l, o) in its own
    // shared memory, then block `chunk` merges value columns [32 chunk, 32 chunk + 32) of all 64
    // heads, reading the 16 partials in chunk order through distributed shared memory. No
    // partial touches global memory and the merge needs no second launch.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __syncthreads();  // every warp is done with Q and the stage buffers
    MergeSmem& ms = *reinterpret_cast<MergeSmem*>(smem_raw);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* dst = ms.o + (mt * 16 + g + half * 8) * kOrow + warp * 64 + q4 * 2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[mt][nt][half * 2], o[mt][nt][half * 2 + 1]);
      }
    if (th == 0 && q4 == 0) {
      ms.ml[rowA] = make_float2(mA, lA);
      ms.ml[rowB] = make_float2(mB, lB);
    }
    cluster.sync();  // every block's partial is visible cluster-wide
    const int hh = threadIdx.x / 4, col = chunk * kMergeCols + (threadIdx.x % 4) * 8;
    const Smem* tail_peer = cluster.map_shared_rank(&sm, hh / kTailHeads);
    float res[8];
    Merge<8>([&](int c) { return cluster.map_shared_rank(&ms, c)->ml[hh]; },
             [&](int c, int r) { return cluster.map_shared_rank(&ms, c)->o[hh * kOrow + col + r]; },
             [&](int t) { return tail_peer->tail_s[hh % kTailHeads][t]; }, a.page,
             a.tail + static_cast<int64_t>(req) * a.page * kW + col, res);
    float* dst = a.out + (head0 + hh) * kDv + col;
    *reinterpret_cast<float4*>(dst) = make_float4(res[0], res[1], res[2], res[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(res[4], res[5], res[6], res[7]);
    cluster.sync();  // no block leaves while a peer may still read its shared memory
  }
}

constexpr int kCombineThreads = kDv / 4;  // 4 value columns a thread

// One block per (head, request): chunks 0..C-1 in order, then the open page's tokens in order.
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(
    const uint16_t* __restrict__ q, const uint16_t* __restrict__ tail, const uint8_t* __restrict__ tail_valid,
    const float* __restrict__ o_part, const float* __restrict__ ml, float* __restrict__ out, int heads,
    int page, float scale) {
  __shared__ float tail_s[kSparseAttentionMaxPage];
  const int h = blockIdx.x, req = blockIdx.y;
  const int64_t hq = static_cast<int64_t>(req) * heads + h;
  if (threadIdx.x < 32) {
    for (int t = 0; t < page; ++t) {
      const float sc = TailScore(q + hq * kW, tail + (static_cast<int64_t>(req) * page + t) * kW, threadIdx.x, scale);
      if (threadIdx.x == 0) tail_s[t] = tail_valid[static_cast<int64_t>(req) * page + t] ? sc : -INFINITY;
    }
  }
  __syncthreads();
  const float* mlh = ml + hq * kChunks * 2;
  const int col = threadIdx.x * 4;
  const float* oh = o_part + hq * kChunks * kDv + col;
  float res[4];
  Merge<4>([&](int c) { return make_float2(mlh[2 * c], mlh[2 * c + 1]); },
           [&](int c, int r) { return oh[c * kDv + r]; }, [&](int t) { return tail_s[t]; }, page,
           tail + static_cast<int64_t>(req) * page * kW + col, res);
  *reinterpret_cast<float4*>(out + hq * kDv + col) = make_float4(res[0], res[1], res[2], res[3]);
}

std::atomic<uint64_t> g_configured{0};    // devices whose chunk kernels allow the large smem
std::atomic<uint64_t> g_cluster_ok{0};     // devices that fit a cluster of 16 such blocks
std::atomic<uint64_t> g_cluster_known{0};

cudaError_t Configure(int dev) {
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (g_configured.load() & bit) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(ChunkKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(sizeof(Smem)));
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(ChunkKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(sizeof(Smem)));
  if (err == cudaSuccess) err = cudaFuncSetAttribute(ChunkKernel<true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  g_configured.fetch_or(bit);
  return cudaSuccess;
}

cudaLaunchConfig_t ClusterConfig(dim3 grid, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = sizeof(Smem);
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kChunks;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Whether this device can run a cluster of 16 chunk blocks at all (asked once per device).
bool ClusterFits(int dev) {
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(g_cluster_known.load() & bit)) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = ClusterConfig(dim3(kChunks, 1, 1), nullptr, &attr);
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, ChunkKernel<true>, &cfg);
    if (err != cudaSuccess) cudaGetLastError();  // not sticky: forget it, use the other plan
    if (err == cudaSuccess && clusters > 0) g_cluster_ok.fetch_or(bit);
    g_cluster_known.fetch_or(bit);
  }
  return g_cluster_ok.load() & bit;
}

}  // namespace

int SparseAttentionMaxActiveClusters() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || Configure(dev) != cudaSuccess) return 0;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = ClusterConfig(dim3(kChunks, 1, 1), nullptr, &attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, ChunkKernel<true>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

cudaError_t LaunchSparseAttention(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                                  const uint16_t* source, const int32_t* layer, const int32_t* index, const uint16_t* tail,
                                  const uint8_t* tail_valid, float* out, float* workspace,
                                  cudaStream_t stream, SparseAttentionPlan plan) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if ((err = Configure(dev)) != cudaSuccess) return err;
  ChunkArgs a;
  a.q = q;
  a.source = source;
  a.layer = layer;
  a.layers = static_cast<int>(shape.layers);
  a.layer_stride = shape.batch * shape.records * shape.page * kW;
  a.index = index;
  a.o_part = workspace;
  a.ml = workspace + shape.batch * shape.heads * kChunks * kDv;
  a.tail = tail;
  a.tail_valid = tail_valid;
  a.out = out;
  a.heads = static_cast<int>(shape.heads);
  a.top_k = static_cast<int>(shape.top_k);
  a.page = static_cast<int>(shape.page);
  a.records = static_cast<int>(shape.records);
  a.chunk_tokens = static_cast<int>(shape.top_k * shape.page / kChunks);
  a.scale = scale;
  const dim3 grid(kChunks, static_cast<unsigned>(shape.heads / kHt), static_cast<unsigned>(shape.batch));
  const bool cluster = plan == SparseAttentionPlan::kCluster ||
                       (plan == SparseAttentionPlan::kAuto && ClusterFits(dev));
  if (cluster) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = ClusterConfig(grid, stream, &attr);
    return cudaLaunchKernelEx(&cfg, ChunkKernel<true>, a);
  }
  ChunkKernel<false><<<grid, kThreads, sizeof(Smem), stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  CombineKernel<<<dim3(static_cast<unsigned>(shape.heads), static_cast<unsigned>(shape.batch)),
                  kCombineThreads, 0, stream>>>(q, tail, tail_valid, a.o_part, a.ml, out, a.heads,
                                                a.page, scale);
  return cudaGetLastError();
}

}  // namespace hisparse

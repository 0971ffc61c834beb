// Sparse MLA decode attention's chunk kernel on warpgroup MMAs (sm_90a only; opt-in:
// -DHISPARSE_SPARSE_ATTENTION_WGMMA=1, the CMake option HISPARSE_SPARSE_ATTENTION_WGMMA with
// CMAKE_CUDA_ARCHITECTURES=90a, or ARCH=sm_90a EXTRA=-DHISPARSE_SPARSE_ATTENTION_WGMMA=1 for the
// checker and the benchmark). sparse_attention_kernels.cu includes it once, inside its namespace,
// after the combine kernel; in such a build every plan runs this kernel and then the combine
// kernel, so a build gives one set of bits for every batch (batch invariance holds within it).
//
// Why: ncu put the mma.sync chunk kernel at 13-16% of its byte bound at batch 17 (64 heads, k =
// 2048): one block of 8 warps an SM, 2 warps a scheduler, latency-bound in the ldmatrix feeding
// and the per-pass bookkeeping. Here the tensor cores read Q, K and V straight from shared memory
// (descriptors, no ldmatrix) and P from registers, asynchronously.
//
// A work unit is the contract's (chunk, 64 heads, request), one after another over a contiguous
// range of units per block (a head block's 16 chunks are adjacent, so a block reloads the query
// only where its range crosses into another 64-head block). A block is three warpgroups and a
// step is two of the contract's 32-token stages. Warpgroups 0 and 1 do the math: warpgroup w
// scores stage w of the step for all 64 heads (wgmma m64n32k16, Q and K from shared memory), so
// no score is computed twice; the two exchange their row maxima, then their P fragments and row
// sums, through shared memory (named barrier 1); both then hold the step's two running maxima,
// alphas and P tiles, and each applies them, stage by stage, to its own 256 of the 512 output
// columns (two m64n128k16 a k-step, P from registers, V from the stage buffer read N-major).
// Warpgroup 2 copies: the query and each step's records with 16-byte cp.async (zero-filled where
// a token has no record) into two step buffers, the next step's while the math reads this one,
// handing them over through mbarriers (full: copied and fenced; empty: read to the end), so the
// copies' issue, which the math warps paid inline before (a trace at batch 1: 7 us for the
// query and the first two steps), runs beside the math. setmaxnreg gives the copy warpgroup 48
// registers and the math 224. (First versions, H100, batch 17: both warpgroups scoring every
// stage, 98 us; one stage each with the copies inline, 84 us; the mma.sync kernel, 76 us.)
//
// Shared memory holds Q and the stages in the no-swizzle core-matrix layout of PTX's wgmma
// ("Canonical layouts"): row r (a head of Q, a token of a stage) and element e of a 576-wide row
// sit at (e / 8) * 128 + (r / 8) * 9216 + (r % 8) * 16 + (e % 8) * 2 bytes. Read K-major (scores:
// Q as A, K as B) the K-direction core matrices are 128 bytes apart (LBO) and 8-row groups 9216
// (SBO); read N-major (P @ V, V as B with tokens as K) the 8-token groups are 9216 apart (LBO) and
// 8-column groups 128 (SBO). tests/test_sparse_attention_wgmma_layout.py checks these addresses
// against the canonical layouts' formulas on every operand of every k-step.
//
// Arithmetic: the contract's (sparse_attention.h), stage by stage: scores scaled and masked,
// m' = max(m, stage max), alpha = exp(m - m') (0 while m = -inf), p = bf16(exp(s - m')), l =
// alpha l + (the row's p summed: each thread's in token order, then the quad's xor tree), o =
// alpha o + P V. The bits differ from the mma.sync kernel's (the tensor cores' order, the sums'
// order) within the contract's rounding; the checker holds both to the CPU oracle's bound.
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_
#define HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_

constexpr int kWgConsumers = 256;                         // two warpgroups: the math
constexpr int kWgProducers = 128;                         // the third warpgroup: the copies
constexpr int kWgThreads = kWgConsumers + kWgProducers;
// Registers a thread after setmaxnreg (the launch gives 168 to each of 384): the copy warpgroup
// needs few, the math warpgroups hold o (128 floats a thread), the scores and P.
constexpr int kWgProducerRegs = 48, kWgConsumerRegs = 224;
static_assert(kWgProducers * kWgProducerRegs + kWgConsumers * kWgConsumerRegs <= 65536, "the register file");
constexpr int kWgStepStages = 2;                          // a step's stages: warpgroup w scores stage w
constexpr int kWgBuffers = 2;                             // step buffers: one computed, one loading
constexpr int kWgPieces = kW / 8;                         // 72 16-byte pieces a row
constexpr int kWgGroupBytes = kWgPieces * 128;            // 9216: 8 rows of core matrices
constexpr int kWgStageBytes = kStage / 8 * kWgGroupBytes; // 36864: a stage's 32 tokens
constexpr int kWgQBytes = kHt / 8 * kWgGroupBytes;        // 73728: 64 heads
constexpr int kWgScoreSteps = kW / 16;                    // 36 k-steps of the scores
constexpr int kWgColumns = kDv / 2;                       // 256 output columns a warpgroup
static_assert(kWgProducers == 128 && kStage == 32 && kWgPieces == 9 * 8,
              "the producers copy a stage as two halves of 16 tokens x 8 pieces a step, 9 steps");
static_assert(kWgConsumers / 128 == kWgStepStages, "one warpgroup scores each stage of a step");

struct WgSmem {
  alignas(128) uint8_t q[kWgQBytes];
  alignas(128) uint8_t kv[kWgBuffers][kWgStepStages][kWgStageBytes];
  // The exchange: warpgroup w's P fragments of its stage (two k-steps, by thread of the
  // warpgroup), its stage's row maxima and row sums.
  alignas(16) uint32_t xp[kWgStepStages][128][8];
  float xmax[kWgStepStages][kHt];
  float xsum[kWgStepStages][kHt];
  uint8_t valid[kWgBuffers][kWgStepStages][kStage];  // the token has a record (else zero-filled, score -inf)
  // Step buffer b: full (its copies and the query landed: the producers' kWgProducers arrivals),
  // empty (read to the end: one arrival per math thread).
  alignas(8) unsigned long long full[kWgBuffers];
  unsigned long long empty[kWgBuffers];
};
static_assert(sizeof(WgSmem) <= 227 * 1024, "the wgmma chunk kernel's shared memory exceeds sm_90's 227 KB a block");
// The producers fill step f + 1's buffer while the math reads step f's.
static_assert(kWgBuffers == 2, "the wgmma chunk kernel's phases assume two step buffers");

__device__ __forceinline__ void WgCpAsync16(uint32_t dst, const void* src, int bytes) {
  // bytes 0: the 16 bytes are zero-filled and nothing is read.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
// Two floats to global memory in one 8-byte store (the float2 store of the partial compiled to
// two 4-byte ones, which filled the load/store queue: ncu's lg-throttle stalls).
__device__ __forceinline__ void WgStore2(float* dst, float x, float y) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
}
// The two math warpgroups' barrier (named barrier 1; the producers never wait on it).
__device__ __forceinline__ void WgMathSync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kWgConsumers) : "memory"); }
template <int kPending>
__device__ __forceinline__ void WgCpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// s (+)= Q K^T over one k-step: m64n32k16, A (64 heads) and B (32 tokens) both K-major in
// shared memory; s is overwritten when `accumulate` is 0.
__device__ __forceinline__ void WgScore(float (&s)[16], uint64_t desc_q, uint64_t desc_k, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(s[0]), "+f"(s[1]), "+f"(s[2]), "+f"(s[3]), "+f"(s[4]), "+f"(s[5]), "+f"(s[6]), "+f"(s[7]),
        "+f"(s[8]), "+f"(s[9]), "+f"(s[10]), "+f"(s[11]), "+f"(s[12]), "+f"(s[13]), "+f"(s[14]), "+f"(s[15])
      : "l"(desc_q), "l"(desc_k), "r"(accumulate));
}

// o += P V over one k-step of 16 tokens: m64n128k16, A = P from registers (mma.sync's A fragment
// of this warp's 16 heads), B = 16 tokens x 128 value columns N-major in shared memory (imm-trans-b 1).
__device__ __forceinline__ void WgValue(float (&o)[64], const uint32_t (&p)[4], uint64_t desc_v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(o[0]), "+f"(o[1]), "+f"(o[2]), "+f"(o[3]), "+f"(o[4]), "+f"(o[5]), "+f"(o[6]), "+f"(o[7]),
        "+f"(o[8]), "+f"(o[9]), "+f"(o[10]), "+f"(o[11]), "+f"(o[12]), "+f"(o[13]), "+f"(o[14]), "+f"(o[15]),
        "+f"(o[16]), "+f"(o[17]), "+f"(o[18]), "+f"(o[19]), "+f"(o[20]), "+f"(o[21]), "+f"(o[22]), "+f"(o[23]),
        "+f"(o[24]), "+f"(o[25]), "+f"(o[26]), "+f"(o[27]), "+f"(o[28]), "+f"(o[29]), "+f"(o[30]), "+f"(o[31]),
        "+f"(o[32]), "+f"(o[33]), "+f"(o[34]), "+f"(o[35]), "+f"(o[36]), "+f"(o[37]), "+f"(o[38]), "+f"(o[39]),
        "+f"(o[40]), "+f"(o[41]), "+f"(o[42]), "+f"(o[43]), "+f"(o[44]), "+f"(o[45]), "+f"(o[46]), "+f"(o[47]),
        "+f"(o[48]), "+f"(o[49]), "+f"(o[50]), "+f"(o[51]), "+f"(o[52]), "+f"(o[53]), "+f"(o[54]), "+f"(o[55]),
        "+f"(o[56]), "+f"(o[57]), "+f"(o[58]), "+f"(o[59]), "+f"(o[60]), "+f"(o[61]), "+f"(o[62]), "+f"(o[63])
      : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(desc_v), "r"(1));
}

__device__ __forceinline__ uint32_t WgPack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

// Scores of kTiles x 8 tokens of a stage (from its token tok0, whose rows start at k_addr) for the
// warpgroup's 64 heads, scaled and masked: s[4 j + r] = head 16 warp + g (+8 for r >= 2), token
// tok0 + 8 j + 2 q4 + (r & 1). Returns the row maxima of this thread's two heads (quad-reduced).
template <int kTiles>
__device__ __forceinline__ void WgStageScores(float (&s)[4 * kTiles], uint32_t q_addr, uint32_t k_addr,
                                              const uint8_t* valid, int tok0, float scale, int q4, float& mx0,
                                              float& mx1) {
  // d in k-steps of 16: 256 bytes, 16 in the descriptors' start field.
  const uint64_t desc_q = wgmma::Descriptor(q_addr, 128, kWgGroupBytes);
  const uint64_t desc_k = wgmma::Descriptor(k_addr, 128, kWgGroupBytes);
#pragma unroll
  for (int i = 0; i < 4 * kTiles; ++i) {
    s[i] = 0.f;  // overwritten (scale-d 0 on the first k-step), but never read undefined
    wgmma::Keep(s[i]);
  }
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < kWgScoreSteps; ++ks) WgScore(s, desc_q + ks * 16, desc_k + ks * 16, ks > 0);
  wgmma::Commit();
  wgmma::WaitAll();
#pragma unroll
  for (int i = 0; i < 4 * kTiles; ++i) wgmma::Keep(s[i]);
  mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tok = tok0 + 8 * j + 2 * q4 + (r & 1);
      s[4 * j + r] = valid[tok] ? s[4 * j + r] * scale : -INFINITY;
      if (r < 2) mx0 = fmaxf(mx0, s[4 * j + r]);
      else mx1 = fmaxf(mx1, s[4 * j + r]);
    }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
  }
}

// p = bf16(exp(s - n)) (0 where s = -inf) as the A fragments of P @ V's k-steps (tiles 2 ks and
// 2 ks + 1 give a0, a1 and a2, a3), and each head's sum of its p: this thread's in token order,
// then the quad's xor tree.
template <int kTiles>
__device__ __forceinline__ void WgProbabilities(const float (&s)[4 * kTiles], float n0, float n1,
                                                uint32_t (&pa)[kTiles / 2][4], float& sum0, float& sum1) {
  sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    __nv_bfloat16 p[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float v = s[4 * j + r], n = r < 2 ? n0 : n1;
      p[r] = __float2bfloat16_rn(v == -INFINITY ? 0.f : expf(v - n));
    }
    sum0 += __bfloat162float(p[0]) + __bfloat162float(p[1]);
    sum1 += __bfloat162float(p[2]) + __bfloat162float(p[3]);
    pa[j / 2][(j % 2) * 2] = WgPack(p[0], p[1]);
    pa[j / 2][(j % 2) * 2 + 1] = WgPack(p[2], p[3]);
  }
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
  }
}

// o *= alpha for this thread's two heads (columns of o[nb][4 j + r]: r < 2 head 16 warp + g, else
// + 8); skipped where every alpha of the warp's rows is 1 (the running max held, the common case
// after the first stages): o * 1 == o bit for bit. No wgmma may be in flight on o.
__device__ __forceinline__ void WgRescale(float (&o)[2][64], float al0, float al1) {
  if (!__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) return;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[nb][4 * j] *= al0;
      o[nb][4 * j + 1] *= al0;
      o[nb][4 * j + 2] *= al1;
      o[nb][4 * j + 3] *= al1;
    }
}

// O += P V over one stage for this warpgroup's 256 columns (8-column groups 128 bytes apart: 16
// bytes a column), tokens in k-steps of 16 (two 8-token groups, 2 x 9216 bytes); waits for it.
__device__ __forceinline__ void WgStageValues(float (&o)[2][64], uint32_t (&pa)[2][4], uint32_t kv_addr, int wg) {
  const uint64_t desc_v = wgmma::Descriptor(kv_addr + wg * kWgColumns * 16, kWgGroupBytes, 128);
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma::Keep(o[nb][i]);
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) wgmma::Keep(pa[ks][i]);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
      WgValue(o[nb], pa[ks], desc_v + ((ks * 2 * kWgGroupBytes + nb * 128 * 16) >> 4));
  wgmma::Commit();
  wgmma::WaitAll();
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma::Keep(o[nb][i]);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The unit's (chunk, first head of [b * H], request). Units: chunk fastest, then the request's
// 64-head blocks, then the request (the combine plan's order with 64 heads a unit).
struct WgUnit {
  int chunk, req;
  int64_t head0;
};
__device__ __forceinline__ WgUnit WgUnitAt(const ChunkArgs& a, int u) {
  WgUnit x;
  x.chunk = u % kChunks;
  const int rest = u / kChunks;
  x.req = a.by_blocks.Div(rest);
  x.head0 = static_cast<int64_t>(x.req) * a.heads + static_cast<int64_t>(rest - x.req * static_cast<int>(a.by_blocks.d)) * kHt;
  return x;
}

__global__ void __launch_bounds__(kWgThreads, 1) WgmmaChunkKernel(ChunkArgs a) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  extern __shared__ __align__(128) uint8_t wg_smem[];
  WgSmem& sm = *reinterpret_cast<WgSmem*>(wg_smem);
  Stamp(0);  // entry (-DHISPARSE_SPARSE_ATTENTION_TRACE: thread 0's clock at each phase of step 0)
  const int tid = threadIdx.x, wg = tid / 128, me = tid % 128, warp = me / 32, lane = tid % 32;
  const int g = lane / 4, q4 = lane % 4;
  const int u_begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * a.units / gridDim.x);
  const int u_end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * a.units / gridDim.x);
  const int stages = a.chunk_tokens / kStage;  // whole: k P is a multiple of 16 x 32
  const int steps = (stages + kWgStepStages - 1) / kWgStepStages;  // a unit's; its last may hold one stage
  const int flat = (u_end - u_begin) * steps;
  if (flat <= 0) return;
  if (tid == 0) {
    for (int b = 0; b < kWgBuffers; ++b) {
      MbarInit(&sm.full[b], kWgProducers);
      MbarInit(&sm.empty[b], kWgConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the barriers ready; the last block-wide barrier (the roles part here)

  if (wg == kWgStepStages) {
    // The producers: step f's query (where its 64-head block changes) and records into buffer
    // f % 2 once the math has read that buffer's step f - 2 to the end, then, when every copy of
    // this thread landed, a proxy fence (cp.async writes through the generic proxy, wgmma reads
    // through the async one) and an arrival on the buffer's full barrier. Copy role: thread p
    // copies tokens p_tok and p_tok + 16 of each stage, pieces p_piece + 8 i (i < 9): 8
    // consecutive threads write one piece of 8 consecutive tokens, one 128-byte core-matrix row
    // (distinct banks). Four warps: one issued the 16-byte copies at ~11 GB/s (H100), a step's
    // 74 KB in ~7 us.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWgProducerRegs));
    const int p_tok = me % 8 + 8 * (me / 64), p_piece = (me / 8) % 8;
    const int layer = __ldg(a.layer);
    const bool layer_ok = layer >= 0 && layer < a.layers;  // outside: no record is read
    const uint16_t* source = a.source + (layer_ok ? static_cast<int64_t>(layer) * a.layer_stride : 0);
    // The record ids of this thread's tokens in step fs (stage h, half hf), loaded a step before
    // they are read; kNoStage where the unit has no such stage (an odd count: nothing is copied).
    constexpr int kNoStage = INT32_MIN;
    auto load_ids = [&](int fs, int (&ids)[kWgStepStages][2]) {
      const WgUnit x = WgUnitAt(a, u_begin + fs / steps);
#pragma unroll
      for (int h = 0; h < kWgStepStages; ++h)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int st = (fs % steps) * kWgStepStages + h;
          const int j = x.chunk * a.chunk_tokens + st * kStage + p_tok + 16 * hf;
          ids[h][hf] = st >= stages ? kNoStage
                                    : __ldg(a.index + static_cast<int64_t>(x.req) * a.top_k +
                                            (a.page == 1 ? j : a.by_page.Div(j)));
        }
    };
    int ids[kWgStepStages][2];
    load_ids(0, ids);
    int64_t query_head0 = -1;
    for (int f = 0; f < flat; ++f) {
      const int buf = f % kWgBuffers;
      const WgUnit x = WgUnitAt(a, u_begin + f / steps);
      if (f >= kWgBuffers) MbarWait(&sm.empty[buf], ((f - kWgBuffers) / kWgBuffers) & 1);  // step f - 2 read
      if (x.head0 != query_head0) {  // another 64-head block: the math must be done with step f - 1's query
        if (f >= 1) MbarWait(&sm.empty[(f - 1) % kWgBuffers], ((f - 1) / kWgBuffers) & 1);
#pragma unroll 4
        for (int i = me; i < kHt * kWgPieces; i += kWgProducers) {
          const int h = i % 8 + 8 * (i / (8 * kWgPieces)), pc = (i / 8) % kWgPieces;
          WgCpAsync16(SmemAddr(sm.q) + pc * 128 + (h / 8) * kWgGroupBytes + (h % 8) * 16, a.q + (x.head0 + h) * kW + pc * 8, 16);
        }
        query_head0 = x.head0;
      }
#pragma unroll
      for (int h = 0; h < kWgStepStages; ++h)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int id = ids[h][hf];
          if (id == kNoStage) continue;
          const int tok = p_tok + 16 * hf;
          const int j = x.chunk * a.chunk_tokens + ((f % steps) * kWgStepStages + h) * kStage + tok;
          const int r = a.page == 1 ? j : a.by_page.Div(j);
          // The source row (elements) of the token, or -1 without a record (zero-filled).
          const int64_t row = !layer_ok || id < 0 || id >= a.records
                                  ? -1
                                  : ((static_cast<int64_t>(x.req) * a.records + id) * a.page + (j - r * a.page)) * kW;
          const uint32_t dst = SmemAddr(sm.kv[buf][h]) + (tok / 8) * kWgGroupBytes + (tok % 8) * 16;
          const uint16_t* src = row >= 0 ? source + row : a.source;
#pragma unroll 3  // the producers' 48 registers: fully unrolled, their addresses spilled
          for (int i = 0; i < kWgPieces / 8; ++i) {
            const int pc = p_piece + 8 * i;
            WgCpAsync16(dst + pc * 128, src + (row >= 0 ? pc * 8 : 0), row >= 0 ? 16 : 0);
          }
          if (p_piece == 0) sm.valid[buf][h][tok] = row >= 0;
        }
      CpAsyncCommit();
      if (f + 1 < flat) load_ids(f + 1, ids);  // in flight while this step's copies land
      WgCpAsyncWait<0>();
      FenceProxyAsync();
      MbarArrive(&sm.full[buf]);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWgConsumerRegs));

  Stamp(1);  // the math starts
  const uint32_t q_addr = SmemAddr(sm.q);
  const int rA = warp * 16 + g, rB = rA + 8;  // this thread's heads (of the unit's 64)
  float o[2][64];  // this warpgroup's 256 columns: o[nb][4 j + r], column 256 wg + 128 nb + 8 j + 2 q4 + (r & 1)
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads rA and rB
  for (int f = 0; f < flat; ++f) {
    const int t = f % steps, buf = f % kWgBuffers;
    const bool two = t * kWgStepStages + 1 < stages;  // the step holds both stages (else stage 0 only)
    const WgUnit x = WgUnitAt(a, u_begin + f / steps);
    MbarWait(&sm.full[buf], (f / kWgBuffers) & 1);  // step f's records (and query) landed and fenced
    if (f <= 1) Stamp(f == 0 ? 2 : 6);  // step 0 / 1 landed
    if (t == 0) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[nb][i] = 0.f;
      m0 = m1 = -INFINITY;
      l0 = l1 = 0.f;
    }

    // Scores of this warpgroup's stage (warpgroup 1 has none in a one-stage step).
    const bool scorer = wg == 0 || two;
    float sc[16], mx0 = -INFINITY, mx1 = -INFINITY;
    uint32_t mine[2][4] = {};
    if (scorer) WgStageScores<4>(sc, q_addr, SmemAddr(sm.kv[buf][wg]), sm.valid[buf][wg], 0, a.scale, q4, mx0, mx1);
    if (f == 0) Stamp(3);  // step 0 scored
    if (q4 == 0) sm.xmax[wg][rA] = mx0, sm.xmax[wg][rB] = mx1;
    WgMathSync();  // both stages' maxima
    // The step's online softmax, row by row: both warpgroups compute the same maxima and alphas.
    const float n1A = fmaxf(m0, sm.xmax[0][rA]), n1B = fmaxf(m1, sm.xmax[0][rB]);
    const float n2A = two ? fmaxf(n1A, sm.xmax[1][rA]) : n1A, n2B = two ? fmaxf(n1B, sm.xmax[1][rB]) : n1B;
    const float a1A = m0 == -INFINITY ? 0.f : expf(m0 - n1A), a1B = m1 == -INFINITY ? 0.f : expf(m1 - n1B);
    const float a2A = n1A == -INFINITY ? 0.f : expf(n1A - n2A), a2B = n1B == -INFINITY ? 0.f : expf(n1B - n2B);
    if (scorer) {
      float s0, s1;
      WgProbabilities<4>(sc, wg == 0 ? n1A : n2A, wg == 0 ? n1B : n2B, mine, s0, s1);
      uint4* xp = reinterpret_cast<uint4*>(sm.xp[wg][me]);
      xp[0] = make_uint4(mine[0][0], mine[0][1], mine[0][2], mine[0][3]);
      xp[1] = make_uint4(mine[1][0], mine[1][1], mine[1][2], mine[1][3]);
      if (q4 == 0) sm.xsum[wg][rA] = s0, sm.xsum[wg][rB] = s1;
    }
    WgMathSync();  // both stages' P fragments and sums (the next writes follow the next step's barriers)
    if (f == 0) Stamp(4);  // step 0's softmax exchanged
    l0 = a1A * l0 + sm.xsum[0][rA];  // the same order in both warpgroups: the same l
    l1 = a1B * l1 + sm.xsum[0][rB];
    if (two) {
      l0 = a2A * l0 + sm.xsum[1][rA];
      l1 = a2B * l1 + sm.xsum[1][rB];
    }
    m0 = n2A, m1 = n2B;

    // O = alpha O + P V, stage by stage: this warpgroup's own P from registers, the other's from
    // the exchange (the same lanes hold the same fragment positions in both warpgroups).
#pragma unroll
    for (int h = 0; h < kWgStepStages; ++h) {
      if (h == 1 && !two) break;
      uint32_t pa[2][4];
      if (h == wg) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
#pragma unroll
          for (int i = 0; i < 4; ++i) pa[ks][i] = mine[ks][i];
      } else {
        const uint4* xp = reinterpret_cast<const uint4*>(sm.xp[h][me]);
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          const uint4 v = xp[ks];
          pa[ks][0] = v.x, pa[ks][1] = v.y, pa[ks][2] = v.z, pa[ks][3] = v.w;
        }
      }
      if (h == 0) WgRescale(o, a1A, a1B);
      else WgRescale(o, a2A, a2B);
      WgStageValues(o, pa, SmemAddr(sm.kv[buf][h]), wg);
    }

    // This thread is done with the step's buffer (and, at a unit's end, with the query).
    MbarArrive(&sm.empty[buf]);
    if (f == 0) Stamp(5);  // step 0's P @ V done
    if (t == steps - 1) {  // the unit's partial: (m, l, o) of its chunk, for the combine kernel
      const int64_t hA = x.head0 + rA, hB = x.head0 + rB;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int col = wg * kWgColumns + nb * 128 + 8 * j + 2 * q4;
          WgStore2(a.o_part + (hA * kChunks + x.chunk) * kDv + col, o[nb][4 * j], o[nb][4 * j + 1]);
          WgStore2(a.o_part + (hB * kChunks + x.chunk) * kDv + col, o[nb][4 * j + 2], o[nb][4 * j + 3]);
        }
      if (wg == 0 && q4 == 0) {
        *reinterpret_cast<float2*>(a.ml + (hA * kChunks + x.chunk) * 2) = make_float2(m0, l0);
        *reinterpret_cast<float2*>(a.ml + (hB * kChunks + x.chunk) * 2) = make_float2(m1, l1);
      }
    }
  }
  Stamp(7);  // exit
#elif defined(__CUDA_ARCH__)
  __trap();  // device code without sm_90a's features: the build needs CMAKE_CUDA_ARCHITECTURES=90a (ARCH=sm_90a)
#endif
}

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_

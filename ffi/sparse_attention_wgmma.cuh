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
// only where its range crosses into another 64-head block; the reload waits for every copy in
// flight, a pipeline drain counted in the A/B). A block is two warpgroups; both score each
// 32-token stage for all 64 heads (wgmma m64n32k16, Q and K from shared memory; the same
// instructions on the same values, so both hold the same scores, maxima and p bits, with no
// exchange between them; HISPARSE_SPARSE_ATTENTION_WGMMA_SPLIT=1 halves that work, below) and
// each owns 256 of the 512 output columns (two m64n128k16 a k-step, P from registers, V from the
// same stage buffer read N-major). The stage buffers are filled by every thread with 16-byte
// cp.async (zero-filled where a token has no record): three buffers, the next two stages in flight
// while one is computed, one __syncthreads a stage. Each stage is serial within a warpgroup
// (scores, wait, softmax, P @ V, wait); overlapping them is the next step once this is measured.
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
// alpha l + (the row's p summed: each thread's in token order, then the quad's xor tree; split,
// warpgroup 0's half then warpgroup 1's), o =
// alpha o + P V. The bits differ from the mma.sync kernel's (the tensor cores' order, the sums'
// order) within the contract's rounding; the checker holds both to the CPU oracle's bound.
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_
#define HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_

constexpr int kWgThreads = 256;                           // two warpgroups
constexpr int kWgBuffers = 3;                             // stage buffers, two loads in flight
constexpr int kWgPieces = kW / 8;                         // 72 16-byte pieces a row
constexpr int kWgGroupBytes = kWgPieces * 128;            // 9216: 8 rows of core matrices
constexpr int kWgStageBytes = kStage / 8 * kWgGroupBytes; // 36864: a stage's 32 tokens
constexpr int kWgQBytes = kHt / 8 * kWgGroupBytes;        // 73728: 64 heads
constexpr int kWgScoreSteps = kW / 16;                    // 36 k-steps of the scores
constexpr int kWgColumns = kDv / 2;                       // 256 output columns a warpgroup
static_assert(kWgThreads * 9 == kStage * kWgPieces, "a stage's pieces split evenly, 9 a thread");
// Who scores a stage (an A/B, -D): 0, both warpgroups score all 32 tokens (no exchange, twice the
// score MMAs); 1, warpgroup w scores tokens 16 w .. 16 w + 15 (m64n16k16) and the two exchange
// their row maxima, then their P fragments and row sums, through shared memory (two more barriers
// a stage). The P fragment of a 16-token half is exactly one k-step's A operand of P @ V, and both
// warpgroups hold it in the same lanes, so the exchange is a copy by thread index.
#ifndef HISPARSE_SPARSE_ATTENTION_WGMMA_SPLIT
#define HISPARSE_SPARSE_ATTENTION_WGMMA_SPLIT 0
#endif
constexpr bool kWgSplitScores = HISPARSE_SPARSE_ATTENTION_WGMMA_SPLIT != 0;

struct WgSmem {
  alignas(128) uint8_t q[kWgQBytes];
  alignas(128) uint8_t kv[kWgBuffers][kWgStageBytes];
  uint8_t valid[kWgBuffers][kStage];  // the stage's token has a record (else zero-filled, score -inf)
  // The split scores' exchange (kWgSplitScores): each warpgroup's row maxima, P fragments (by
  // thread of the warpgroup) and row sums of its 16 tokens.
  float xmax[2][kHt];
  alignas(16) uint32_t xp[2][128][4];
  float xsum[2][kHt];
};
static_assert(sizeof(WgSmem) <= 227 * 1024, "the wgmma chunk kernel's shared memory exceeds sm_90's 227 KB a block");
// The ring refills stage f - 1's buffer at step f (after the barrier that ends its reads), so it
// needs a buffer besides the one being read.
static_assert(kWgBuffers >= 2, "the wgmma chunk kernel's copy ring needs at least two stage buffers");

__device__ __forceinline__ void WgCpAsync16(uint32_t dst, const void* src, int bytes) {
  // bytes 0: the 16 bytes are zero-filled and nothing is read.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
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

// The same over 16 tokens: m64n16k16.
__device__ __forceinline__ void WgScore(float (&s)[8], uint64_t desc_q, uint64_t desc_k, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(s[0]), "+f"(s[1]), "+f"(s[2]), "+f"(s[3]), "+f"(s[4]), "+f"(s[5]), "+f"(s[6]), "+f"(s[7])
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
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, q4 = lane % 4;
  const int u_begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * a.units / gridDim.x);
  const int u_end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * a.units / gridDim.x);
  const int stages = a.chunk_tokens / kStage;  // whole: k P is a multiple of 16 x 32
  const int flat = (u_end - u_begin) * stages;
  if (flat <= 0) return;
  const int layer = __ldg(a.layer);
  const bool layer_ok = layer >= 0 && layer < a.layers;  // outside: no record is read
  const uint16_t* source = a.source + (layer_ok ? static_cast<int64_t>(layer) * a.layer_stride : 0);

  // Copy role: token ld_tok of a stage, its pieces ld_piece + 8 i (i < 9). A warp's copy lands on
  // 8 tokens x 4 pieces: the 8 tokens' 16 bytes of a piece fill one 128-byte core-matrix row, so
  // its 32 writes hit distinct banks (4 tokens x 8 pieces would be 2-way conflicted).
  const int ld_tok = tid % 8 + 8 * (tid / 64), ld_piece = (tid / 8) % 8;
  // The source row (elements) of this thread's token in flat stage fs, or -1 without a record.
  auto token_row = [&](int fs) -> int64_t {
    const WgUnit x = WgUnitAt(a, u_begin + fs / stages);
    const int j = x.chunk * a.chunk_tokens + (fs % stages) * kStage + ld_tok;
    const int r = a.page == 1 ? j : a.by_page.Div(j);
    const int id = __ldg(a.index + static_cast<int64_t>(x.req) * a.top_k + r);
    if (!layer_ok || id < 0 || id >= a.records) return -1;
    return ((static_cast<int64_t>(x.req) * a.records + id) * a.page + (j - r * a.page)) * kW;
  };
  auto issue = [&](int fs, int64_t row) {
    const int buf = fs % kWgBuffers;
    const uint32_t dst = SmemAddr(sm.kv[buf]) + (ld_tok / 8) * kWgGroupBytes + (ld_tok % 8) * 16;
    const uint16_t* src = row >= 0 ? source + row : a.source;
#pragma unroll
    for (int i = 0; i < 9; ++i) {
      const int p = ld_piece + 8 * i;
      WgCpAsync16(dst + p * 128, src + (row >= 0 ? p * 8 : 0), row >= 0 ? 16 : 0);
    }
    if (ld_piece == 0) sm.valid[buf][ld_tok] = row >= 0;
  };
  auto load_query = [&](int64_t head0) {
    // 8 heads x 4 pieces a warp, as the stages' copies (consecutive pieces of one head are 128
    // bytes apart: a warp of them would write one 16-byte bank slot 32 times).
    for (int i = tid; i < kHt * kWgPieces; i += kWgThreads) {
      const int h = i % 8 + 8 * (i / (8 * kWgPieces)), p = (i / 8) % kWgPieces;
      WgCpAsync16(SmemAddr(sm.q) + p * 128 + (h / 8) * kWgGroupBytes + (h % 8) * 16, a.q + (head0 + h) * kW + p * 8, 16);
    }
  };

  // Prologue: the first unit's query with stage 0, then stages 1 .. kWgBuffers - 2, one group each.
  int64_t query_head0 = WgUnitAt(a, u_begin).head0;
  load_query(query_head0);
  int64_t next_row = token_row(0);
#pragma unroll
  for (int s = 0; s < kWgBuffers - 1; ++s) {
    if (s < flat) issue(s, next_row);
    CpAsyncCommit();
    if (s + 1 < flat) next_row = token_row(s + 1);
  }

  const uint32_t q_addr = SmemAddr(sm.q);
  float o[2][64];  // this warpgroup's 256 columns: o[nb][4 j + r], column 256 wg + 128 nb + 8 j + 2 q4 + (r & 1)
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 16 warp + g and + 8
  for (int f = 0; f < flat; ++f) {
    const int s = f % stages, buf = f % kWgBuffers;
    const WgUnit x = WgUnitAt(a, u_begin + f / stages);
    WgCpAsyncWait<kWgBuffers - 2>();  // this thread's copies of stage f (and of the query) landed
    // Required (cp.async writes through the generic proxy, wgmma reads through the async one), but
    // it compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S: if that membar waits for stage f + 1's
    // copies too, the ring overlaps nothing (the mma.sync kernel measured ~1000 cycles of membar
    // stall for it on every pass). First GPU run: check ncu's membar stalls; bulk copies, which
    // complete on an mbarrier through the async proxy, would not need it.
    FenceProxyAsync();
    __syncthreads();  // every thread's; and stage f - 1 fully consumed, its buffer free
    if (x.head0 != query_head0) {  // another 64-head block's query: every wgmma on the old one is done
      load_query(x.head0);
      CpAsyncCommit();
      WgCpAsyncWait<0>();
      FenceProxyAsync();
      __syncthreads();
      query_head0 = x.head0;
    }
    const int fn = f + kWgBuffers - 1;  // into stage f - 1's buffer
    if (fn < flat) issue(fn, next_row);
    CpAsyncCommit();
    if (fn + 1 < flat) next_row = token_row(fn + 1);
    if (s == 0) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int i = 0; i < 64; ++i) o[nb][i] = 0.f;
      m0 = m1 = -INFINITY;
      l0 = l1 = 0.f;
    }

    // The stage's online softmax, row by row: this thread's heads 16 warp + g and + 8.
    const uint32_t kv_addr = SmemAddr(sm.kv[buf]);
    const uint8_t* valid = sm.valid[buf];
    uint32_t pa[2][4];  // A fragments of the two 16-token k-steps of P @ V
    float al0, al1, sum0, sum1;
    if constexpr (!kWgSplitScores) {
      float sc[16], mx0, mx1;  // all 32 tokens
      WgStageScores<4>(sc, q_addr, kv_addr, valid, 0, a.scale, q4, mx0, mx1);
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      al0 = m0 == -INFINITY ? 0.f : expf(m0 - n0), al1 = m1 == -INFINITY ? 0.f : expf(m1 - n1);
      WgProbabilities<4>(sc, n0, n1, pa, sum0, sum1);
      m0 = n0, m1 = n1;
    } else {
      float sc[8], mx0, mx1;  // this warpgroup's 16 tokens (two 8-token groups further per warpgroup)
      WgStageScores<2>(sc, q_addr, kv_addr + wg * 2 * kWgGroupBytes, valid, 16 * wg, a.scale, q4, mx0, mx1);
      const int rA = warp * 16 + g, rB = rA + 8, me = tid % 128;
      if (q4 == 0) sm.xmax[wg][rA] = mx0, sm.xmax[wg][rB] = mx1;
      __syncthreads();  // both halves' maxima
      const float n0 = fmaxf(m0, fmaxf(sm.xmax[0][rA], sm.xmax[1][rA]));
      const float n1 = fmaxf(m1, fmaxf(sm.xmax[0][rB], sm.xmax[1][rB]));
      al0 = m0 == -INFINITY ? 0.f : expf(m0 - n0), al1 = m1 == -INFINITY ? 0.f : expf(m1 - n1);
      uint32_t mine[1][4];
      float s0, s1;
      WgProbabilities<2>(sc, n0, n1, mine, s0, s1);
      *reinterpret_cast<uint4*>(sm.xp[wg][me]) = make_uint4(mine[0][0], mine[0][1], mine[0][2], mine[0][3]);
      if (q4 == 0) sm.xsum[wg][rA] = s0, sm.xsum[wg][rB] = s1;
      __syncthreads();  // both halves' P fragments and sums (the next writes follow the next stage's barriers)
      const uint4 other = *reinterpret_cast<const uint4*>(sm.xp[1 - wg][me]);
      const uint32_t theirs[4] = {other.x, other.y, other.z, other.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pa[0][i] = wg == 0 ? mine[0][i] : theirs[i];  // tokens 0..15: warpgroup 0's
        pa[1][i] = wg == 0 ? theirs[i] : mine[0][i];
      }
      sum0 = sm.xsum[0][rA] + sm.xsum[1][rA];  // the same order in both warpgroups: the same l
      sum1 = sm.xsum[0][rB] + sm.xsum[1][rB];
      m0 = n0, m1 = n1;
    }
    l0 = al0 * l0 + sum0;
    l1 = al1 * l1 + sum1;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[nb][4 * j] *= al0;
        o[nb][4 * j + 1] *= al0;
        o[nb][4 * j + 2] *= al1;
        o[nb][4 * j + 3] *= al1;
      }

    // O += P V: this warpgroup's 256 columns (8-column groups 128 bytes apart: 16 bytes a column),
    // tokens in k-steps of 16 (two 8-token groups, 2 x 9216 bytes).
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

    if (s == stages - 1) {  // the unit's partial: (m, l, o) of its chunk, for the combine kernel
      const int64_t hA = x.head0 + warp * 16 + g, hB = hA + 8;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int col = wg * kWgColumns + nb * 128 + 8 * j + 2 * q4;
          *reinterpret_cast<float2*>(a.o_part + (hA * kChunks + x.chunk) * kDv + col) =
              make_float2(o[nb][4 * j], o[nb][4 * j + 1]);
          *reinterpret_cast<float2*>(a.o_part + (hB * kChunks + x.chunk) * kDv + col) =
              make_float2(o[nb][4 * j + 2], o[nb][4 * j + 3]);
        }
      if (wg == 0 && q4 == 0) {
        *reinterpret_cast<float2*>(a.ml + (hA * kChunks + x.chunk) * 2) = make_float2(m0, l0);
        *reinterpret_cast<float2*>(a.ml + (hB * kChunks + x.chunk) * 2) = make_float2(m1, l1);
      }
    }
  }
  WgCpAsyncWait<0>();  // no copy outlives the block (the trailing groups are empty)
#elif defined(__CUDA_ARCH__)
  __trap();  // device code without sm_90a's features: the build needs CMAKE_CUDA_ARCHITECTURES=90a (ARCH=sm_90a)
#endif
}

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_WGMMA_CUH_

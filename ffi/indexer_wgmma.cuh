// The lightning indexer's wgmma kernel (indexer_kernels.cu includes it once,
// inside its namespace, after the register-q kernel whose pieces it shares):
// fp8 keys, bfloat16 q, d = 128, 16 < H <= 64. Built only into sm_90a code
// (HISPARSE_SM90A: the tensor cores' warpgroup instructions are not in plain
// sm_90); elsewhere the kernel traps and the launcher never picks it.
//
// A warpgroup (4 warps) scores 64-token tiles: warp w of the group copies and
// widens tokens 16w..16w+15 exactly as the register-q kernel does (its own
// cp.async ring, ldmatrix, fp8 -> bf16 bit moves: the A fragments of
// mma.sync m16n8k16 are those of wgmma's A from registers), and the group
// issues one wgmma m64nNk16 per k-step (N = 8 x n-tiles heads) with q as B in
// shared memory, staged once per row in the no-swizzle K-major core-matrix
// layout (StageQuery<.., true>). The accumulators come back in mma.sync's C
// layout per n-tile, so the epilogue is the register-q kernel's (TileChains,
// the quad shuffles). What changes is the tensor-core instruction: q is no
// longer held in registers (no 64-128 registers of B fragments) and the MMAs
// run at wgmma's rate, asynchronously. The products are exact and the sums
// float32 as in indexer.h; whether the tensor cores' internal order within a
// k-step equals mma.sync's is not documented, so this kernel is held to the
// double-precision bound, not to the other kernels' bits (on an H200 its bits
// equalled theirs in every case the checker ran; batch invariance holds as for
// them). Measured (decode table, H200): faster than every mma.sync shape at
// H = 64 (b 17 x 128K: 134.6 us against 144.4), slower than k32x12 at H = 32
// (99.9 against 94.5): it halves the tensor-core cost, but the widening and the
// epilogue on the integer and FMA pipes remain, and at H = 32 they dominate.
#ifndef HISPARSE_FFI_INDEXER_WGMMA_CUH_
#define HISPARSE_FFI_INDEXER_WGMMA_CUH_

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HISPARSE_INDEXER_WGMMA_DEVICE 1
#endif

constexpr int kWgTile = 64;  // tokens of a warpgroup tile; 16 per warp

#ifdef HISPARSE_INDEXER_WGMMA_DEVICE
// Generic-proxy shared-memory writes (the staged q) made visible to wgmma's async proxy.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// acc (+)= a b over one k-step: m64n32k16, A (this warp's 16 rows) from
// registers, B (k16 x 32 heads of q) from shared memory at `desc`; acc is
// overwritten when `accumulate` is 0.
__device__ __forceinline__ void Wgmma32(float (&acc)[4][4], const uint32_t (&a)[4], uint64_t desc,
                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]), "+f"(acc[1][2]), "+f"(acc[1][3]), "+f"(acc[2][0]), "+f"(acc[2][1]), "+f"(acc[2][2]), "+f"(acc[2][3]), "+f"(acc[3][0]), "+f"(acc[3][1]), "+f"(acc[3][2]), "+f"(acc[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

// acc (+)= a b over one k-step: m64n64k16, A (this warp's 16 rows) from
// registers, B (k16 x 64 heads of q) from shared memory at `desc`; acc is
// overwritten when `accumulate` is 0.
__device__ __forceinline__ void Wgmma64(float (&acc)[8][4], const uint32_t (&a)[4], uint64_t desc,
                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(acc[0][0]), "+f"(acc[0][1]), "+f"(acc[0][2]), "+f"(acc[0][3]), "+f"(acc[1][0]), "+f"(acc[1][1]), "+f"(acc[1][2]), "+f"(acc[1][3]), "+f"(acc[2][0]), "+f"(acc[2][1]), "+f"(acc[2][2]), "+f"(acc[2][3]), "+f"(acc[3][0]), "+f"(acc[3][1]), "+f"(acc[3][2]), "+f"(acc[3][3]), "+f"(acc[4][0]), "+f"(acc[4][1]), "+f"(acc[4][2]), "+f"(acc[4][3]), "+f"(acc[5][0]), "+f"(acc[5][1]), "+f"(acc[5][2]), "+f"(acc[5][3]), "+f"(acc[6][0]), "+f"(acc[6][1]), "+f"(acc[6][2]), "+f"(acc[6][3]), "+f"(acc[7][0]), "+f"(acc[7][1]), "+f"(acc[7][2]), "+f"(acc[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}
#endif  // HISPARSE_INDEXER_WGMMA_DEVICE

// kNTiles n-tiles of 8 heads (4: H <= 32, 8: H <= 64); kMaxWarps a multiple of 4.
template <int kNTiles, int kStages, int kMaxWarps>
__global__ void __launch_bounds__(kMaxWarps* kWarp, 1) IndexScoresWgmmaKernel(const IndexerArgs p) {
#ifdef HISPARSE_INDEXER_WGMMA_DEVICE
  static_assert(kNTiles == 4 || kNTiles == 8, "m64n32k16 or m64n64k16");
  static_assert(kMaxWarps % 4 == 0, "whole warpgroups");
  constexpr int kUnits = 8;  // fp8, d = 128: 16-byte units per key row
  constexpr int kStride = PaddedKeyStride<kUnits>();
  constexpr int kKSteps = 8;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t warp_max[kMaxWarps];
  uint8_t* q_smem = smem;
  float* w_smem = reinterpret_cast<float*>(smem + p.q_copy_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  const int group = warp / 4, quarter = warp % 4, groups = warps / 4;
  const uint8_t* ring = smem + p.q_copy_bytes + p.w_bytes + warp * kStages * p.stage_bytes;
  const uint32_t ring_base = SharedAddress(ring);
  // q as B: k-step s starts at core matrix (2s, 0); K-adjacent core matrices are `heads_padded / 8`
  // matrices apart, N-adjacent ones one matrix (128 bytes).
  const uint32_t q_groups = static_cast<uint32_t>(p.heads_padded / 8);
  const uint64_t desc0 = wgmma::Descriptor(SharedAddress(q_smem), 128 * q_groups, 128);
  const uint64_t desc_step = (2 * 128 * q_groups) >> 4;  // one k-step further, in the start field

  // This block's 64-token tiles: a contiguous range; this warpgroup's: begin + group + k * groups.
  const int64_t share = p.total_tiles / gridDim.x, extra = p.total_tiles % gridDim.x;
  const int64_t begin = blockIdx.x * share + Min64(blockIdx.x, extra);
  const int64_t end = begin + share + (blockIdx.x < extra ? 1 : 0);
  const int64_t first = begin + group;
  const int64_t count = first < end ? (end - first + groups - 1) / groups : 0;

  IssueCursor next;
  next.row = first / p.tiles_per_row;
  next.tile = first - next.row * p.tiles_per_row;
  next.limit = count > 0 ? RowLimit(p, next.row) : 0;
  int64_t issued = 0;
  // This warp's 16 tokens of the group's tile `issued`, one commit group per tile (as the register-q kernel).
  auto issue_next = [&](int stage) {
    if (issued < count) {
      const int64_t t0 = next.tile * kWgTile + 16 * quarter;
      IssueTileFixed<16, true, kUnits>(p, ring_base + stage * p.stage_bytes, next.row, t0,
                                       TileValid<16>(next.limit, t0), lane);
      next.tile += groups;
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
  int64_t k = 0;
  int stage = 0;
  const int g = lane / 4, c4 = lane % 4;
  for (int64_t lo = begin; lo < end;) {
    const int64_t row = lo / p.tiles_per_row;
    const int64_t row_end = Min64(end, (row + 1) * p.tiles_per_row);
    __syncthreads();  // the previous row's q and w are no longer read (its wgmmas have been waited for)
    const float factor = StageQuery<1, true, true>(p, row, q_smem, w_smem, warp_max);
    FenceProxyAsync();
    __syncthreads();
    float w[kNTiles][2];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      w[n][0] = w_smem[8 * n + 2 * c4];
      w[n][1] = w_smem[8 * n + 2 * c4 + 1];
    }
    const bool all_heads = p.heads == 8 * kNTiles;
    const int64_t limit = RowLimit(p, row);
    const int64_t k_end = first < row_end ? (row_end - first + groups - 1) / groups : 0;
    int64_t t0 = (first + k * groups - row * p.tiles_per_row) * kWgTile;  // of the group's tile k
    for (; k < k_end; ++k, t0 += groups * kWgTile) {
      issue_next(stage == 0 ? kStages - 1 : stage - 1);
      WaitAsync<kStages - 1>();
      __syncwarp();
      const uint8_t* st = ring + stage * p.stage_bytes;
      const int64_t mine = t0 + 16 * quarter;  // this warp's first token
      float* out = p.scores + row * p.tokens + mine;
      if (TileValid<kWgTile>(limit, t0) <= 0) {  // the whole group's tile is past lengths[row]
        if (lane < 16 && mine + lane < p.tokens) out[lane] = -INFINITY;
      } else {
        // Rows of this warp past lengths[row] hold stale keys: their own rows of the product only.
        const int valid = TileValid<16>(limit, mine);
        uint32_t words[kKSteps / 2][4];
        const uint32_t a_base = SharedAddress(st) + (lane % 16) * kStride + 16 * (lane / 16);
#pragma unroll
        for (int j = 0; j < kKSteps / 2; ++j) LoadMatrixX4(a_base + 32 * j, words[j]);
        uint32_t a[kKSteps][4];
#pragma unroll
        for (int j = 0; j < kKSteps / 2; ++j) {
          Fp8Fragment(words[j][0], words[j][1], a[2 * j]);
          Fp8Fragment(words[j][2], words[j][3], a[2 * j + 1]);
        }
        float acc[kNTiles][4];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        wgmma::Fence();
#pragma unroll
        for (int s = 0; s < kKSteps; ++s) {
          if constexpr (kNTiles == 4) {
            Wgmma32(acc, a[s], desc0 + s * desc_step, s > 0);
          } else {
            Wgmma64(acc, a[s], desc0 + s * desc_step, s > 0);
          }
        }
        wgmma::Commit();
        wgmma::WaitAll();
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) wgmma::Keep(acc[n][i]);
        const float* scale = reinterpret_cast<const float*>(st + 16 * kStride);
        float top, bottom;
        if (all_heads) {
          TileChains<true, kNTiles, false>(acc, w, scale[g], scale[g + 8], p.heads, c4, top, bottom);
        } else {
          TileChains<true, kNTiles, true>(acc, w, scale[g], scale[g + 8], p.heads, c4, top, bottom);
        }
        top += __shfl_xor_sync(kFullMask, top, 1);
        top += __shfl_xor_sync(kFullMask, top, 2);
        bottom += __shfl_xor_sync(kFullMask, bottom, 1);
        bottom += __shfl_xor_sync(kFullMask, bottom, 2);
        if (c4 < 2) {
          const int r = g + 8 * c4;
          const float sum = c4 == 0 ? top : bottom;
          if (mine + r < p.tokens) out[r] = r < valid ? sum * factor : -INFINITY;
        }
      }
      __syncwarp();
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    lo = row_end;
  }
  WaitAsync<0>();
#else
  (void)p;
  __trap();
#endif
}

#endif  // HISPARSE_FFI_INDEXER_WGMMA_CUH_

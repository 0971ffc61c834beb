// Sparse MLA decode attention kernels (sparse_attention_cuda.h has the plan, sparse_attention.h
// the arithmetic). Shapes are fixed by the model family: W = 576, value 512, head tile 64.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "async_copy.cuh"
#include "sparse_attention_cuda.h"
#include "wgmma.cuh"

namespace hisparse {
namespace {

constexpr int kW = static_cast<int>(kSparseAttentionWidth);
constexpr int kDv = static_cast<int>(kSparseAttentionValueWidth);
constexpr int kHt = static_cast<int>(kSparseAttentionHeadTile);
constexpr int kChunks = static_cast<int>(kSparseAttentionChunks);
constexpr int kStage = static_cast<int>(kSparseAttentionStage);
// A pass covers two of the contract's stages (64 tokens): the block's barriers and the max
// exchange run once per pass, while the online softmax still steps stage by stage (two alphas).
constexpr int kPass = 2 * kStage;
// Warps a block: 8 (255 registers a thread: each warp scores 32 tokens and multiplies 64 value
// columns, so every Q and P fragment is read from shared memory half as often as with 16, and
// ptxas keeps the next k-step's fragments in flight), or 16 (128 registers; 4 warps a scheduler).
// A head's arithmetic is the same in both (the same mma per element, the same sums): A/B by -D.
// H200, 64 heads, k = 2048 (run 1 of issue 22): 8 warps 72.7 / 129.7 us at batch 17 / 41, 16
// warps 77.7 / 137.3; the same output bits.
#ifndef HISPARSE_SPARSE_ATTENTION_WARPS
#define HISPARSE_SPARSE_ATTENTION_WARPS 8
#endif
constexpr int kWarps = HISPARSE_SPARSE_ATTENTION_WARPS;
constexpr int kThreads = 32 * kWarps;
constexpr int kRow = kW + 8;                    // KV smem row in bf16: 1168 B, ldmatrix's 8 rows hit 8 bank groups
constexpr int kRecordBytes = kW * 2;            // one token: 1152 B, one bulk copy
constexpr int kProw = kPass + 8;                // P tile row: 144 B, conflict-free for the same reason
constexpr int kQPieces = kDv * 2 / 16;          // 64 16-byte pieces of a head's latent query in smem
constexpr int kRopeSteps = (kW - kDv) / 16;     // 4 k-steps of the rope query, read into registers
constexpr int kLatentSteps = kDv / 16;          // 32 k-steps of the latent query, read from smem
// The latent score loop unrolls by this much: fully (32), ptxas hoists the ldmatrix loads past the
// 128-register cap of 16 warps and spills; 16 fits with none (-Xptxas -v). A/B: -D.
#ifndef HISPARSE_SPARSE_ATTENTION_LATENT_UNROLL
#define HISPARSE_SPARSE_ATTENTION_LATENT_UNROLL 16
#endif
constexpr int kLatentUnroll = HISPARSE_SPARSE_ATTENTION_LATENT_UNROLL;
// Head groups per block, fixed (1, 2 or 4) instead of chosen by the batch (GroupsFor): an A/B of
// the small-batch split, -DHISPARSE_SPARSE_ATTENTION_HEAD_GROUPS=4 is the one-variant kernel.
#ifndef HISPARSE_SPARSE_ATTENTION_HEAD_GROUPS
#define HISPARSE_SPARSE_ATTENTION_HEAD_GROUPS 0
#endif
[[maybe_unused]] constexpr int kHeadGroupsOverride = HISPARSE_SPARSE_ATTENTION_HEAD_GROUPS;  // unused by the wgmma build
// Blocks that run several units in turn where the units outnumber the multiprocessors (1), or one
// block per unit (0: the A/B).
#ifndef HISPARSE_SPARSE_ATTENTION_PERSISTENT
#define HISPARSE_SPARSE_ATTENTION_PERSISTENT 1
#endif
[[maybe_unused]] constexpr bool kPersistent = HISPARSE_SPARSE_ATTENTION_PERSISTENT != 0;
// Diagnosis only, never in a shipped build (wrong outputs): what a pass costs without a part of
// its work, for the benchmark. Bits: 1 = no score mma, 2 = no P @ V mma, 4 = no record copies
// (the buffers keep whatever they held).
#ifndef HISPARSE_SPARSE_ATTENTION_DIAG
#define HISPARSE_SPARSE_ATTENTION_DIAG 0
#endif
constexpr int kDiag = HISPARSE_SPARSE_ATTENTION_DIAG;
// How a pass's record rows reach shared memory: 0, one TMA bulk copy per row (warp lanes 0..3,
// the barrier counts a warp's bytes); 1, 16-byte cp.async by all 32 lanes of the warp (8 lanes a
// row, 9 pieces each; every thread arrives on the barrier when its copies land). A/B: -D.
#ifndef HISPARSE_SPARSE_ATTENTION_CPASYNC
#define HISPARSE_SPARSE_ATTENTION_CPASYNC 0
#endif
constexpr bool kCpAsyncRows = HISPARSE_SPARSE_ATTENTION_CPASYNC != 0;
constexpr int kColsPerWarp = kDv / kWarps;      // value columns of all the heads per warp in P @ V (32 or 64)
constexpr int kPvTiles = kColsPerWarp / 8;      // their n8 tiles
constexpr int kTokParts = kWarps / 4;           // score role: 4 head groups x this many token parts
constexpr int kTokPerWarp = kPass / kTokParts;  // 16 or 32 tokens a score warp
constexpr int kScoreTiles = kTokPerWarp / 8;    // their n8 tiles
constexpr int kQuartersPerWarp = kTokPerWarp / 16;  // the contract's sums run per 16-token quarter
static_assert(kHt == 64 && kPass == 64 && (kWarps == 16 || kWarps == 8),
              "warp roles assume 4 head groups x 2 or 4 token parts of a 64-token pass");

// Shared memory of the chunk kernel: two 64-token KV buffers (bulk-copied rows, padded), the
// latent query swizzled (16-byte piece p of head h at p ^ (h & 7): conflict-free ldmatrix with no
// padding, which would not fit), the P tile and the small exchange arrays.
struct Smem {
  uint16_t kv[2][kPass * kRow];
  uint16_t q[kHt * kDv];
  uint16_t p[kHt * kProw];
  unsigned long long bar[2];        // mbarriers: buffer b's bytes landed
  float red_max[4][kHt];            // each token quarter's row max of the pass
  float red_sum[4][kHt];            // each token quarter's row sum of p
  float alpha[2][kHt];              // the pass's two stage rescales
  uint8_t valid[2][kPass];
  // The cluster plan's merge (kMerge): this chunk's (m, l) per head, and the open page's scores of
  // the heads this block merges. The chunk's o goes to the KV buffers, free by then (OStride).
  float2 ml[kHt];
  float tail_s[4][kSparseAttentionMaxPage];
};
// A head's o row in the cluster plan, floats: 8 past 512 so the fragment stores of rows g and g + 4
// fall in other banks; 64 rows fit in the KV buffers.
constexpr int kOStride = kDv + 8;

static_assert(kHt * kOStride * 4 <= sizeof(Smem::kv), "the cluster plan's o rows must fit in the KV buffers");
static_assert(sizeof(Smem) <= 227 * 1024, "the chunk kernel's shared memory exceeds sm_90's 227 KB a block");

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// This thread's arrival on `bar` once its earlier cp.async copies have landed (counts as one of the
// barrier's expected arrivals).
__device__ __forceinline__ void CpAsyncArrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
// The records stream through L2 once a call: evicted first (-DHISPARSE_SPARSE_ATTENTION_EVICT_FIRST=1),
// they would displace the combine plan's partials (read back right after) last. An A/B, off.
#ifndef HISPARSE_SPARSE_ATTENTION_EVICT_FIRST
#define HISPARSE_SPARSE_ATTENTION_EVICT_FIRST 0
#endif

// ldmatrix at a 32-bit shared address (smem pointers kept as 32-bit offsets: fewer registers
// than generic 64-bit pointers, under the 128 a thread of 16 warps gets).
__device__ __forceinline__ void Ldm4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Ldm4T(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Diagnosis only, never in a shipped build: -DHISPARSE_SPARSE_ATTENTION_TRACE makes thread 0 of
// each block stamp %globaltimer (ns, comparable across blocks) and clock64 at the phases of its
// first unit; sparse_attention_bench --trace prints where a launch's time goes.
#ifdef HISPARSE_SPARSE_ATTENTION_TRACE
constexpr int kTraceBlocks = 4096, kTraceSlots = 8;
__device__ unsigned long long g_trace_ns[kTraceBlocks][kTraceSlots];
__device__ unsigned long long g_trace_clk[kTraceBlocks][kTraceSlots];
__device__ unsigned long long g_trace_combine_ns[kTraceBlocks][2];
__device__ __forceinline__ void Stamp(int slot) {
  if (threadIdx.x != 0 || blockIdx.x >= kTraceBlocks) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_trace_ns[blockIdx.x][slot] = t;
  g_trace_clk[blockIdx.x][slot] = clock64();
}
__device__ __forceinline__ void StampCombine(int slot) {
  const unsigned block = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x != 0 || block >= kTraceBlocks) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_trace_combine_ns[block][slot] = t;
}
#else
__device__ __forceinline__ void Stamp(int) {}
__device__ __forceinline__ void StampCombine(int) {}
#endif

__device__ __forceinline__ float Bf16ToFloat(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

// n / d and n % d for 0 <= n < 2^31 by a multiply-high and a shift (d fixed at launch): the
// chunk kernel's per-pass bookkeeping (unit, pass, page token) without the ~20-instruction integer
// division, which warp 0 ran on the critical path of every pass.
struct FastDiv {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint32_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int Div(int n) const {
    return static_cast<int>((__umulhi(static_cast<uint32_t>(n), mul) + static_cast<uint32_t>(n)) >> shift);
  }
  __device__ __forceinline__ int Mod(int n) const { return n - Div(n) * static_cast<int>(d); }
};

struct ChunkArgs {
  const uint16_t* q;
  const uint16_t* source;  // layer 0's rows; layer l's start l * layer_stride further
  const int32_t* layer;    // [] int32 on the device: which of `layers` stacked sources
  int64_t layer_stride;
  int layers;
  const int32_t* index;
  float* o_part;  // [b, H, C, 512] (combine plan)
  float* ml;      // [b, H, C, 2] (combine plan)
  const uint16_t* tail;      // the cluster plan's merge: the open page [b, P, 576]
  const uint8_t* tail_valid; // [b, P]
  float* out;                // [b, H, 512]
  int heads, top_k, page, records, chunk_tokens;
  int units;  // (chunk, head block, request) work units; block i runs units i, i + gridDim.x, ...
  int big_units;   // units [0, big_units) have 16 kGroups heads; the rest split_groups x 16 (SplitTail)
  int split_groups;
  float scale;
  FastDiv by_page, by_passes, by_blocks;  // P; passes a chunk; head blocks a request
};

// A work unit: one chunk of one request for one block of 16 kGroups heads. Its bits do not depend
// on which block runs it, nor on what that block ran before: the launch may size the grid to the
// GPU (each block then runs several units, the next one's first loads overlapping this one's end).
struct Unit {
  int chunk, req;
  int64_t head0;  // the unit's first head of [b, H]
  int groups;     // its heads / 16: kGroups, or fewer for a split unit of the last round
};
// The units past big_units are the last round's units split into kGroups / split_groups pieces
// (the launcher's SplitTail): unit big_units + v is piece v % pieces of unit big_units + v / pieces.
template <int kGroups>
__device__ __forceinline__ Unit UnitAt(const ChunkArgs& a, int u) {
  int piece = 0, groups = kGroups;
  if (u >= a.big_units) {
    const int pieces = kGroups / a.split_groups, v = u - a.big_units;
    u = a.big_units + v / pieces;
    piece = v % pieces;
    groups = a.split_groups;
  }
  Unit x;
  x.chunk = u % kChunks;
  const int rest = u / kChunks;
  x.req = a.by_blocks.Div(rest);
  x.head0 = static_cast<int64_t>(x.req) * a.heads + (rest - x.req * static_cast<int>(a.by_blocks.d)) * (16 * kGroups) +
            piece * 16 * groups;
  x.groups = groups;
  return x;
}

// Every warp issues kPass / kWarps rows of each pass (lanes 0..3), so that no warp carries the
// whole issue on the critical path of the pass (one warp issuing all 64 rows held every other
// warp at the next barrier).
constexpr int kRowsPerWarp = kPass / kWarps;
static_assert(kRowsPerWarp * kWarps == kPass && kRowsPerWarp <= 32, "a pass's rows split evenly over the warps");

// The record id of this lane's issue row (warp * 4 + lane, lanes < 4) in pass t of a unit's chunk;
// -1 past the chunk's end or for other lanes. Loaded a pass ahead of its issue, so no issue waits.
__device__ __forceinline__ int RowId(const ChunkArgs& a, const Unit& x, int t, int warp, int lane) {
  const int j = x.chunk * a.chunk_tokens + t * kPass + warp * kRowsPerWarp + lane;
  if (lane >= kRowsPerWarp || j >= (x.chunk + 1) * a.chunk_tokens) return -1;
  return __ldg(a.index + static_cast<int64_t>(x.req) * a.top_k + (a.page == 1 ? j : a.by_page.Div(j)));
}

// This warp issues its rows of pass `t` of unit `x` into buffer `buf` (the id from RowId). A row
// with a record is one bulk copy; a row without (id invalid, layer outside, past the chunk's end)
// is zero-filled (its p is 0; 0 * a stale NaN would not be) and marked invalid. Each warp arrives
// once on the buffer's barrier with its rows' bytes (the barrier counts kWarps arrivals).
__device__ __forceinline__ void IssueRows(const ChunkArgs& a, const uint16_t* source, bool layer_ok, Smem& sm,
                                          const Unit& x, int t, int buf, int warp, int lane, int id) {
  const int row = warp * kRowsPerWarp + lane, j = x.chunk * a.chunk_tokens + t * kPass + row;
  const bool mine = lane < kRowsPerWarp;
  const bool ok = mine && layer_ok && id >= 0 && id < a.records && (kDiag & 4) == 0;
  const int tok = a.page == 1 ? 0 : a.by_page.Mod(j);
  const uint16_t* src = ok ? source + ((static_cast<int64_t>(x.req) * a.records + id) * a.page + tok) * kW : source;
  if (mine) sm.valid[buf][row] = ok;
  if constexpr (kCpAsyncRows) {
    // 32 / kRowsPerWarp lanes copy each of the warp's rows, 16 bytes each a step.
    constexpr int kLanesPerRow = 32 / kRowsPerWarp;
    static_assert(kRecordBytes % (16 * kLanesPerRow) == 0, "a row splits evenly over its lanes");
    const int r = lane / kLanesPerRow, piece0 = lane % kLanesPerRow;
    const bool rok = __shfl_sync(0xffffffffu, ok, r);
    const uint16_t* rsrc = reinterpret_cast<const uint16_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(src), r));
    uint16_t* dst = &sm.kv[buf][(warp * kRowsPerWarp + r) * kRow];
    if (rok) {
#pragma unroll
      for (int s = 0; s < kRecordBytes / (16 * kLanesPerRow); ++s)
        CpAsync16(dst + (piece0 + kLanesPerRow * s) * 8, rsrc + (piece0 + kLanesPerRow * s) * 8);
    } else if ((kDiag & 4) == 0) {
#pragma unroll
      for (int s = 0; s < kRecordBytes / (16 * kLanesPerRow); ++s)
        *reinterpret_cast<uint4*>(dst + (piece0 + kLanesPerRow * s) * 8) = make_uint4(0, 0, 0, 0);
    }
    CpAsyncArrive(&sm.bar[buf]);
    return;
  }
  const uint32_t got = __ballot_sync(0xffffffffu, ok);
  uint32_t empty = (kDiag & 4) ? 0u : ~got & ((1u << kRowsPerWarp) - 1);
  if (empty) {
    while (empty) {
      const int r = __ffs(empty) - 1;
      empty &= empty - 1;
      uint4* dst = reinterpret_cast<uint4*>(&sm.kv[buf][(warp * kRowsPerWarp + r) * kRow]);
      for (int piece = lane; piece < kRecordBytes / 16; piece += 32) dst[piece] = make_uint4(0, 0, 0, 0);
    }
    // The zero rows (generic proxy) before any later bulk copy into them (async proxy). Only
    // here: the fence waits for the thread's memory operations in flight (the query's copies,
    // the next ids), ~1000 cycles that every warp paid on every pass when it ran unconditionally
    // (ncu: membar stalls). The bulk copies' own reads-before-writes need no fence: the barrier
    // before the issue orders the ldmatrix reads of the buffer's last pass.
    FenceProxyAsync();
  }
  __syncwarp();
  if (lane == 0) MbarArriveExpectTx(&sm.bar[buf], __popc(got) * kRecordBytes);
  __syncwarp();
  if (HISPARSE_SPARSE_ATTENTION_EVICT_FIRST) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    if (ok) BulkCopyHint(&sm.kv[buf][row * kRow], src, kRecordBytes, &sm.bar[buf], policy);
  } else if (ok) {
    BulkCopy(&sm.kv[buf][row * kRow], src, kRecordBytes, &sm.bar[buf]);
  }
}

// The open page's score for one head: lane sums d = lane, lane + 32, ... in order, then a fixed
// xor tree.
__device__ __forceinline__ float TailScore(const uint16_t* qh, const uint16_t* kt, int lane, float scale) {
  float d = 0.f;
#pragma unroll
  for (int j = 0; j < kW / 32; ++j) d = fmaf(Bf16ToFloat(qh[lane + 32 * j]), Bf16ToFloat(kt[lane + 32 * j]), d);
#pragma unroll
  for (int x = 16; x >= 1; x >>= 1) d += __shfl_xor_sync(0xffffffffu, d, x);
  return d * scale;
}

constexpr int kCombineThreads = kDv / 4;  // 4 value columns a thread
// The combine kernel as a programmatic dependent launch of the chunk kernel (A/B, off): its
// launch and the open page's score overlap the chunk kernel's end instead of following it (the
// trace at batch 1: 2 us between the last chunk block's exit and the first combine block).
#ifndef HISPARSE_SPARSE_ATTENTION_PDL
#define HISPARSE_SPARSE_ATTENTION_PDL 0
#endif
constexpr bool kDependentLaunch = HISPARSE_SPARSE_ATTENTION_PDL != 0;

// The merge of sparse_attention.h for 4 value columns of one head: its chunks' (m, l) and o
// columns in chunk order, then the open page's tokens in order (scores -inf where masked). The one
// arithmetic of both plans (the combine kernel, the cluster's merge), so a request's bits do not
// depend on which plan its batch got.
__device__ __forceinline__ float4 MergeColumns(const float2 (&mls)[kChunks], const float4 (&vals)[kChunks],
                                               const float* tail_s, int page, const uint16_t* tail_v) {
  float big = -INFINITY;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) big = fmaxf(big, mls[c].x);
  for (int t = 0; t < page; ++t) big = fmaxf(big, tail_s[t]);
  float total = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float w = mls[c].x == -INFINITY ? 0.f : expf(mls[c].x - big);
    total = fmaf(w, mls[c].y, total);
    acc[0] = fmaf(w, vals[c].x, acc[0]);
    acc[1] = fmaf(w, vals[c].y, acc[1]);
    acc[2] = fmaf(w, vals[c].z, acc[2]);
    acc[3] = fmaf(w, vals[c].w, acc[3]);
  }
  for (int t = 0; t < page; ++t) {
    const float p = tail_s[t] == -INFINITY ? 0.f : expf(tail_s[t] - big);
    total += p;
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] = fmaf(p, Bf16ToFloat(tail_v[t * kW + r]), acc[r]);
  }
  float res[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) res[r] = total > 0.f ? acc[r] / total : 0.f;
  return make_float4(res[0], res[1], res[2], res[3]);
}

// kGroups head groups of 16 per block (64 heads: 4; small batches split the 64 into 4 blocks of
// 1 group, so that 4x the blocks share the GPU). A head's bits do not depend on kGroups: its
// scores, softmax and P @ V are the same instructions on the same values in every variant (the
// same warp roles per group, the same row of the same m16 tile), so the choice may follow the
// batch without breaking batch invariance (the checker compares batch 17 with batch 1).
//
// kMerge (the cluster plan): the 16 blocks of a (heads, request) are one cluster, one chunk each
// (block rank = chunk); each keeps its chunk's (m, l, o) in its own shared memory and merges
// kGroups of the heads from all 16 through distributed shared memory, so the partials never leave
// the chip and no second launch waits behind this one. The chunk's arithmetic is the same code.
template <int kGroups, bool kMerge>
__global__ void __launch_bounds__(kThreads, 1) ChunkKernel(ChunkArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  Stamp(0);  // entry
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q4 = lane & 3;
  // Score role: head group hg (16 heads) x token part tq (kTokPerWarp of the pass's 64 tokens),
  // all of d, so no partial score crosses warps (warps of groups >= kGroups have no score role).
  // P @ V role: all the unit's heads x kColsPerWarp value columns.
  // Consecutive warps share a head group, so the score warps of fewer than 4 groups (small
  // batches) sit on different schedulers (warp w issues on scheduler w % 4; with hg = w % 4, the
  // 16-head blocks of batch 1 ran every score mma on one of the four).
  const int hg = warp / kTokParts, tq = warp % kTokParts;
  bool scorer = hg < kGroups;  // of the current unit's head groups (fewer in a split unit)
  int ngroups = kGroups;
  const int passes = static_cast<int>(a.by_passes.d);
  // This block's units, one after another: one pipeline of passes across them ("flat" passes).
  const int my_units = (a.units - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
  const int flat_passes = my_units * passes;
  auto unit_of = [&](int f) { return UnitAt<kGroups>(a, static_cast<int>(blockIdx.x) + a.by_passes.Div(f) * gridDim.x); };
  // A layer outside [0, layers) reads no record (sparse_attention.h): only the open page counts.
  const int layer = *a.layer;
  const bool layer_ok = layer >= 0 && layer < a.layers;
  const uint16_t* source = a.source + (layer_ok ? layer * a.layer_stride : 0);

  // The latent query of a unit, swizzled into shared memory by cp.async (one group).
  auto load_query = [&](const Unit& x) {
    const uint16_t* qg = a.q + x.head0 * kW;
#pragma unroll 1  // unrolled, its addresses spill the P @ V accumulators around it
    for (int e = threadIdx.x; e < x.groups * 16 * kQPieces; e += kThreads) {
      const int h = e / kQPieces, piece = e % kQPieces;
      CpAsync16(&sm.q[h * kDv + ((piece ^ (h & 7)) * 8)], qg + h * kW + piece * 8);
    }
    CpAsyncCommit();
  };
  load_query(unit_of(0));
  if (threadIdx.x == 0) {
    MbarInit(&sm.bar[0], kCpAsyncRows ? kThreads : kWarps);
    MbarInit(&sm.bar[1], kCpAsyncRows ? kThreads : kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // barriers ready
  // Warp 0 asks for the rope query's line of each of a unit's heads (128 B, read by __ldg in every
  // pass) when it issues the unit's first pass, so that pass finds it in L1 / L2 instead of waiting
  // a round trip to HBM after its records landed.
  auto prefetch_rope = [&](const Unit& x) {
#pragma unroll
    for (int h = lane; h < x.groups * 16; h += 32) asm volatile("prefetch.global.L1 [%0];" ::"l"(a.q + (x.head0 + h) * kW + kDv));
  };
  int next_id = -1;  // this lane's id in the next pass to issue
  {
    const Unit x = unit_of(0), x1 = unit_of(1);
    if (warp == 0) {
      prefetch_rope(x);
      if (passes == 1 && flat_passes > 1) prefetch_rope(x1);
    }
    const int id0 = RowId(a, x, 0, warp, lane);
    const int id1 = flat_passes > 1 ? RowId(a, x1, a.by_passes.Mod(1), warp, lane) : -1;
    IssueRows(a, source, layer_ok, sm, x, 0, 0, warp, lane, id0);
    if (flat_passes > 1) IssueRows(a, source, layer_ok, sm, x1, a.by_passes.Mod(1), 1, warp, lane, id1);
    if (flat_passes > 2) next_id = RowId(a, unit_of(2), a.by_passes.Mod(2), warp, lane);
  }
  // The cluster plan's open-page scores of the heads this block merges (read at the merge, many
  // barriers later), by `workers` warps from warp `first`: where some warps have no score role
  // (kGroups < 4), those, during the first pass's scores, which they would wait out at the next
  // barrier anyway; else warps 1.. while the first records are on their way. (Before the first
  // pass, their loads from HBM held every warp at its barrier: 1.4 us at batch 1.) The open
  // page's value rows are asked into L2 for the merge.
  auto tail_scores = [&](int rank, int workers) {
    const Unit x = unit_of(0);
    const int64_t tok0 = static_cast<int64_t>(x.req) * a.page;
    for (int i = rank; i < kGroups * a.page; i += workers) {
      const int hh = i / a.page, t = i % a.page;
      const float sc = TailScore(a.q + (x.head0 + x.chunk * kGroups + hh) * kW, a.tail + (tok0 + t) * kW, lane, a.scale);
      if (lane == 0) sm.tail_s[hh][t] = a.tail_valid[tok0 + t] ? sc : -INFINITY;
    }
    for (int i = rank * 32 + lane; i < a.page * (kDv * 2 / 128); i += workers * 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a.tail + (tok0 + i / (kDv * 2 / 128)) * kW + (i % (kDv * 2 / 128)) * 64));
  };
  if (kMerge && kGroups == 4 && warp > 0) tail_scores(warp - 1, kWarps - 1);
  Stamp(1);  // ids read, first copies issued
  // The combine kernel may launch now (it waits for this grid's completion before its partials).
  if (kDependentLaunch && !kMerge) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  const int rA = hg * 16 + g, rB = rA + 8;
  float mA, mB, lA, lB;  // l: kept by the tq = 0 warps
  float o[kGroups][kPvTiles][4];
  // ldmatrix rows of this lane: K (token rows of the part, 16 a load), Q (head rows), V (token rows).
  const int krow = tq * kTokPerWarp + (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8;
  const int qrow = hg * 16 + (lane & 15), qhi = lane >> 4;
  const uint32_t qbase = SmemAddr(sm.q + qrow * kDv), qswz = qrow & 7;
  // The rope query (4 k-steps) is read into registers at each pass (8 KB a block, L1 holds it):
  // in shared memory too the block would not fit, and held across passes it would spill. A
  // fragment of m16n8k16: rows g and g + 8, columns 2 q4 (+1) and 2 q4 + 8 (+9).

  // With 8 warps (255 registers) a unit's rope query stays in registers from its first pass on;
  // with 16, it is read again each pass (from L1).
  constexpr bool kKeepRope = kWarps == 8;
  auto LoadRope = [&](uint32_t (&qr)[kRopeSteps][4], const Unit& x) {
    const unsigned int* rope = reinterpret_cast<const unsigned int*>(a.q + (x.head0 + hg * 16 + g) * kW + kDv + q4 * 2);
#pragma unroll
    for (int ks = 0; ks < kRopeSteps; ++ks) {
      qr[ks][0] = __ldg(rope + ks * 8);
      qr[ks][1] = __ldg(rope + 4 * kW + ks * 8);
      qr[ks][2] = __ldg(rope + ks * 8 + 4);
      qr[ks][3] = __ldg(rope + 4 * kW + ks * 8 + 4);
    }
  };
  uint32_t qr_kept[kRopeSteps][4];

  for (int f = 0; f < flat_passes; ++f) {
    const int t = a.by_passes.Mod(f), buf = f & 1;
    if (t == 0) {  // a new unit: its query (copied during the previous unit's last pass), fresh state
      mA = mB = -INFINITY;
      lA = lB = 0.f;
#pragma unroll
      for (int i = 0; i < kGroups; ++i)
#pragma unroll
        for (int j = 0; j < kPvTiles; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) o[i][j][r] = 0.f;
      CpAsyncWaitAll();  // this thread's query pieces; the barrier below shows them to all
      const Unit x = unit_of(f);
      ngroups = x.groups;
      scorer = hg < ngroups;
      if (kKeepRope && scorer) LoadRope(qr_kept, x);  // lands while the pass's records do
    }
    if (f == 1) Stamp(3);  // pass 0 computed
    MbarWait(&sm.bar[buf], (f >> 1) & 1);
    __syncthreads();  // pass f landed (and warp 0's zero rows and flags); pass f - 1 fully consumed
    if (f <= 1) Stamp(f == 0 ? 2 : 4);  // pass 0 / 1 landed
    if (kMerge && kGroups < 4 && f == 0 && !scorer)
      tail_scores(tq * (4 - kGroups) + (hg - kGroups), kTokParts * (4 - kGroups));
    if (f >= 1 && f + 1 < flat_passes) {
      const int t1 = t + 1 == passes ? 0 : t + 1;
      const Unit x1 = unit_of(f + 1);
      if (warp == 0 && t1 == 0) prefetch_rope(x1);
      IssueRows(a, source, layer_ok, sm, x1, t1, buf ^ 1, warp, lane, next_id);
      if (f + 2 < flat_passes) next_id = RowId(a, unit_of(f + 2), t1 + 1 == passes ? 0 : t1 + 1, warp, lane);
    }
    const bool two = (t + 1) * kPass <= a.chunk_tokens;  // the pass holds both stages (else only the first)
    const uint16_t* kv = sm.kv[buf];

    float acc[kScoreTiles][4];
    if (scorer) {
      // S = Q K^T for 16 heads x kTokPerWarp tokens, d in order 0..575.
      uint32_t qr[kRopeSteps][4];  // loads issued first, used last
      if constexpr (kKeepRope) {
#pragma unroll
        for (int ks = 0; ks < kRopeSteps; ++ks)
#pragma unroll
          for (int i = 0; i < 4; ++i) qr[ks][i] = qr_kept[ks][i];
      } else {
        LoadRope(qr, unit_of(f));
      }
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[j][r] = 0.f;
      const uint32_t kbase = SmemAddr(kv + krow * kRow + kcol);
#pragma unroll kLatentUnroll
      for (int ks = 0; ks < ((kDiag & 1) ? 0 : kLatentSteps); ++ks) {
        uint32_t qa[4];
        Ldm4(qa, qbase + (((2 * ks + qhi) ^ qswz) * 16));
#pragma unroll
        for (int h16 = 0; h16 < kQuartersPerWarp; ++h16) {
          uint32_t kb[4];
          Ldm4(kb, kbase + (h16 * 16 * kRow + ks * 16) * 2);
          Mma(acc[2 * h16], qa, kb[0], kb[1]);
          Mma(acc[2 * h16 + 1], qa, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int ks = 0; ks < ((kDiag & 1) ? 0 : kRopeSteps); ++ks) {
#pragma unroll
        for (int h16 = 0; h16 < kQuartersPerWarp; ++h16) {
          uint32_t kb[4];
          Ldm4(kb, kbase + (h16 * 16 * kRow + kDv + ks * 16) * 2);
          Mma(acc[2 * h16], qr[ks], kb[0], kb[1]);
          Mma(acc[2 * h16 + 1], qr[ks], kb[2], kb[3]);
        }
      }

      // Scores, and each quarter's row max (the stage max is exact in any order).
#pragma unroll
      for (int h16 = 0; h16 < kQuartersPerWarp; ++h16) {
        float maxA = -INFINITY, maxB = -INFINITY;
#pragma unroll
        for (int j = 2 * h16; j < 2 * h16 + 2; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int tok = tq * kTokPerWarp + j * 8 + q4 * 2 + (r & 1);
            acc[j][r] = sm.valid[buf][tok] ? acc[j][r] * a.scale : -INFINITY;
            if (r < 2) maxA = fmaxf(maxA, acc[j][r]);
            else maxB = fmaxf(maxB, acc[j][r]);
          }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          maxA = fmaxf(maxA, __shfl_xor_sync(0xffffffffu, maxA, x));
          maxB = fmaxf(maxB, __shfl_xor_sync(0xffffffffu, maxB, x));
        }
        if (q4 == 0) {
          sm.red_max[tq * kQuartersPerWarp + h16][rA] = maxA;
          sm.red_max[tq * kQuartersPerWarp + h16][rB] = maxB;
        }
      }
    }
    __syncthreads();  // the quarters' maxima visible (and every warp done with the query)
    if (t == passes - 1 && f + 1 < flat_passes) load_query(unit_of(f + 1));  // overlaps softmax and P @ V
    float a1A = 0.f, a1B = 0.f, a2A = 0.f, a2B = 0.f;
    if (scorer) {
      // Stage 1 = quarters 0, 1; stage 2 = quarters 2, 3. Every warp of a head group computes the
      // same running max from the same values (so all agree without another exchange).
      const float n1A = fmaxf(mA, fmaxf(sm.red_max[0][rA], sm.red_max[1][rA]));
      const float n1B = fmaxf(mB, fmaxf(sm.red_max[0][rB], sm.red_max[1][rB]));
      const float n2A = two ? fmaxf(n1A, fmaxf(sm.red_max[2][rA], sm.red_max[3][rA])) : n1A;
      const float n2B = two ? fmaxf(n1B, fmaxf(sm.red_max[2][rB], sm.red_max[3][rB])) : n1B;
      a1A = mA == -INFINITY ? 0.f : expf(mA - n1A), a1B = mB == -INFINITY ? 0.f : expf(mB - n1B);
      a2A = n1A == -INFINITY ? 0.f : expf(n1A - n2A), a2B = n1B == -INFINITY ? 0.f : expf(n1B - n2B);
#pragma unroll
      for (int h16 = 0; h16 < kQuartersPerWarp; ++h16) {
        const int quarter = tq * kQuartersPerWarp + h16;  // quarters 0, 1: stage 1; 2, 3: stage 2
        const float subA = quarter < 2 ? n1A : n2A, subB = quarter < 2 ? n1B : n2B;
        float sumA = 0.f, sumB = 0.f;
#pragma unroll
        for (int j = 2 * h16; j < 2 * h16 + 2; ++j) {
          const int tok = tq * kTokPerWarp + j * 8 + q4 * 2;
          __nv_bfloat16 p[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float n = r < 2 ? subA : subB;
            p[r] = __float2bfloat16_rn(acc[j][r] == -INFINITY ? 0.f : expf(acc[j][r] - n));
          }
          sumA += __bfloat162float(p[0]) + __bfloat162float(p[1]);
          sumB += __bfloat162float(p[2]) + __bfloat162float(p[3]);
          *reinterpret_cast<__nv_bfloat162*>(&sm.p[rA * kProw + tok]) = __nv_bfloat162(p[0], p[1]);
          *reinterpret_cast<__nv_bfloat162*>(&sm.p[rB * kProw + tok]) = __nv_bfloat162(p[2], p[3]);
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
          sumA += __shfl_xor_sync(0xffffffffu, sumA, x);
          sumB += __shfl_xor_sync(0xffffffffu, sumB, x);
        }
        if (q4 == 0) {
          sm.red_sum[quarter][rA] = sumA;
          sm.red_sum[quarter][rB] = sumB;
        }
      }
      if (q4 == 0 && tq == 0) {
        sm.alpha[0][rA] = a1A, sm.alpha[0][rB] = a1B;
        sm.alpha[1][rA] = a2A, sm.alpha[1][rB] = a2B;
      }
      mA = n2A;
      mB = n2B;
    }
    __syncthreads();  // P tile, alphas and the quarters' sums visible
    if (scorer && tq == 0) {
      lA = a1A * lA + (sm.red_sum[0][rA] + sm.red_sum[1][rA]);
      lB = a1B * lB + (sm.red_sum[0][rB] + sm.red_sum[1][rB]);
      if (two) {
        lA = a2A * lA + (sm.red_sum[2][rA] + sm.red_sum[3][rA]);
        lB = a2B * lB + (sm.red_sum[2][rB] + sm.red_sum[3][rB]);
      }
    }

    // O = alpha * O + P V, stage by stage, for the block's heads x this warp's value columns.
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      if (st == 1 && !two) break;
      // o *= alpha, skipped where every alpha of the warp's rows is 1 (the running max held, the
      // common case after the first stages): o * 1 == o bit for bit.
      float al[kGroups][2];
      bool ones = true;
#pragma unroll
      for (int mt = 0; mt < kGroups; ++mt) {
        al[mt][0] = sm.alpha[st][mt * 16 + g], al[mt][1] = sm.alpha[st][mt * 16 + g + 8];
        if (mt < ngroups) ones &= al[mt][0] == 1.f && al[mt][1] == 1.f;
      }
      if (!__all_sync(0xffffffffu, ones)) {
#pragma unroll
        for (int mt = 0; mt < kGroups; ++mt)
#pragma unroll
          for (int nt = 0; nt < kPvTiles; ++nt) {
            if (mt >= ngroups) break;
            o[mt][nt][0] *= al[mt][0];
            o[mt][nt][1] *= al[mt][0];
            o[mt][nt][2] *= al[mt][1];
            o[mt][nt][3] *= al[mt][1];
          }
      }
#pragma unroll
      for (int kk = 0; kk < ((kDiag & 2) ? 0 : kStage / 16); ++kk) {
        const int ks = st * (kStage / 16) + kk;
        uint32_t vb[kPvTiles / 2][4];
#pragma unroll
        for (int np = 0; np < kPvTiles / 2; ++np)
          Ldm4T(vb[np], SmemAddr(&kv[(ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kRow + warp * kColsPerWarp +
                                     np * 16 + (lane >> 4) * 8]));
#pragma unroll
        for (int mt = 0; mt < kGroups; ++mt) {
          if (mt >= ngroups) break;
          uint32_t pa[4];
          Ldm4(pa, SmemAddr(&sm.p[(mt * 16 + (lane & 15)) * kProw + ks * 16 + (lane >> 4) * 8]));
#pragma unroll
          for (int np = 0; np < kPvTiles / 2; ++np) {
            Mma(o[mt][2 * np], pa, vb[np][0], vb[np][1]);
            Mma(o[mt][2 * np + 1], pa, vb[np][2], vb[np][3]);
          }
        }
      }
    }

    if (!kMerge && t == passes - 1) {  // the unit's partial: (m, l, o) of its chunk
      const Unit x = unit_of(f);
#pragma unroll
      for (int mt = 0; mt < kGroups; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (mt >= ngroups) break;
          const int64_t h = x.head0 + mt * 16 + g + half * 8;
          float* dst = a.o_part + (h * kChunks + x.chunk) * kDv + warp * kColsPerWarp + q4 * 2;
#pragma unroll
          for (int nt = 0; nt < kPvTiles; ++nt)
            *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[mt][nt][half * 2], o[mt][nt][half * 2 + 1]);
        }
      if (scorer && tq == 0 && q4 == 0) {
        *reinterpret_cast<float2*>(a.ml + ((x.head0 + rA) * kChunks + x.chunk) * 2) = make_float2(mA, lA);
        *reinterpret_cast<float2*>(a.ml + ((x.head0 + rB) * kChunks + x.chunk) * 2) = make_float2(mB, lB);
      }
    }
  }

  Stamp(5);  // the unit's passes done
  if constexpr (kMerge) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const Unit x = unit_of(0);
    __syncthreads();  // every warp's last P @ V done (and no copy in flight): the KV buffers hold o now
    float* os = reinterpret_cast<float*>(sm.kv);
#pragma unroll
    for (int mt = 0; mt < kGroups; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float* dst = os + (mt * 16 + g + half * 8) * kOStride + warp * kColsPerWarp + q4 * 2;
#pragma unroll
        for (int nt = 0; nt < kPvTiles; ++nt)
          *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[mt][nt][half * 2], o[mt][nt][half * 2 + 1]);
      }
    if (scorer && tq == 0 && q4 == 0) {
      sm.ml[rA] = make_float2(mA, lA);
      sm.ml[rB] = make_float2(mB, lB);
    }
    cluster.sync();  // every chunk's (m, l, o) visible across the cluster
    Stamp(6);
#pragma unroll 1
    for (int e = threadIdx.x; e < kGroups * kCombineThreads; e += kThreads) {
      const int hh = e / kCombineThreads, col = (e % kCombineThreads) * 4;
      const int hl = x.chunk * kGroups + hh;  // of the unit's heads
      float2 mls[kChunks];
      float4 vals[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const Smem* r = cluster.map_shared_rank(&sm, c);
        mls[c] = r->ml[hl];
        vals[c] = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(r->kv) + hl * kOStride + col);
      }
      const float4 res =
          MergeColumns(mls, vals, sm.tail_s[hh], a.page, a.tail + static_cast<int64_t>(x.req) * a.page * kW + col);
      *reinterpret_cast<float4*>(a.out + (x.head0 + hl) * kDv + col) = res;
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
  }
  Stamp(7);  // exit
}

// One block per (head, request), the merge of sparse_attention.h: chunks 0..C-1 in order, then
// the open page's tokens in order. Every partial's load is issued first (float4, all 16 chunks at
// once), so they overlap each other and the open page's score.
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(
    const uint16_t* __restrict__ q, const uint16_t* __restrict__ tail, const uint8_t* __restrict__ tail_valid,
    const float* __restrict__ o_part, const float* __restrict__ ml, float* __restrict__ out, int heads,
    int page, float scale) {
  __shared__ float tail_s[kSparseAttentionMaxPage];
  StampCombine(0);
  const int h = blockIdx.x, req = blockIdx.y;
  const int64_t hq = static_cast<int64_t>(req) * heads + h;
  const int col = threadIdx.x * 4;
  const float2* mlh = reinterpret_cast<const float2*>(ml + hq * kChunks * 2);
  const float* oh = o_part + hq * kChunks * kDv + col;
  float2 mls[kChunks];
  float4 vals[kChunks];
  if (kDependentLaunch) {
    // Launched early (programmatic dependent launch): the open page's score needs nothing of the
    // chunk kernel, so it runs first; the partials only after the chunk kernel's grid completed.
    if (threadIdx.x < 32) {
      for (int t = 0; t < page; ++t) {
        const float sc = TailScore(q + hq * kW, tail + (static_cast<int64_t>(req) * page + t) * kW, threadIdx.x, scale);
        if (threadIdx.x == 0) tail_s[t] = tail_valid[static_cast<int64_t>(req) * page + t] ? sc : -INFINITY;
      }
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    mls[c] = mlh[c];
    vals[c] = *reinterpret_cast<const float4*>(oh + c * kDv);
  }
  if (!kDependentLaunch && threadIdx.x < 32) {
    for (int t = 0; t < page; ++t) {
      const float sc = TailScore(q + hq * kW, tail + (static_cast<int64_t>(req) * page + t) * kW, threadIdx.x, scale);
      if (threadIdx.x == 0) tail_s[t] = tail_valid[static_cast<int64_t>(req) * page + t] ? sc : -INFINITY;
    }
  }
  __syncthreads();
  const float4 res = MergeColumns(mls, vals, tail_s, page, tail + static_cast<int64_t>(req) * page * kW + col);
  *reinterpret_cast<float4*>(out + hq * kDv + col) = res;
  StampCombine(1);
}

#ifdef HISPARSE_SPARSE_ATTENTION_WGMMA
#ifndef HISPARSE_SM90A
#error "HISPARSE_SPARSE_ATTENTION_WGMMA needs an sm_90a build (ARCH=sm_90a, or CMAKE_CUDA_ARCHITECTURES=90a)"
#endif
#include "sparse_attention_wgmma.cuh"
#endif

std::atomic<uint64_t> g_configured{0};  // devices whose chunk kernels allow the large smem
std::atomic<int> g_sms[64];              // multiprocessors of each device (0: not asked yet)
std::atomic<int> g_clusters[64][3];      // clusters of 16 blocks resident at once, kGroups 1, 2, 4

template <int kGroups>
cudaError_t ConfigureCluster(int dev, int bytes) {
  auto kernel = ChunkKernel<kGroups, true>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  // 16 blocks a cluster is above the portable 8; a device without it runs the combine plan.
  if (err == cudaSuccess && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kChunks, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(kChunks), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = bytes;
  cfg.attrs = attr, cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    clusters = 0;
  }
  g_clusters[dev & 63][kGroups == 1 ? 0 : kGroups == 2 ? 1 : 2].store(clusters);
  return cudaSuccess;
}

cudaError_t Configure(int dev) {
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (g_configured.load() & bit) return cudaSuccess;
  const int bytes = static_cast<int>(sizeof(Smem));
  cudaError_t err = cudaFuncSetAttribute(ChunkKernel<4, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(ChunkKernel<2, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(ChunkKernel<1, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = ConfigureCluster<1>(dev, bytes);
  if (err == cudaSuccess) err = ConfigureCluster<2>(dev, bytes);
  if (err == cudaSuccess) err = ConfigureCluster<4>(dev, bytes);
#ifdef HISPARSE_SPARSE_ATTENTION_WGMMA
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(WgmmaChunkKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(WgSmem)));
#endif
  int sms = 0;
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  g_sms[dev & 63].store(sms);
  g_configured.fetch_or(bit);
  return cudaSuccess;
}

// Head groups of 16 per block: the fewest (the most blocks) whose grid still fits one wave of one
// block per multiprocessor, else 4 (a request's 64 heads share each record the block loads).
int GroupsFor(const SparseAttentionShape& shape, int sms) {
  for (int groups : {1, 2}) {
    const int64_t blocks = shape.batch * (shape.heads / (16 * groups)) * kChunks;
    if (blocks <= sms) return groups;
  }
  return 4;
}

// The cluster plan's head groups: the combine plan's (GroupsFor) when its clusters all run at once
// (one wave), else 0 (the combine plan). Fewer blocks of more heads to make the clusters fit
// lost to the combine plan's one wave of smaller blocks (H200, 7 clusters of 16 at once: batch 2
// at 32 heads a block, 23.8 us; the combine plan at 16, 21.3 us), and clusters of 64 heads run in
// waves past one lost by 13-38% at batch 2-41 (H100, BENCHMARKS.md's sixteenth pass): merging on
// chip saves the partials' round trip but keeps a cluster's 16 blocks waiting on its slowest.
[[maybe_unused]] int ClusterGroupsFor(const SparseAttentionShape& shape, int dev, int sms) {
  const int groups = GroupsFor(shape, sms);
  const int64_t clusters = shape.batch * (shape.heads / (16 * groups));
  return clusters <= g_clusters[dev & 63][groups == 1 ? 0 : groups == 2 ? 1 : 2].load() ? groups : 0;
}

// The combine plan's last round of units, when it would leave most blocks idle: each of its units
// splits into pieces of fewer heads (16, else 32), one piece a block, so the round's heads spread
// over that many more blocks. At batch 17 (272 units of 64 heads on 132 blocks) 8 blocks ran a
// third unit while 124 waited for them; split, 32 blocks run a quarter of one. A head's
// arithmetic does not depend on its unit's size (the kGroups argument), so neither do the bits.
#ifndef HISPARSE_SPARSE_ATTENTION_SPLIT_TAIL
#define HISPARSE_SPARSE_ATTENTION_SPLIT_TAIL 1
#endif
[[maybe_unused]] void SplitTail(ChunkArgs& a, int groups, int grid) {
  const int rem = HISPARSE_SPARSE_ATTENTION_SPLIT_TAIL ? a.units % grid : 0;
  for (int split = 1; rem > 0 && split < groups; split *= 2) {
    if (rem * (groups / split) <= grid) {
      a.big_units = a.units - rem;
      a.split_groups = split;
      a.units = a.big_units + rem * (groups / split);
      return;
    }
  }
}

template <int kGroups>
cudaError_t LaunchCluster(const ChunkArgs& a, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kChunks, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(a.units)), cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = sizeof(Smem), cfg.stream = stream;
  cfg.attrs = attr, cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, ChunkKernel<kGroups, true>, a);
}

}  // namespace

cudaError_t LaunchSparseAttention(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                                  const uint16_t* source, const int32_t* layer, const int32_t* index, const uint16_t* tail,
                                  const uint8_t* tail_valid, float* out, float* workspace, cudaStream_t stream,
                                  SparseAttentionPlan plan) {
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
  a.by_page = FastDiv(static_cast<uint32_t>(shape.page));
  a.by_passes = FastDiv(static_cast<uint32_t>((a.chunk_tokens + kPass - 1) / kPass));
  const int sms = g_sms[dev & 63].load();
#ifdef HISPARSE_SPARSE_ATTENTION_WGMMA
  // The wgmma build (sparse_attention_wgmma.cuh): one kernel for every batch and plan, 64 heads a
  // unit, a contiguous range of units per block, then the combine kernel. `plan` has no choice
  // to make here: every plan is this one (the checker skips its plan comparison in this build).
  (void)plan;
  a.units = static_cast<int>(shape.batch * (shape.heads / kHt) * kChunks);
  a.big_units = a.units, a.split_groups = 4;
  a.by_blocks = FastDiv(static_cast<uint32_t>(shape.heads / kHt));
  WgmmaChunkKernel<<<dim3(static_cast<unsigned>(std::min(a.units, sms))), kWgThreads, sizeof(WgSmem), stream>>>(a);
#else
  int cluster_groups = plan == SparseAttentionPlan::kCombine ? 0 : ClusterGroupsFor(shape, dev, sms);
  if (plan == SparseAttentionPlan::kCluster && cluster_groups == 0) {
    if (g_clusters[dev & 63][2].load() < 1) return cudaErrorNotSupported;  // no cluster of 16 fits this device
    cluster_groups = 4;  // asked for: clusters in waves
  }
  if (kHeadGroupsOverride > 0 && cluster_groups > 0) cluster_groups = kHeadGroupsOverride;
  if (cluster_groups > 0) {
    a.units = static_cast<int>(shape.batch * (shape.heads / (16 * cluster_groups)) * kChunks);
    a.big_units = a.units, a.split_groups = cluster_groups;
    a.by_blocks = FastDiv(static_cast<uint32_t>(shape.heads / (16 * cluster_groups)));
    if (cluster_groups == 1) return LaunchCluster<1>(a, stream);
    if (cluster_groups == 2) return LaunchCluster<2>(a, stream);
    return LaunchCluster<4>(a, stream);
  }
  const int groups = kHeadGroupsOverride > 0 ? kHeadGroupsOverride : GroupsFor(shape, sms);
  a.units = static_cast<int>(shape.batch * (shape.heads / (16 * groups)) * kChunks);
  a.big_units = a.units, a.split_groups = groups;
  a.by_blocks = FastDiv(static_cast<uint32_t>(shape.heads / (16 * groups)));
  // More units than multiprocessors: one block per multiprocessor runs them in turn (a unit's
  // loads then start during the previous unit's last pass); else one block per unit.
  const dim3 grid(static_cast<unsigned>(kPersistent ? std::min(a.units, sms) : a.units));
  SplitTail(a, groups, static_cast<int>(grid.x));
  if (groups == 1) ChunkKernel<1, false><<<grid, kThreads, sizeof(Smem), stream>>>(a);
  else if (groups == 2) ChunkKernel<2, false><<<grid, kThreads, sizeof(Smem), stream>>>(a);
  else ChunkKernel<4, false><<<grid, kThreads, sizeof(Smem), stream>>>(a);
#endif
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (kDependentLaunch) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(static_cast<unsigned>(shape.heads), static_cast<unsigned>(shape.batch));
    cfg.blockDim = dim3(kCombineThreads), cfg.dynamicSmemBytes = 0, cfg.stream = stream;
    cfg.attrs = attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, CombineKernel, q, tail, tail_valid, static_cast<const float*>(a.o_part),
                              static_cast<const float*>(a.ml), out, a.heads, a.page, scale);
  }
  CombineKernel<<<dim3(static_cast<unsigned>(shape.heads), static_cast<unsigned>(shape.batch)), kCombineThreads, 0,
                  stream>>>(q, tail, tail_valid, a.o_part, a.ml, out, a.heads, a.page, scale);
  return cudaGetLastError();
}

#ifdef HISPARSE_SPARSE_ATTENTION_TRACE
// The trace of the last launch (see Stamp): ns and clk [blocks][8], combine_ns [blocks][2].
cudaError_t SparseAttentionReadTrace(unsigned long long* ns, unsigned long long* clk, unsigned long long* combine_ns,
                                     int blocks) {
  const size_t n = static_cast<size_t>(std::min(blocks, kTraceBlocks));
  cudaError_t err = cudaMemcpyFromSymbol(ns, g_trace_ns, n * kTraceSlots * 8);
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(clk, g_trace_clk, n * kTraceSlots * 8);
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(combine_ns, g_trace_combine_ns, n * 2 * 8);
  return err;
}
cudaError_t SparseAttentionClearTrace() {
  static unsigned long long zeros[kTraceBlocks * kTraceSlots] = {};
  cudaError_t err = cudaMemcpyToSymbol(g_trace_ns, zeros, sizeof(zeros));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(g_trace_clk, zeros, sizeof(zeros));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(g_trace_combine_ns, zeros, kTraceBlocks * 2 * 8);
  return err;
}
#endif

int SparseAttentionClustersAtOnce(int groups) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || Configure(dev) != cudaSuccess) return -1;
  return g_clusters[dev & 63][groups == 1 ? 0 : groups == 2 ? 1 : 2].load();
}

}  // namespace hisparse

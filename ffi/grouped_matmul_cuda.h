// The grouped matmul (grouped_matmul.h) on a CUDA device: a launcher on raw
// pointers, no XLA types. Needs sm_80 or newer (mma.sync bf16, mul.bf16x2 on
// sm_90); built and tuned for sm_90 (plain sm_90, not sm_90a).
//
// Decode reads far more weight bytes than anything else, so each kernel is a
// weight stream in one launch: the warp-tile kernel below loads straight into
// registers (no shared-memory staging); the streaming kernel (further down)
// stages through shared memory by the copy engine. Same bits from both.
//   - A block is W warps of one expert; a warp owns tiles_per_warp warp
//     tiles of 16 * weight_tiles adjacent weight rows (output channels) and
//     streams each along all of K with 16-byte read-only loads (L1 bypassed),
//     chunks_in_flight loads per row in flight per lane, straight into
//     tensor-core fragments. By default each warp owns one warp tile: the
//     grid then spans several waves of blocks, which the H200 sweep measured
//     faster than one wave of warps streaming several tiles each.
//   - Weights are the mma.sync m16n8k16 A operand (16 rows), tokens the B
//     operand (8 per tile): decode experts see a handful of tokens, and 8-token
//     tiles halve the padding of 16-token ones. Token rows past the group's
//     end are zero-filled in registers, never read. x is tiny and shared by
//     the block's warps: read straight from global memory through L1.
//   - The k order inside a 16-wide step is a fixed permutation of each lane's
//     16 loaded bytes (a dot product may take its k in any fixed order), so x
//     is loaded in the same permutation and no shuffle is needed.
//   - fp8 e4m3 -> bf16 exactly, two at a time: prmt spreads two bytes into
//     16-bit lanes with their sign, a shift and a mask give the bf16 bits of
//     value * 2^-120, one mul.bf16x2 by 2^120 (a power of two: exact,
//     subnormal codes included) restores the value.
//   - A pass holds the accumulators of token_tiles * 8 tokens; an expert with
//     more rows takes more passes, each reading its weights again.
//   - Split K (grouped_matmul.h's S, fixed by the weight's shape): a weight
//     with few rows (the shared expert: E = 1, N / 16 = 256 or 384 warp
//     tiles) would give each of the 132 SMs only a warp or two to stream
//     with, far from enough loads in flight to fill HBM. With S > 1 a "tile
//     group" of S warps of one block shares each warp tile, warp s streaming
//     slice s of K; the S - 1 other warps leave their partial sums in shared
//     memory and slice 0's warp adds them in slice order and writes y. The
//     group meets at a named barrier of its own (bar.sync 1 + group), since
//     the groups of a block may own different numbers of tiles. The partials
//     are dynamic shared memory, absent when S = 1 (the routed experts),
//     and the split is a template flag of the kernel: the routed experts'
//     kernels compile without its slice bounds (sharing them cost 5-15%).
//     H200, glm5 shared expert at batch 17 (fp8): gate_up 117 -> 22 us, down
//     35 -> 17 us (the bench's --slices mode; BENCHMARKS.md).
//   - The streaming kernel (grouped_matmul_stream.cuh, sm_90): in
//     each block (two an SM by default) a producer lane keeps a ring of
//     stages (256 bytes of each of 128 weight rows and the pass's x at the
//     same k) in flight through TMA tensor copies, 8 consumer warps run the same fragments and
//     mma as the warp-tile kernel from shared memory: the bytes in flight no
//     longer depend on the registers the math needs. A split weight runs
//     there with each consumer warp summing its rows' slices in order
//     itself, or in 2 or 4 slice groups of warps (units of 64 or 32 rows:
//     more units; the later groups' slice sums meet group 0's in shared
//     memory, in slice order). The default where it runs, K is not split and experts average
//     2.5 rows or more, or its units fit one wave of two blocks an SM; the warp-tile kernel
//     stays for the rest, split weights (slower streamed) and older devices.
//   - Blocks of experts without rows exit before reading anything; a few
//     extra blocks write the zeros of rows past the last group. Each block
//     sums the group sizes it needs itself (E <= 1024), so there is no
//     second launch and no scratch memory (a split of K is reduced inside a
//     block, never across blocks).
#ifndef HISPARSE_FFI_GROUPED_MATMUL_CUDA_H_
#define HISPARSE_FFI_GROUPED_MATMUL_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "grouped_matmul.h"

namespace hisparse {

inline constexpr int kGroupedMatmulMaxWarps = 8;
// Blocks that write the zero rows past the last group (each exits at once when there are none).
inline constexpr int kGroupedMatmulMaxZeroBlocks = 128;
// The split of K (grouped_matmul.h's S): the fewest slices, a power of two up to 8, that give
// E * ceil(N / 16) * S >= 2048 warps (about 16 per SM of an H200; a constant, not the device's
// count, so the bits are the same on every GPU), with at least one 64-byte chunk per slice.
inline constexpr int kGroupedMatmulMaxKSlices = 8;
// HISPARSE_GROUPED_MATMUL_SPLIT_TARGET_WARPS: an A/B build of another target (it changes the bits
// of every weight it splits differently, so it is a build of its own, never a tuning).
#ifndef HISPARSE_GROUPED_MATMUL_SPLIT_TARGET_WARPS
#define HISPARSE_GROUPED_MATMUL_SPLIT_TARGET_WARPS 2048
#endif
inline constexpr int64_t kGroupedMatmulSplitTargetWarps = HISPARSE_GROUPED_MATMUL_SPLIT_TARGET_WARPS;

// One launch's shape. Every field is a compile-time variant of the kernel or
// a launch parameter; none changes the bits y gets (grouped_matmul.h).
struct GroupedMatmulPlan {
  int warps_per_block = 4;    // 1..kGroupedMatmulMaxWarps
  int weight_tiles = 2;       // 16-row weight tiles per warp tile: 1 or 2
  int chunks_in_flight = 4;   // 16-byte loads in flight per weight row and lane: 2 or 4
  int token_tiles = 1;        // 8-token tiles per pass: 1, 2, 4 or 8
  int tiles_per_warp = 1;     // warp tiles a warp streams one after another
  int blocks_per_expert = 1;  // ceil(N / (16 weight_tiles tiles_per_warp) / (warps_per_block / k_slices))
  int k_slices = 1;           // GroupedMatmulKSlices(dims): fixed by the weight's shape, not a tuning
  // > 0: the streaming kernel (grouped_matmul_stream.cuh) with this many stages in flight per
  // block; the fields above but token_tiles and k_slices are then unused. 0: the warp-tile
  // kernel. Same bits either way.
  int stream_stages = 0;
  int stream_blocks_per_sm = 1;   // resident blocks of the streaming kernel an SM: 1 or 2
  // A split weight on the streaming kernel: its slices in this many groups (1, 2 or 4), each unit
  // 128 / groups rows (grouped_matmul_stream.cuh). Same bits whatever the value.
  int stream_slice_groups = 1;
  bool stream_persistent = true;  // its blocks loop over units (else one unit a block)
};

// S, the slices of K of every weight row (grouped_matmul.h), from E, N, K and the weight type
// alone: the rule above kGroupedMatmulMaxKSlices.
int GroupedMatmulKSlices(const GroupedMatmulDims& dims);

// Overrides of the automatic plan (benchmarks); 0 = automatic. The automatic
// plan: 4 warps per block, token tiles for about twice the mean rows per
// expert (M / E), 2 chunks in flight, 2 weight tiles (1 for weight rows of at
// most 2 KiB), one tile per warp: the variant within ~5-15% of the best at
// every shape of the H200 sweep (ffi/bench/grouped_matmul_bench.cu --sweep).
// With a split of K (k_slices = S > 1) a block holds whole tile groups of S
// warps (warps_per_block is rounded down to a multiple of S, at least S: 8
// warps for S = 8) and the automatic plan takes 1 weight tile (twice the
// tile groups); the --slices sweep on the H200 found no faster variant.
struct GroupedMatmulTuning {
  int warps_per_block = 0;
  int weight_tiles = 0;
  int chunks_in_flight = 0;
  int token_tiles = 0;
  int tiles_per_warp = 0;
  // 0: the streaming kernel where it runs (a device of compute capability 9.0 or up), K is not
  // split (S = 1) and experts average 2.5 rows or more (2 M >= 5 E) or its units fill between one
  // and two blocks an SM (min(E, M) x ceil(N / 128) in [SMs, 2 SMs]), else the warp-tile kernel;
  // 1: the streaming kernel, split K included, or cudaErrorNotSupported; -1: the warp-tile kernel
  // (the A/B of ffi/bench/grouped_matmul_bench.cu).
  int stream = 0;
  // 0 automatic (2; 1 for a split weight whose units fit the SMs), 1 or 2 (the stages share the
  // SM's shared memory)
  int stream_blocks_per_sm = 0;
  int stream_persistent = 0;     // 0 automatic, 1 a block loops over units, -1 one unit a block
  // 0 automatic (1; a HISPARSE_GROUPED_MATMUL_STREAM_SPLIT=G build: G, capped at the weight's S),
  // 1, 2 or 4 slice groups for a split weight on the streaming kernel; cudaErrorNotSupported above
  // the weight's S (none for a weight without a split).
  int stream_slice_groups = 0;
};

// The plan LaunchGroupedMatmul uses for `dims` under `tuning` on the current
// device (host arithmetic and device attributes, cached: safe under CUDA-graph
// capture).
// cudaErrorInvalidValue for dims outside grouped_matmul.h's limits or a
// tuning value outside the variants above.
cudaError_t GroupedMatmulPlanFor(const GroupedMatmulDims& dims, const GroupedMatmulTuning& tuning,
                                 GroupedMatmulPlan* plan);

// Enqueues y on `stream`: one launch, no allocation, no synchronization, no
// host read of device data (group_sizes are read by the kernel). dims must
// satisfy GroupedMatmulSizeError(dims)[0] == '\0'; x and w must be 16-byte
// aligned, the other pointers 4-byte aligned. Returns the launch error, if
// any (cudaErrorInvalidValue for dims, pointers or tuning outside those
// rules). M = 0 or N = 0 enqueues nothing.
cudaError_t LaunchGroupedMatmul(const GroupedMatmulDims& dims, const GroupedMatmulBuffers& io,
                                cudaStream_t stream, const GroupedMatmulTuning& tuning = {});

}  // namespace hisparse

#endif  // HISPARSE_FFI_GROUPED_MATMUL_CUDA_H_

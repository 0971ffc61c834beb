// The lightning indexer's scores (indexer.h) on a CUDA device: a launcher on
// raw pointers, no XLA types. Needs sm_80 or newer (mma.sync bf16, cp.async,
// max.NaN); built and tuned for sm_90.
//
// One fused kernel per call: no [H x T] intermediate ever reaches memory. The
// work is a list of warp tiles (consecutive tokens of one row), split into
// one contiguous range per block, so a block crosses at most a few rows. For
// each row of its range a block stages q (as bfloat16, in the layout the
// tensor cores read) and w in shared memory; each warp streams its tiles'
// keys through its own cp.async ring of shared-memory stages (16-byte copies,
// coalesced) and scores them with mma.sync m16n8k16 (bf16 x bf16 -> f32):
// tokens on M, heads on N, d on K. Relu, the head weights and the sum over
// heads happen in registers (four FMA chains and two shuffles per token), one
// float per token is written. Tiles past lengths[b] read no key and write -inf.
// fp8 keys are widened to bfloat16 in registers by moving their bits (exact,
// the value times 2^-120); q is multiplied by a power of two per row so the
// products stay in the normal float range, and the row's result by the
// inverse power of two: both exact, so q keeps every bit.
//
// Two kernels share that plan and compute the same bits (the same tensor-core
// steps in the same order, the same head chains):
//   - register-q (bfloat16 q, H <= 64, d <= 128: the DSA shapes H = 64 and
//     GLM-5's H = 32, d = 128): each warp holds the row's q fragments in
//     registers, so a tile reads only its keys from shared memory; the ring
//     keeps loading across a row change. Its launch shapes
//     (IndexerRegisterShape: tokens per warp tile x warps per block) trade
//     independent tensor-core chains per warp against warps per SM; every
//     shape writes the same bits.
//   - general (float32 q, H up to 128, d up to 256): q fragments are read
//     from shared memory for every tile of 32 tokens, in head passes of 64.
// A third, in sm_90a builds only (HISPARSE_SM90A; shape k64wg, the automatic
// choice there for fp8 keys with 32 < H <= 64): warpgroups score 64-token
// tiles with wgmma, q in shared memory (indexer_wgmma.cuh); same plan and
// epilogue. Its bits matched mma.sync's in every case checked, but the
// contract only holds it to the rounding bound.
//
// Batch invariance: which block, warp and tile a token lands in depends on the
// batch (the grid covers b x T), but a token's score does not: every token
// goes through the same steps wherever it lands, and the row's power-of-two
// q factor depends on that row's q alone. So a request's scores (and top-k
// ids) are the same bits alone and in any batch, and the same in HiSparse and
// full-KV (ffi/tests/indexer_cuda_check.cu checks it for every launch).
#ifndef HISPARSE_FFI_INDEXER_CUDA_H_
#define HISPARSE_FFI_INDEXER_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "indexer.h"

namespace hisparse {

// Tokens of one warp tile of the general kernel (two m16 tensor-core tiles).
inline constexpr int kIndexerTileTokens = 32;
// Tokens of one warp tile of the register-q kernel's first shape (one m16
// tile); the other shapes (IndexerRegisterShape) take 32.
inline constexpr int kIndexerRegisterTileTokens = 16;
// The register-q kernel's domain: bfloat16 q with at most this many heads and d.
inline constexpr int64_t kIndexerRegisterMaxHeads = 64;
inline constexpr int64_t kIndexerRegisterMaxDim = 128;
// Warps of one block at most; fewer when shared memory would not hold them.
// Register-q shapes for H <= 32 (half the q registers) go up to 16.
inline constexpr int kIndexerMaxWarps = 8;
inline constexpr int kIndexerRegisterMaxWarps = 16;
// Shared-memory stages in each warp's key ring: tiles in flight per warp is
// one less. fp8 tiles are half the bytes, so they get more stages. The
// register-q kernel's stages are 16-token tiles, chosen so that 8 warps keep
// about 20 KB of keys in flight each (~4 us of an SM's share of HBM).
inline constexpr int kIndexerStagesBf16 = 3;
inline constexpr int kIndexerStagesFp8 = 5;
inline constexpr int kIndexerRegisterStagesBf16 = 6;
inline constexpr int kIndexerRegisterStagesFp8 = 10;

// The register-q kernel's launch shapes at d = 128: tokens per warp tile x
// warps per block at most (stages per warp ring in indexer_kernels.cu, sized
// so a block keeps ~150-190 KB of keys in flight). Every shape writes the same
// bits (each token goes through the same steps); they differ in how many
// independent tensor-core chains and warps hide the MMA and copy latencies.
// Other d, and H <= 16, use k16x8. k16x16, k32x12 and k64x6 need H <= 32 (the
// q fragments of 64 heads take 128 registers a thread).
enum class IndexerRegisterShape : int32_t {
  kAuto = 0,    // the launcher's choice for the operands and size (indexer_kernels.cu, RegisterShapeFor)
  k16x8 = 1,    // 16-token tiles, <= 8 warps (the first version)
  k32x8 = 2,    // 32-token tiles (two m16 tiles' MMAs interleaved), <= 8 warps
  k16x16 = 3,   // 16-token tiles, <= 16 warps (H <= 32)
  k32x12 = 4,   // 32-token tiles, <= 12 warps (H <= 32)
  k64x6 = 5,    // 64-token tiles (four m16 tiles), <= 6 warps (H <= 32)
  // Not the register-q kernel: warpgroups of 4 warps score 64-token tiles with wgmma, q in
  // shared memory (indexer_wgmma.cuh). fp8 keys, 16 < H <= 64, and only in sm_90a builds
  // (HISPARSE_SM90A defined); held to the contract's bound, not to mma.sync's bits.
  k64wg = 6,
};
inline constexpr int kIndexerRegisterShapes = 7;
// For programs built against either version of this header (the benchmark's A/B).
#define HISPARSE_INDEXER_HAS_SHAPES 1

enum class IndexerKernel : int32_t {
  kAuto = 0,           // register-q where it applies, else general
  kGeneral = 1,        // any operands of indexer.h
  kRegisterQuery = 2,  // bfloat16 q, H <= 64, d <= 128 only
};

// Overrides of the automatic launch (benchmarks); 0 / kAuto = automatic.
struct IndexerTuning {
  int warps_per_block = 0;  // 1..the kernel's most (kIndexerMaxWarps, or the register shape's)
  int blocks_per_sm = 0;    // grid = SMs x this (capped by occupancy and by the work)
  IndexerKernel kernel = IndexerKernel::kAuto;
  IndexerRegisterShape shape = IndexerRegisterShape::kAuto;  // register-q kernel only
};

// Whether the register-q kernel has `shape` for these operands (kAuto: always
// when it applies at all).
bool IndexerRegisterShapeApplies(const IndexerDims& dims, IndexerRegisterShape shape);

// Whether the register-q kernel takes these operands.
bool IndexerRegisterQueryApplies(const IndexerDims& dims);

// Dynamic shared memory of one block of `warps` warps for `dims` (kernel as
// LaunchIndexScores would pick it for `kernel`).
int64_t IndexerSharedBytes(const IndexerDims& dims, int warps, IndexerKernel kernel = IndexerKernel::kAuto);

// Enqueues the scores of every row on `stream`: one launch, no allocation, no
// synchronization, no host read of device data (lengths are read by the
// kernel). dims must satisfy IndexerSizeError(dims)[0] == '\0'; every pointer
// of `io` must be 16-byte aligned (key_scale: 4-byte), and key_scale non-null
// exactly for fp8 keys. Returns the launch error, if any (cudaErrorInvalidValue
// for dims or pointers outside those rules, or tuning.kernel = kRegisterQuery
// for operands outside its domain, or a tuning.shape it lacks for them).
cudaError_t LaunchIndexScores(const IndexerDims& dims, const IndexerBuffers& io, cudaStream_t stream,
                              const IndexerTuning& tuning = {});

}  // namespace hisparse

#endif  // HISPARSE_FFI_INDEXER_CUDA_H_

// Sparse MLA decode attention on a CUDA device (sparse_attention.h is the contract): launchers on
// raw pointers, no XLA types.
//
// Plan: a chunk kernel, one block per (chunk, heads, request), 8 warps: 64 heads a block, or
// 16 / 32 where that many more blocks still fit one wave (small batches); the block's latent query
// (heads x 512) sits in shared memory, the rope part is read into registers each pass; its
// chunk's tokens are fetched straight from the source by index, one bulk copy (TMA) per token row
// onto an mbarrier, every warp issuing 8 of a pass's rows, 64 tokens (two of the contract's
// stages) a pass, two passes in flight; scores and P @ V run on the tensor cores (mma.sync
// m16n8k16, bf16 in, float32 accumulate) with the online softmax between them, stage by stage.
// Then the merge of chunks 0..15 in order with the open page, by one of two launch plans:
//   cluster (small batches, when every cluster fits one wave): the 16 chunk blocks of a (heads,
//     request) are one thread-block cluster; each keeps its chunk's (m, l, o) in its shared
//     memory and merges 1/16 of the heads from all 16 through distributed shared memory. One
//     launch, nothing through HBM.
//   combine (larger batches): the blocks write (m, l, o) to the workspace, and a second kernel,
//     one block per (head, request), merges them.
// Both merge with the same code (the same bits). Batch invariance: the chunks are fixed, and a
// head's instructions and values are the same whatever the batch, the head split and the plan
// (the same warp roles, the same row of the same m16 tile, the same merge).
// An sm_90a build with HISPARSE_SPARSE_ATTENTION_WGMMA (experimental, off by default) runs another
// chunk kernel for every batch and plan instead, on warpgroup MMAs (sparse_attention_wgmma.cuh),
// then the combine kernel: same contract, its own bits within the contract's rounding.
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_
#define HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "sparse_attention.h"

namespace hisparse {

// Bytes of float32 workspace the launcher needs: (o [512], m, l) per (request, head, chunk).
inline int64_t SparseAttentionWorkspaceBytes(const SparseAttentionShape& s) {
  return s.batch * s.heads * kSparseAttentionChunks * (kSparseAttentionValueWidth + 2) * 4;
}

// Which launch plan (sparse_attention_kernels.cu): both give the same bits (the checker compares
// them); kAuto is the deployed choice, the others are for the checker and the benchmark.
//   kCombine: chunk kernel (partials to the workspace) + combine kernel.
//   kCluster: one launch, the 16 chunk blocks of a (heads, request) as a cluster merging on chip;
//             cudaErrorNotSupported where a cluster of 16 blocks cannot run.
//   kAuto: kCluster when every cluster fits one wave (small batches), else kCombine.
enum class SparseAttentionPlan { kAuto, kCombine, kCluster };

// q [b, H, 576] bf16; source [L, b, N, P, 576] bf16 (L = shape.layers) with layer [] int32 on
// the device; index [b, k] int32; tail [b, P, 576] bf16;
// tail_valid [b, P] uint8 (bool); out [b, H, 512] float32; workspace as above. All bf16 tensors
// as raw uint16 bits. Returns the first launch error.
cudaError_t LaunchSparseAttention(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                                  const uint16_t* source, const int32_t* layer, const int32_t* index, const uint16_t* tail,
                                  const uint8_t* tail_valid, float* out, float* workspace,
                                  cudaStream_t stream, SparseAttentionPlan plan = SparseAttentionPlan::kAuto);

// Clusters of 16 blocks with `groups` (1, 2, 4) head groups each that run at once on the current
// device (0: the cluster plan cannot run; -1: the query failed). For the benchmark's record.
int SparseAttentionClustersAtOnce(int groups);

#ifdef HISPARSE_SPARSE_ATTENTION_TRACE
// Diagnosis builds only (sparse_attention_kernels.cu, Stamp): the phase stamps of the last launch.
cudaError_t SparseAttentionReadTrace(unsigned long long* ns, unsigned long long* clk, unsigned long long* combine_ns,
                                     int blocks);
cudaError_t SparseAttentionClearTrace();
#endif

}  // namespace hisparse

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_

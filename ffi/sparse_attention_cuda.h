// Sparse MLA decode attention on a CUDA device (sparse_attention.h is the contract): launchers on
// raw pointers, no XLA types.
//
// Plan: kernel 1, one block per (chunk, head tile of 64, request), 8 warps: the block's Q tile
// (64 heads x 576) sits in shared memory; its chunk's tokens are fetched straight from the source
// by index with cp.async, kSparseAttentionStage tokens a stage, three stages in flight; scores
// and P @ V run on the tensor cores (mma.sync m16n8k16, bf16 in, float32 accumulate) with the
// online softmax between them; the block writes its chunk's (m, l, o) to the workspace.
// Kernel 2, one block per (head, request): merges chunks 0..15 in order with the open page
// (or, plan kCluster, the chunk blocks merge among themselves; see SparseAttentionPlan).
// The grid never depends on the batch beyond its last dimension: batch invariance.
#ifndef HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_
#define HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "sparse_attention.h"

namespace hisparse {

// How the 16 chunks' partials are merged (same arithmetic, same bits, either way):
//   kCombine: the chunk kernel writes (m, l, o) to the workspace, a second kernel merges them.
//   kCluster: the 16 chunk blocks of a (request, head tile) are one thread-block cluster; they
//             merge through distributed shared memory: no partial reaches HBM, one launch.
//   kAuto:    kCluster where the device fits a cluster of 16 such blocks, else kCombine.
enum class SparseAttentionPlan : int32_t { kAuto = 0, kCombine = 1, kCluster = 2 };

// Bytes of float32 workspace the launcher needs: (o [512], m, l) per (request, head, chunk)
// (plan kCombine; kCluster leaves it untouched).
inline int64_t SparseAttentionWorkspaceBytes(const SparseAttentionShape& s) {
  return s.batch * s.heads * kSparseAttentionChunks * (kSparseAttentionValueWidth + 2) * 4;
}

// q [b, H, 576] bf16; source [L, b, N, P, 576] bf16 (L = shape.layers) with layer [] int32 on
// the device; index [b, k] int32; tail [b, P, 576] bf16;
// tail_valid [b, P] uint8 (bool); out [b, H, 512] float32; workspace as above. All bf16 tensors
// as raw uint16 bits. Returns the first launch error.
cudaError_t LaunchSparseAttention(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                                  const uint16_t* source, const int32_t* layer, const int32_t* index, const uint16_t* tail,
                                  const uint8_t* tail_valid, float* out, float* workspace,
                                  cudaStream_t stream, SparseAttentionPlan plan = SparseAttentionPlan::kAuto);

// Clusters of 16 chunk blocks the device runs at once (0: the cluster plan cannot run here).
int SparseAttentionMaxActiveClusters();

}  // namespace hisparse

#endif  // HISPARSE_FFI_SPARSE_ATTENTION_CUDA_H_

// TOP-K on CUDA: the contract of topk.h, bit-identical to topk_cpu.cc. Two
// kernels (see topk_cuda.h for when each runs), both finding the k-th largest
// key T by radix selection over the 11/11/10-bit digits of topk.h, with the
// blocks of a row (a thread block cluster) exchanging counts through
// distributed shared memory, the unsealed ids (R - n ids of key
// kTopkUnsealedKey) entering every count as one number, never as data, and
// every block of a row choosing the same bucket from the same counts. Only
// counts go through atomics, so every result is independent of thread timing.
//
// The resident kernel (few rows: the latency of a decode step): one
// 1024-thread block per SM, a cluster of C blocks per row, block r owning the
// ids [r x slice, (r + 1) x slice) with slice <= kTopkResidentMaxSlice.
//   1. Every block starts an asynchronous copy of its slice's scores into
//      shared memory (the only read of the scores; each lane copies the ids
//      it visits in every later pass, so it waits for its own copies and no
//      barrier waits for the slowest), and meanwhile loads the
//      same sample of the row (4 ids per thread, spread evenly), histograms
//      its top digit and finds the bucket e where the sample's estimate of
//      the ids at or above a bucket reaches k (and the one where it reaches
//      4k): the same e in every block, with no exchange.
//   2. One pass over the slice counts the ids at or above five boundaries of
//      the top digit: e + 1, e, e - 1, e - 2 and the 4k estimate, and the ids
//      equal to the probe (the sample's largest key in bucket e). A cluster
//      barrier sums the counts: the first boundary with >= k ids at or above
//      it brackets T's top-digit bucket; adjacent boundaries (the usual case)
//      fix it without any histogram. When that bucket is e and all its ids
//      equal the probe (ties: quantized scores, a run of zeros), T is the
//      probe and the counts already taken place every output: straight to 5.
//      The same pass notes, per warp, the positions of its ids at or above e.
//   3. Each block lists its ids at or above that boundary (every id the
//      selection can take: the candidates) in id order, when they fit: from
//      the notes when the boundary is e or e + 1 (the usual case), else by a
//      second pass over the slice; otherwise its later passes visit the whole
//      slice, filtered.
//   4. Usually the row's candidates (a few thousand) fit in one block: after
//      one more barrier every block copies all the candidates' keys (a few KB
//      through distributed shared memory) and resolves the remaining digits
//      alone, learning from the merged list, block after block, how many
//      selected ids the lower-ranked blocks hold.
//      Otherwise (ties, quantized or adversarial scores) each digit is a
//      histogram merged by reduce-scatter: each block sums 1/C of the bins
//      over the cluster, so a block moves ~8 KB per digit rather than every
//      peer's 8 KB histogram, two barriers per digit, and one more barrier
//      exchanges the blocks' output counts.
//   5. Output: each warp counts its ids above T and equal to T, and writes
//      them at G-before + min(ties, E-before) in ascending id order (ties in
//      id order, the lowest ids first). The last block writes the -1 padding.
// A typical row thus reads its scores once and meets at 2 cluster barriers
// and a split one at the exit (a row whose T bucket is one tied key: 1).
//
// The streaming kernel (rows too long for the resident one), described in
// its own section below, reads the scores from global memory at every pass.

// One translation unit, in this order: the kernels are templates in its anonymous
// namespace, instantiated by the launchers of topk_launch.cuh.
#include "topk_device.cuh"
#include "topk_streaming_kernels.cuh"
#include "topk_resident_kernels.cuh"
#include "topk_launch.cuh"

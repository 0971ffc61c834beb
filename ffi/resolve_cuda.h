// RESOLVE on a CUDA device: launchers on raw pointers, no
// XLA types. The kernels (resolve_kernels.cu) are bit-identical to
// resolve_cpu.cc for every input, malformed states included (resolve.h: such
// a stream resolves nothing and is reported in `malformed`; both launch plans
// check it in the resolve kernel, before any write).
//
// Launch plans (ResolveLaunchPlan, the handler's `launch` attribute):
//   fused: one block per stream (kResolveThreads threads, or
//          kResolveThreadsSmall when streams > SMs and
//          B <= kResolveSmallBlockMaxSlots), or a cluster of 2 or 4 blocks
//          per stream for up to about SMs / 2 streams and B > 4096 (see
//          kResolveClusterSize and ResolveClusterBlocks), resolves
//          its selection, then copies its own misses from the host pool (one
//          warp per miss).
//          One launch. A single block pulls from pinned host memory at only a
//          fraction of the link (BENCHMARKS.md: fused at one stream reaches about a
//          third of the zero-copy ceiling), so this suits many streams.
//   split: the same resolve kernel without the copy, then a fetch kernel that
//          spreads every stream's misses over ~kFetchBlocksPerSm x SMs blocks;
//          wins when few streams would leave the link idle.
//   auto:  split when streams < kAutoSplitBelowStreams, else fused.
// "Streams" in these choices are the streams a launch resolves: those of its
// StreamRange (resolve.h), which is all a launch's grids cover. The rows of
// the streams outside it are filled by the range's resolve blocks (a few
// stores each), so a call over 1/G of the batch costs about what a batch
// of S/G streams does, and its copy gets every block a whole batch would.
#ifndef HISPARSE_FFI_RESOLVE_CUDA_H_
#define HISPARSE_FFI_RESOLVE_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "resolve.h"

namespace hisparse {

enum class ResolveLaunchPlan : int32_t {
  kAuto = 0,
  kFused = 1,
  kSplit = 2,
};

// Largest k and B the resolve kernel holds in one block (shared memory and
// registers are sized for them); the FFI handler rejects larger shapes.
inline constexpr int64_t kMaxResolveTopK = 8192;
inline constexpr int64_t kMaxResolveHotSlots = 16384;

// Threads of one resolve block (one block per stream) and of one fetch block.
// The resolve kernel is latency-bound and uses 64 registers per thread, so a
// block of 1024 threads takes a whole SM: 256 streams on 132 SMs ran in two
// waves (no-IO time doubled from 64 to 256 streams). With more streams than
// SMs and up to kResolveSmallBlockMaxSlots hot slots (<= 8 lru items per
// lane) a block has kResolveThreadsSmall threads and two blocks share an SM.
// Building with -DHISPARSE_RESOLVE_SMALL_BLOCK_MAX_SLOTS=0 keeps 1024-thread
// blocks everywhere, and with -DHISPARSE_RESOLVE_SMALL_BLOCKS_FROM_STREAMS=N
// takes small blocks from N streams on instead of from SMs + 1 (A/B
// comparisons in ffi/bench/resolve_bench.cu).
inline constexpr int kResolveThreads = 1024;
inline constexpr int kResolveThreadsSmall = 512;
#ifdef HISPARSE_RESOLVE_SMALL_BLOCK_MAX_SLOTS
inline constexpr int64_t kResolveSmallBlockMaxSlots = HISPARSE_RESOLVE_SMALL_BLOCK_MAX_SLOTS;
#else
inline constexpr int64_t kResolveSmallBlockMaxSlots = 8 * kResolveThreadsSmall;  // 4096
#endif
static_assert(kResolveSmallBlockMaxSlots <= 8 * kResolveThreadsSmall,
              "small blocks hold at most 8 lru items per lane");
// Launches of few enough streams resolve each stream on a cluster of resolve
// blocks (resolve_cluster_kernel.cuh), which split the B-sized work between
// SMs, when B > kResolveClusterMinSlots: kResolveWideClusterSize blocks when
// the device runs that many
// clusters of them at once (cudaOccupancyMaxActiveClusters: a cluster's
// blocks share a GPC, so this can be less than SMs / 4), else
// kResolveClusterSize blocks on the same condition; when B <=
// kResolveClusterMaxSlots, k <= kResolveClusterMaxTopK and the state check's
// record bitmap fits (R bits, R <= 16 x the held set's capacity, see
// resolve_device.cuh). Building with -DHISPARSE_RESOLVE_NO_CLUSTER keeps one
// block per stream everywhere, with -DHISPARSE_RESOLVE_NO_WIDE_CLUSTER pairs
// at most (A/B comparisons).
// Off unless built with -DHISPARSE_RESOLVE_CLUSTER (resolve_launch.cuh says
// why; the checker builds with it). Only B > kResolveClusterMinSlots: on an H200 (benchmarks/results, issue 22)
// the cluster kernel was slower at B = 2048 and 4096 (13.8 vs 11.7 and 14.9
// vs 14.3 us at 64 streams, k = 2048, 13% misses: its table is built in
// every block and its cluster barriers cost more than the split saves) and
// faster at B = 8192 (15.1 vs 18.0 us at 1 stream, 18.7 vs 19.1 at 64).
// -DHISPARSE_RESOLVE_CLUSTER_MIN_SLOTS=0 sends every eligible shape to
// clusters (the checker's build that covers the cluster kernel everywhere).
inline constexpr int kResolveClusterSize = 2;
inline constexpr int kResolveWideClusterSize = 4;
#ifdef HISPARSE_RESOLVE_CLUSTER_MIN_SLOTS
inline constexpr int64_t kResolveClusterMinSlots = HISPARSE_RESOLVE_CLUSTER_MIN_SLOTS;
#else
inline constexpr int64_t kResolveClusterMinSlots = 4096;
#endif
inline constexpr int64_t kResolveClusterMaxSlots = 8192;
inline constexpr int64_t kResolveClusterMaxTopK = 4096;
inline constexpr int kFetchThreads = 256;
// The split plan's fetch grid aims at this many blocks per SM in total.
inline constexpr int kFetchBlocksPerSm = 4;
// Auto plan: split below this many streams, fused from there on. Measured on
// an H200 (benchmarks/results/2026-11-29-h200/resolve.log, stream sweep at
// B = 4096, 1152 B records, 13% misses): split wins clearly at 1-2 streams
// (26.8 vs 38.7 us at 1 stream), fused is within 2% of split from 4 streams
// on and saves the second launch. The "auto threshold" table of
// ffi/bench/resolve_bench.cu re-measures it and prints the value to use.
inline constexpr int64_t kAutoSplitBelowStreams = 4;

// Dynamic shared memory of one resolve block for (k, B): the id table
// (keys and words, 2 x int32 x cap, cap a power of two >= 4k while table and
// region stay within 96 KiB, else >= 2k), then max(B, 2k) int32 (slot_record
// staged, later the miss plan), then the malformed-state check: a bitmap of B
// bits and, unless B > 8192 with k > 4096 (those shapes lay it over the
// table), a set of uint16 slot ids of capacity pow2 >= 2B, whose memory holds
// a bitmap of R bits instead where that fits.
// At most kMaxResolveSharedBytes (225 KiB, at k = 8192 and B = 8192: 128 +
// 64 + 1 + 32 KiB; resolve_kernels.cu asserts it over every shape); above
// 48 KiB in all the launcher opts the kernels in once per device.
int64_t ResolveSharedBytes(int64_t top_k, int64_t hot_slots);
inline constexpr int64_t kMaxResolveSharedBytes = 225 * 1024;

// Blocks per stream (1, kResolveClusterSize or kResolveWideClusterSize) of a
// resolve launch of every stream of `dims` on the current device; for
// benchmarks and checks.
int ResolveClusterBlocks(const ResolveDims& dims);

// The plan `plan` resolves to for `streams` streams (never kAuto).
ResolveLaunchPlan ChooseResolvePlan(ResolveLaunchPlan plan, int64_t streams);

// Resolves the streams of `range` (AllStreams(dims): every one) of layer
// `*layer` (a device scalar, read by the kernels, never by the host) and,
// when `fetch`, copies their missing records from io.host_pool (pinned host
// memory, addressed by its UVA pointer) into io.hot; the output rows of the
// other streams get what padding gives (resolve.h). io.hot, io.slot_record
// and io.lru are updated in place. Enqueues one or two kernels on `stream`
// (an empty range with streams outside it: six memsets); no allocation, no
// synchronization. Returns the first launch error; `failed_kernel`, when not
// null, then names the kernel. dims must satisfy the checks of CheckResolve
// plus k <= kMaxResolveTopK and B <= kMaxResolveHotSlots, and range those of
// CheckStreamRange (else cudaErrorInvalidValue).
cudaError_t LaunchResolve(const ResolveDims& dims, StreamRange range, const int32_t* layer,
                          const ResolveBuffers& io, bool fetch, ResolveLaunchPlan plan,
                          cudaStream_t stream, const char** failed_kernel = nullptr);

// The split plan's copy alone: copies the misses that a resolve launch of
// `range` with fetch = false planned (io.miss_records, io.miss_slots,
// io.misses of layer `*layer`, the range's rows) from io.host_pool into io.hot,
// with at most about `max_blocks` blocks of kFetchThreads, all of them on the
// range's streams. Used by the prefetch (prefetch.h), which runs it on a
// stream of its own after the resolve launch; the split plan launches it with
// kFetchBlocksPerSm x SMs blocks.
cudaError_t LaunchResolveFetch(const ResolveDims& dims, StreamRange range, const int32_t* layer,
                               const ResolveBuffers& io, int64_t max_blocks, cudaStream_t stream,
                               const char** failed_kernel = nullptr);

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_CUDA_H_

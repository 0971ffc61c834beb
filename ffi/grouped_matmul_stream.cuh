// The grouped matmul's streaming kernel (sm_90): the weights reach shared memory through the TMA
// engine, a deep ring of stages ahead of the math, instead of through each warp's registers.
// Included by grouped_matmul_kernels.cu inside its anonymous namespace, after WarpTile, whose
// arithmetic it repeats: the same fragments, the same mma in the same order on every accumulator,
// so y has the same bits as the warp-tile kernel's (grouped_matmul.h: the bits depend on neither
// the launch variant nor the batch).
// A split of K (S > 1: the shared expert) runs here too, without splitting the work: a consumer
// warp streams its rows' whole K in order as without a split, starts each slice's sum from +0 at
// the slice's first chunk and adds the finished slice into a running total, ((p_0 + p_1) + p_2)
// + ..., an empty last slice adding its +0 as the warp-tile kernel's idle slice warps do. The
// warp-tile kernel spreads the S slices over S warps and meets them in shared memory, and each
// of its blocks of 16 rows reads all of x (at 17 tokens x 6144, x is twice the block's weight
// bytes); here a block's 128 rows share one copy of x, at the price of few units (the glm5 shared
// expert: 32 or 48, fewer than the SMs), each streaming a whole 128-row slab. Which wins is for
// the A/B (grouped_matmul_bench --slices --ab) to say: the split runs here only when asked.
// Slice groups (G = 2 or 4, kSliceGroups) trade x for units: a unit is 128 / G rows, its 8
// consumer warps 8 / G row tiles x G groups of S / G consecutive slices each, so E = 1 gives G
// times the units. Group 0's warp sums its slices as above, p_0 + ... + p_{S/G-1}; the warps of
// the later groups leave each finished slice's sum (+0 for an empty slice) in shared memory, and
// after the pass group 0's warp adds them in slice order: the same sums in the same order again.
// A stage then holds, per group, its 4 chunks of the unit's rows and its x.
//
// Why (ncu on an H100, gate_up fp8 at 328 pairs, BENCHMARKS.md): the warp-tile kernel keeps its
// weight loads in registers, 146 a thread there, so 12 warps an SM fit and its loads stop while
// they compute: HBM at 52% of peak with L2 and L1 at a quarter of theirs. Here one producer lane
// a block keeps `stages` stages of 128 rows x 256 bytes in flight whatever the math's registers.
//
// Work: units of (expert, 128 weight rows), expert-major; block b takes units b, b + grid, ...
// (experts without rows are skipped by every warp alike). With a grid of one block a unit (the
// default, two blocks resident an SM) the hardware hands out the units; a persistent grid loops.
// A unit's tokens go in passes of 8 kTokenTiles, each pass streams the unit's rows once (as the
// warp-tile kernel does). A stage is 4 chunks of k (256 bytes of each weight row): per chunk one
// TMA tensor copy of the unit's 128 rows x 64 bytes and one of the pass's tokens' x at the same k
// (a bulk copy a row moved only ~6 GB/s an SM: the copy engine takes ~90 cycles a copy, so copies
// must be large). The maps (tensor_map.h) fill rows past N, k past K and tokens past M with
// zeros; tokens past the group's end are read but never written. Consumer warp w computes weight
// rows 16 w .. 16 w + 15. The block also writes the rows past the last group (the warp-tile
// kernel's zero blocks).
// Shared memory reads without bank conflicts: a chunk's weight rows are 64 bytes apart, so the
// 16-byte reads of rows g and g + 1 by a quarter-warp cover all 32 banks; fp8's x rows are 128
// bytes apart and a lane reads 32 bytes (lo, hi), so even tokens read lo first and odd ones hi
// first (the values are the same; only the order of the two loads differs); bf16's x rows are 64
// bytes apart like the weights.

constexpr int kStreamConsumerWarps = 8;
constexpr int kStreamThreads = kWarp * (1 + kStreamConsumerWarps);  // warp 0 copies
constexpr int kStreamRows = kRowsPerWeightTile * kStreamConsumerWarps;  // 128 rows a unit
constexpr int kStreamStageChunks = 4;  // a stage: 4 chunks, 256 bytes of each weight row
constexpr int kStreamMaxStages = 6;
constexpr int64_t kStreamWeightBox = int64_t{kStreamRows} * kChunkBytes;  // a chunk of the unit's rows: 8 KB
constexpr int kStreamMaxSliceGroups = 4;

template <bool kFp8>
struct StreamShape {
  static constexpr int kXChunkBytes = kFp8 ? 2 * kChunkBytes : kChunkBytes;  // x is bf16: a chunk's k
  static constexpr int kXChunkElements = kXChunkBytes / 2;
  __host__ __device__ static constexpr int64_t XBox(int token_tiles) {
    return int64_t{kTokensPerTile} * token_tiles * kXChunkBytes;
  }
  // A stage of `groups` slice groups (1 without them): each group's 4 chunks of its 128 / groups
  // rows (together a chunk of 128 rows) and its x.
  __host__ __device__ static constexpr int64_t StageBytes(int token_tiles, int groups = 1) {
    return kStreamStageChunks * (kStreamWeightBox + groups * XBox(token_tiles));
  }
};

// The shared memory of a block's slice sums with slice groups (after the stages): for each of its
// 8 / groups row tiles, each slice past group 0's (S - S / groups) x the pass's token tiles x the
// C fragment's 4 floats x 32 lanes. None without slice groups.
__host__ __device__ constexpr int64_t StreamPartialBytes(int token_tiles, int groups, int k_slices) {
  return groups > 1 ? int64_t{kStreamConsumerWarps / groups} * (k_slices - k_slices / groups) * token_tiles * 4 *
                          kWarp * 4
                    : 0;
}

// The barriers first (full: the stage's bytes landed; empty: every consumer thread read it), then
// the stages, each 128-byte aligned (the tensor copies' destinations must be).
constexpr int64_t kStreamBarrierBytes = 128;
static_assert(2 * kStreamMaxStages * 8 <= kStreamBarrierBytes, "the stream kernel's barriers must fit their area");

// sum over i < count of max(sizes[i], 0) in 64 bits, by one warp (every lane gets it): each warp
// computes its own, so the producer never waits for the consumers to learn a group's offset.
__device__ __forceinline__ int64_t WarpClampedSizeSum(const int32_t* sizes, int count, int lane) {
  int64_t sum = 0;
  for (int i = lane; i < count; i += kWarp) sum += max(sizes[i], 0);
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  return sum;
}

__device__ __forceinline__ uint4 LoadShared16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// A 3-d (w: k bytes, row, expert) or 2-d (x: k, token) tensor copy into shared memory, completing
// on `bar`.
__device__ __forceinline__ void TensorCopy3d(void* dst, const CUtensorMap* map, int x, int y, int z,
                                             unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          SmemAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void TensorCopy2d(void* dst, const CUtensorMap* map, int x, int y, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          SmemAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(SmemAddr(bar))
      : "memory");
}

// A consumer warp's sum over the slices of K (kSplit): `total` holds the finished slices in slice
// order, p_0 then (p_0 + p_1) + ...; `next` is the chunk where the next slice starts.
template <int kTokenTiles, bool kSplit>
struct SliceTotal {
  float total[kTokenTiles][4];
  int folded = 0;
  int next;
  __device__ __forceinline__ explicit SliceTotal(int slice_chunks) : next(slice_chunks) {
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) total[t][i] = 0.0f;  // never read before the first Fold sets it
  }
  // The slice that acc holds is finished: add it to the total; acc restarts from +0.
  __device__ __forceinline__ void Fold(float (&acc)[kTokenTiles][4], int slice_chunks) {
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        total[t][i] = folded == 0 ? acc[t][i] : total[t][i] + acc[t][i];
        acc[t][i] = 0.0f;
      }
    ++folded;
    next += slice_chunks;
  }
  // After the last chunk: its slice, then each empty slice's +0 (as the warp-tile kernel adds its
  // idle slice warps' sums), and acc takes the total.
  __device__ __forceinline__ void Finish(float (&acc)[kTokenTiles][4], int k_slices, int slice_chunks) {
    while (folded < k_slices) Fold(acc, slice_chunks);
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = total[t][i];
  }
};
template <int kTokenTiles>
struct SliceTotal<kTokenTiles, false> {
  __device__ __forceinline__ explicit SliceTotal(int) {}
};

// Slice groups: a finished slice's sum into its slot ([token tile][4][lane] floats: a lane's
// floats 32 apart, no bank conflict), acc restarting from +0; and a slot added to acc.
template <int kTokenTiles>
__device__ __forceinline__ void StoreSliceSum(float* slot, float (&acc)[kTokenTiles][4], int lane) {
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      slot[(t * 4 + i) * kWarp + lane] = acc[t][i];
      acc[t][i] = 0.0f;
    }
}
template <int kTokenTiles>
__device__ __forceinline__ void AddSliceSum(float (&acc)[kTokenTiles][4], const float* slot, int lane) {
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] += slot[(t * 4 + i) * kWarp + lane];
}

// kSliceGroups: 0, K is not split (S = 1: the routed experts' kernels compile without any slice
// bookkeeping); 1, K in p.k_slices slices of p.slice_chunks chunks, each consumer warp summing all
// of its rows' slices; 2 or 4, the slice groups above (S >= kSliceGroups).
template <bool kFp8, int kTokenTiles, int kSliceGroups>
__global__ void __launch_bounds__(kStreamThreads, 1)
    GroupedMatmulStreamKernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                              const GroupedArgs p, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Shape = StreamShape<kFp8>;
  static_assert(kSliceGroups == 0 || kSliceGroups == 1 || kSliceGroups == 2 || kSliceGroups == kStreamMaxSliceGroups,
                "slice groups: 0 (no split), 1, 2 or 4");
  constexpr bool kSplit = kSliceGroups > 0;
  constexpr bool kGrouped = kSliceGroups > 1;
  constexpr int kGroups = kGrouped ? kSliceGroups : 1;
  constexpr int kRowTiles = kStreamConsumerWarps / kGroups;        // 16-row tiles a unit: 8, 4 or 2
  constexpr int kUnitRows = kRowsPerWeightTile * kRowTiles;         // 128, 64 or 32
  constexpr int64_t kWeightBox = int64_t{kUnitRows} * kChunkBytes;  // a chunk of the unit's rows
  constexpr int kSteps = kFp8 ? 4 : 2;
  constexpr int kTokensPerPass = kTokensPerTile * kTokenTiles;
  constexpr int64_t kXBox = Shape::XBox(kTokenTiles);
  constexpr int64_t kStageBytes = Shape::StageBytes(kTokenTiles, kGroups);
  extern __shared__ __align__(128) uint8_t smem[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem);
  unsigned long long* empty = full + kStreamMaxStages;
  uint8_t* stage_base = smem + kStreamBarrierBytes;
  // The chunks of a slice group (group 0 has exactly this many, a later one as many or fewer, or
  // none); without slice groups, every chunk of the row.
  const int group_chunks = kGrouped ? (p.k_slices / kGroups) * p.slice_chunks : p.chunks;

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kWarp * kStreamConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int64_t row_blocks = (p.n + kUnitRows - 1) / kUnitRows;
  const int64_t units = p.experts * row_blocks;
  const int g = lane / 4, c = lane % 4;
  int64_t it = 0;  // stages handed over so far: slot it % stages, phase (it / stages) & 1

  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int expert = static_cast<int>(unit / row_blocks);
    const int row0 = static_cast<int>((unit % row_blocks) * kUnitRows);
    if (p.sizes[expert] <= 0) continue;  // the same answer on every warp: no rows, nothing read
    const int64_t begin = WarpClampedSizeSum(p.sizes, expert, lane);
    if (begin >= p.rows) continue;
    const int64_t end = min(begin + p.sizes[expert], p.rows);

    for (int64_t t0 = begin; t0 < end; t0 += kTokensPerPass) {
      if (warp == 0) {
        // ---- producer (lane 0): one stage after another, each into the slot its consumers released
        for (int chunk0 = 0; chunk0 < group_chunks; chunk0 += kStreamStageChunks, ++it) {
          if (lane != 0) continue;
          const int slot = static_cast<int>(it % stages);
          if (it >= stages) MbarWait(&empty[slot], static_cast<uint32_t>((it / stages - 1) & 1));
          uint8_t* w_stage = stage_base + slot * kStageBytes;
          uint8_t* x_stage = w_stage + kGroups * kStreamStageChunks * kWeightBox;
          if constexpr (kGrouped) {
            // Group j's chunks j * group_chunks + chunk0 + q, those it has (a last group may end
            // early or have none), into its boxes j * 4 + q.
            int count[kGroups];
            uint32_t bytes = 0;
#pragma unroll
            for (int j = 0; j < kGroups; ++j) {
              const int left = min(p.chunks, (j + 1) * group_chunks) - (j * group_chunks + chunk0);
              count[j] = max(0, min(kStreamStageChunks, left));
              bytes += static_cast<uint32_t>(count[j] * (kWeightBox + kXBox));
            }
            MbarArriveExpectTx(&full[slot], bytes);
#pragma unroll
            for (int j = 0; j < kGroups; ++j)
              for (int q = 0; q < count[j]; ++q) {
                const int chunk = j * group_chunks + chunk0 + q, box = j * kStreamStageChunks + q;
                TensorCopy3d(w_stage + box * kWeightBox, &w_map, chunk * kChunkBytes, row0, expert, &full[slot]);
                TensorCopy2d(x_stage + box * kXBox, &x_map, chunk * Shape::kXChunkElements, static_cast<int>(t0),
                             &full[slot]);
              }
          } else {
            const int chunks = min(kStreamStageChunks, p.chunks - chunk0);
            MbarArriveExpectTx(&full[slot], static_cast<uint32_t>(chunks * (kWeightBox + kXBox)));
            for (int q = 0; q < chunks; ++q) {
              const int chunk = chunk0 + q;
              TensorCopy3d(w_stage + q * kWeightBox, &w_map, chunk * kChunkBytes, row0, expert, &full[slot]);
              TensorCopy2d(x_stage + q * kXBox, &x_map, chunk * Shape::kXChunkElements, static_cast<int>(t0), &full[slot]);
            }
          }
        }
        continue;
      }

      // ---- consumer warp w' = warp - 1: weight rows 16 r .. 16 r + 15 of the unit, r = w' (w' % 8 / G
      // in slice group w' / (8 / G) with slice groups)
      const int group = kGrouped ? (warp - 1) / kRowTiles : 0;
      const int row_tile = kGrouped ? (warp - 1) % kRowTiles : warp - 1;
      const int tile_row = kRowsPerWeightTile * row_tile;
      const int group_first = group * group_chunks;  // its first chunk (0 without slice groups)
      const int group_end = kGrouped ? min(p.chunks, group_first + group_chunks) : p.chunks;
      const int tiles = static_cast<int>(min(static_cast<int64_t>(kTokenTiles), (end - t0 + kTokensPerTile - 1) / kTokensPerTile));
      float acc[kTokenTiles][4];
#pragma unroll
      for (int t = 0; t < kTokenTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
      SliceTotal<kTokenTiles, kSplit> slices(group_first + p.slice_chunks);
      // Slice groups: this row tile's slice sums of the later groups, slice S / G + i at slot i.
      const int own_slices = kGrouped ? p.k_slices / kGroups : 0;
      float* slots = reinterpret_cast<float*>(stage_base + stages * kStageBytes) +
                     int64_t{row_tile} * (p.k_slices - own_slices) * kTokenTiles * 4 * kWarp;
      int stored = 0;  // a later group's slices already in their slots
      for (int chunk0 = 0; chunk0 < group_chunks; chunk0 += kStreamStageChunks, ++it) {
        const int slot = static_cast<int>(it % stages);
        MbarWait(&full[slot], static_cast<uint32_t>((it / stages) & 1));
        const uint8_t* w_stage = stage_base + slot * kStageBytes;
        const uint8_t* x_stage = w_stage + kGroups * kStreamStageChunks * kWeightBox;
#pragma unroll
        for (int q = 0; q < kStreamStageChunks; ++q) {
          if (chunk0 + q >= group_chunks) break;  // warp-uniform: a short last stage
          const int chunk = group_first + chunk0 + q;
          if constexpr (kGrouped) {
            if (chunk >= group_end) break;  // warp-uniform: a short (or empty) last group
          }
          if constexpr (kSplit) {
            if (chunk == slices.next) {  // warp-uniform: a slice ends
              if (kGrouped && group > 0) {
                StoreSliceSum<kTokenTiles>(slots + int64_t{(group - 1) * own_slices + stored} * kTokenTiles * 4 * kWarp, acc, lane);
                ++stored;
                slices.next += p.slice_chunks;
              } else {
                slices.Fold(acc, p.slice_chunks);
              }
            }
          }
          const int box = group * kStreamStageChunks + q;  // q without slice groups
          // Past the row (a partial last chunk) the copy filled zeros, as the warp-tile kernel's masks do.
          const uint8_t* w_chunk = w_stage + box * kWeightBox + 16 * c;
          const uint4 top = LoadShared16(w_chunk + (tile_row + g) * kChunkBytes);
          const uint4 bottom = LoadShared16(w_chunk + (tile_row + 8 + g) * kChunkBytes);
          uint32_t a[kSteps][4];
#pragma unroll
          for (int s = 0; s < kSteps; ++s) WeightFragment<kFp8>(top, bottom, s, a[s]);
          const uint8_t* x_chunk = x_stage + box * kXBox;
#pragma unroll
          for (int t = 0; t < kTokenTiles; ++t) {
            if (t >= tiles) break;  // warp-uniform
            const uint8_t* src = x_chunk + (kTokensPerTile * t + g) * Shape::kXChunkBytes;
            uint4 lo, hi = make_uint4(0, 0, 0, 0);
            if constexpr (kFp8) {
              const int odd = g & 1;  // odd tokens read their hi piece first: no bank conflict
              const uint4 first = LoadShared16(src + 32 * c + 16 * odd);
              const uint4 second = LoadShared16(src + 32 * c + 16 * (1 - odd));
              lo = odd ? second : first;
              hi = odd ? first : second;
            } else {
              lo = LoadShared16(src + 16 * c);
            }
            const uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int s = 0; s < kSteps; ++s) Mma(acc[t], a[s], xw[2 * s], xw[2 * s + 1]);
          }
        }
        MbarArrive(&empty[slot]);  // every consumer thread: its reads of the slot are done
      }
      if constexpr (kGrouped) {
        if (group == 0) {
          slices.Finish(acc, own_slices, p.slice_chunks);  // its own slices, none of them empty
        } else {
          // The slice in progress, then +0 for each empty one (as the warp-tile kernel's idle slice
          // warps add theirs).
          for (; stored < own_slices; ++stored)
            StoreSliceSum<kTokenTiles>(slots + int64_t{(group - 1) * own_slices + stored} * kTokenTiles * 4 * kWarp, acc, lane);
        }
        NamedBarrier(1 + row_tile, kGroups * kWarp);  // the row tile's later groups' sums in their slots
        if (group == 0) {
          for (int i = 0; i < p.k_slices - own_slices; ++i) AddSliceSum<kTokenTiles>(acc, slots + int64_t{i} * kTokenTiles * 4 * kWarp, lane);
        }
        NamedBarrier(1 + row_tile, kGroups * kWarp);  // the slots are free for the next pass
      } else if constexpr (kSplit) {
        slices.Finish(acc, p.k_slices, p.slice_chunks);
      }

      // y = acc * scale: rows g (h = 0) and g + 8 (h = 1) of the warp's 16 (group 0's warps).
      if (group == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t n = row0 + tile_row + 8 * h + g;
          if (n < p.n) StoreChannel<kTokenTiles>(p, expert, n, h, acc, t0, end, tiles, c);
        }
      }
    }
  }

  // Rows [min(total, M), M) belong to no group: +0 in every column, rows spread over the blocks.
  const int64_t first = min(WarpClampedSizeSum(p.sizes, p.experts, lane), p.rows);
  for (int64_t row = first + blockIdx.x; row < p.rows; row += gridDim.x) {
    float* out = p.y + row * p.n;
    for (int64_t col = threadIdx.x; col < p.n; col += blockDim.x) out[col] = 0.0f;
  }
#else
  __trap();  // launched only on devices of compute capability 9.0 and up (GroupedMatmulStreamFits)
#endif
}

// An experiment on the grouped matmul's weight layout (issue: the roofline), opt-in at compile
// time for the standalone checker and benchmark only: HISPARSE_GROUPED_MATMUL_TILE_ROWS=T (16 or
// 32) builds the kernel (grouped_matmul_kernels.cu) for weights stored in tiles of T rows, not the
// contract's row-major [E, N, K] (grouped_matmul.h). The extension never builds it (the custom
// call's weights are row-major; grouped_matmul_handlers_cuda.cc refuses the macro).
//
// Why: a warp's load of a weight chunk is 64 bytes of each of 8 rows (lanes 4 g .. 4 g + 3 read
// row g's 16-byte pieces), so in the row-major layout it touches 8 pieces a row (K bytes, 2-6 KB)
// apart. In the tiled layout the chunk's 64-byte pieces of the tile's T rows are contiguous: the
// same load reads 512 contiguous bytes, and a tile's rows stream through DRAM pages together.
//
// Layout: the E * N weight rows (row = e N + n) in tiles of T consecutive rows; byte b of row r is
// at TiledWeightOffset(r, b). The same bytes as row-major, moved: the same array size, and the
// kernel's arithmetic (which k meets which x) is unchanged, so y's bits are the row-major build's.
// Needs N % T == 0 (no tile straddles two experts) and K * element bytes % 64 == 0 (whole chunks);
// other shapes are refused (cudaErrorNotSupported).
#ifndef HISPARSE_FFI_GROUPED_MATMUL_TILED_H_
#define HISPARSE_FFI_GROUPED_MATMUL_TILED_H_

#include <cstdint>
#include <vector>

#ifndef HISPARSE_GROUPED_MATMUL_TILE_ROWS
#define HISPARSE_GROUPED_MATMUL_TILE_ROWS 0
#endif

namespace hisparse {

inline constexpr int64_t kGroupedMatmulTileRows = HISPARSE_GROUPED_MATMUL_TILE_ROWS;
inline constexpr int64_t kGroupedMatmulTilePiece = 64;  // bytes: the kernel's chunk of a row
static_assert(kGroupedMatmulTileRows == 0 || kGroupedMatmulTileRows == 16 || kGroupedMatmulTileRows == 32,
              "HISPARSE_GROUPED_MATMUL_TILE_ROWS must be 0 (row-major), 16 or 32");

#ifdef __CUDACC__
#define HISPARSE_HOST_DEVICE __host__ __device__
#else
#define HISPARSE_HOST_DEVICE
#endif

// Byte b of weight row `row` (rows of `row_bytes`) in tiles of `tile` rows: the tile's start, then
// piece b / 64 of every row of the tile, row by row, then byte b % 64 of the piece.
HISPARSE_HOST_DEVICE inline int64_t TiledWeightOffset(int64_t row, int64_t b, int64_t row_bytes, int64_t tile) {
  return (row - row % tile) * row_bytes + (b / kGroupedMatmulTilePiece) * (tile * kGroupedMatmulTilePiece) +
         (row % tile) * kGroupedMatmulTilePiece + b % kGroupedMatmulTilePiece;
}

inline bool TiledWeightsFit(int64_t n, int64_t row_bytes, int64_t tile) {
  return n % tile == 0 && row_bytes % kGroupedMatmulTilePiece == 0;
}

// Row-major weights ([rows, row_bytes]) in the tiled layout (rows a multiple of `tile`).
inline std::vector<uint8_t> TileWeights(const std::vector<uint8_t>& w, int64_t rows, int64_t row_bytes, int64_t tile) {
  std::vector<uint8_t> out(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < row_bytes; b += kGroupedMatmulTilePiece)
      for (int64_t i = 0; i < kGroupedMatmulTilePiece; ++i)
        out[TiledWeightOffset(r, b + i, row_bytes, tile)] = w[r * row_bytes + b + i];
  return out;
}

}  // namespace hisparse

#undef HISPARSE_HOST_DEVICE

#endif  // HISPARSE_FFI_GROUPED_MATMUL_TILED_H_

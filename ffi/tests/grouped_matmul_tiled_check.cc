// The tiled-weight experiment's layout (ffi/grouped_matmul_tiled.h) on the host, no GPU: every
// byte of every row lands on its own place inside the weight array; the kernel's address of a
// lane's 16 bytes (the row's base, then chunk * T * 64 + 16 c) is the layout's; a warp's load of
// one chunk (rows g and g + 8 of a 16-row weight tile, lanes c) is 512 contiguous bytes, the point
// of the layout; and TileWeights moves each byte where TiledWeightOffset says. Run by
// tests/test_grouped_matmul_tiled_layout.py; exit status 0 when all hold.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "grouped_matmul_tiled.h"

int main() {
  using hisparse::TiledWeightOffset;
  int bad = 0;
  auto fail = [&](const char* what, long long tile, long long row_bytes) {
    if (bad++ < 10) std::printf("FAIL %s (tile %lld, row bytes %lld)\n", what, tile, row_bytes);
  };
  for (int64_t tile : {16, 32}) {
    for (int64_t row_bytes : {2048, 4096, 6144}) {
      const int64_t rows = 6 * tile;
      std::vector<uint8_t> hit(rows * row_bytes, 0);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = TiledWeightOffset(r, 0, row_bytes, tile);
        for (int64_t b = 0; b < row_bytes; ++b) {
          const int64_t at = TiledWeightOffset(r, b, row_bytes, tile);
          if (at < 0 || at >= rows * row_bytes) {
            fail("an offset outside the array", tile, row_bytes);
            continue;
          }
          ++hit[at];
          if (b % 16 == 0 && at != base + (b / 64) * tile * 64 + b % 64) fail("the kernel's address differs", tile, row_bytes);
        }
      }
      if (std::any_of(hit.begin(), hit.end(), [](uint8_t h) { return h != 1; })) fail("not a permutation", tile, row_bytes);
      for (int64_t row0 = 0; row0 < rows; row0 += 16)
        for (int h = 0; h < 2; ++h)
          for (int64_t chunk = 0; chunk < row_bytes / 64; ++chunk) {
            std::vector<int64_t> lanes;
            for (int g = 0; g < 8; ++g)
              for (int c = 0; c < 4; ++c) lanes.push_back(TiledWeightOffset(row0 + 8 * h + g, chunk * 64 + 16 * c, row_bytes, tile));
            std::sort(lanes.begin(), lanes.end());
            for (size_t i = 1; i < lanes.size(); ++i)
              if (lanes[i] != lanes[i - 1] + 16) {
                fail("a warp's load is not 512 contiguous bytes", tile, row_bytes);
                break;
              }
          }
      std::vector<uint8_t> w(rows * row_bytes);
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i * 131 + 7);
      const std::vector<uint8_t> tiled = hisparse::TileWeights(w, rows, row_bytes, tile);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < row_bytes; ++b)
          if (tiled[TiledWeightOffset(r, b, row_bytes, tile)] != w[r * row_bytes + b]) {
            fail("TileWeights put a byte elsewhere", tile, row_bytes);
            r = rows;
            break;
          }
    }
  }
  std::printf("%d failed\n", bad);
  return bad ? 1 : 0;
}

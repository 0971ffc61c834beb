// The pool write on the CPU: the contract of pool_write.h.
#include <algorithm>
#include <cstring>

#include "pool_write.h"

namespace hisparse {

void PoolWriteCpu(const PoolWriteDims& d, const uint8_t* records, const int32_t* start,
                  const int32_t* count, uint8_t* host_pool) {
  const int64_t n = d.rows, R = d.pool_records, W = d.record_bytes;
  for (int64_t l = 0; l < d.layers; ++l) {
    for (int64_t s = 0; s < d.streams; ++s) {
      const int64_t ls = l * d.streams + s;
      const int64_t rows = std::min<int64_t>(std::max<int32_t>(count[s], 0), n);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = int64_t{start[s]} + i;
        if (r < 0 || r >= R) continue;
        std::memcpy(host_pool + (ls * R + r) * W, records + (ls * n + i) * W, W);
      }
    }
  }
}

}  // namespace hisparse

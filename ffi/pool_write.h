// The pool write on raw pointers: no XLA, no nanobind, no CUDA. It appends
// records to the host pool, laid out as in resolve.h ([L, S, R, W] bytes).
#ifndef HISPARSE_FFI_POOL_WRITE_H_
#define HISPARSE_FFI_POOL_WRITE_H_

#include <cstdint>

namespace hisparse {

// Sizes of one pool write.
struct PoolWriteDims {
  int64_t layers;        // L
  int64_t streams;       // S
  int64_t rows;          // n: records offered per stream and layer
  int64_t pool_records;  // R
  int64_t record_bytes;  // W
};

// host_pool[l, s, start[s] + i] = records[l, s, i] for i < count[s]. Rows that
// would land outside [0, R) are not written (the Python wrapper reports them).
void PoolWriteCpu(const PoolWriteDims& dims, const uint8_t* records /*[L,S,n,W]*/,
                  const int32_t* start /*[S]*/, const int32_t* count /*[S]*/,
                  uint8_t* host_pool /*[L,S,R,W]*/);

}  // namespace hisparse

#endif  // HISPARSE_FFI_POOL_WRITE_H_

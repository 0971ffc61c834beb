// What every op shares and needs no framework: included by the raw-pointer
// code, the CUDA kernels and the XLA handlers alike.
#ifndef HISPARSE_FFI_COMMON_H_
#define HISPARSE_FFI_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace hisparse {

// Whether `p` is a multiple of `bytes`: vector loads and stores of that width
// need it (XLA aligns its buffers far more; a sliced view may not be).
inline bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// "[d0, d1, ...]" of any dims that have size() and operator[] (error messages).
template <typename Dims>
std::string DimsString(const Dims& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_COMMON_H_

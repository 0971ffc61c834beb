// Host-side twin of the grouped matmul contract (grouped_matmul.h) for the
// standalone CUDA check and the benchmark: bfloat16 and fp8 e4m3 encodings,
// the clamped group layout, and one output element in double precision with
// the contract's rounding bound. Harness code only: no CUDA.
#ifndef HISPARSE_FFI_TESTS_GROUPED_MATMUL_ORACLE_H_
#define HISPARSE_FFI_TESTS_GROUPED_MATMUL_ORACLE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "number_formats.h"

namespace grouped_matmul_oracle {

using number_formats::Bf16ToFloat;
using number_formats::FloatToBf16;
using number_formats::Fp8ToDouble;

// [offset_e, offset_e + rows_e) of each group after the contract's clamping;
// the last entry is where the rows of no group begin.
inline std::vector<int64_t> GroupStarts(const std::vector<int32_t>& sizes, int64_t rows) {
  std::vector<int64_t> starts(sizes.size() + 1, 0);
  int64_t at = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    starts[e] = at;
    at = std::min(rows, at + std::max<int64_t>(sizes[e], 0));
  }
  starts[sizes.size()] = at;
  return starts;
}

// The group of row m (sizes.size() for rows past the last group).
inline size_t GroupOf(const std::vector<int64_t>& starts, int64_t m) {
  size_t e = 0;
  while (e + 1 < starts.size() && !(m >= starts[e] && m < starts[e + 1])) ++e;
  return e;
}

struct Expected {
  double value = 0;  // the exact y (0 for rows of no group)
  double bound = 0;  // (K + 4) 2^-23 |scale| sum |x w|; 0 for rows of no group
};

// One element of y in double precision. x: [M, K] bf16 bits; w: [E, N, K]
// bf16 bits (fp8 = false) or e4m3 codes; scale: [E, N].
inline Expected ExpectedElement(const uint16_t* x, const void* w, bool fp8, const float* scale, int64_t n_dim,
                                int64_t k_dim, const std::vector<int64_t>& starts, int64_t m, int64_t n) {
  Expected out;
  const size_t e = GroupOf(starts, m);
  if (e + 1 >= starts.size()) return out;
  double sum = 0, magnitude = 0;
  const int64_t row = (static_cast<int64_t>(e) * n_dim + n) * k_dim;
  for (int64_t k = 0; k < k_dim; ++k) {
    const double xv = Bf16ToFloat(x[m * k_dim + k]);
    const double wv = fp8 ? Fp8ToDouble(static_cast<const uint8_t*>(w)[row + k])
                          : Bf16ToFloat(static_cast<const uint16_t*>(w)[row + k]);
    sum += xv * wv;
    magnitude += std::fabs(xv * wv);
  }
  const double s = scale[e * n_dim + n];
  out.value = sum * s;
  out.bound = (k_dim + 4) * std::ldexp(1.0, -23) * std::fabs(s) * magnitude;
  return out;
}

}  // namespace grouped_matmul_oracle

#endif  // HISPARSE_FFI_TESTS_GROUPED_MATMUL_ORACLE_H_

// Host-side bfloat16 and fp8 e4m3fn encodings for the standalone CUDA checks and benchmarks (their
// oracles read the kernels' operands in double precision). Harness code only: no CUDA.
#ifndef HISPARSE_FFI_TESTS_NUMBER_FORMATS_H_
#define HISPARSE_FFI_TESTS_NUMBER_FORMATS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace number_formats {

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

// Round to nearest even (finite inputs).
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The value of an e4m3fn code (the NaN codes 0x7f / 0xff give NaN; subnormals exact).
inline double Fp8ToDouble(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 0xf && mantissa == 7) return std::nan("");
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

}  // namespace number_formats

#endif  // HISPARSE_FFI_TESTS_NUMBER_FORMATS_H_

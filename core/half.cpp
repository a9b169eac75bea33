#include "core/half.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace hg {

f16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xffu)  // inf, or NaN with a quiet bit so it cannot become inf
    return f16_t{static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u))};

  const int32_t e = static_cast<int32_t>(exponent) - 127 + 15;  // re-biased exponent
  if (e >= 31) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};
  if (e <= 0) {
    // Half subnormal: value / 2^-24, rounded. Below 2^-25 everything rounds to zero.
    if (e < -10) return f16_t{static_cast<uint16_t>(sign)};
    mantissa |= 0x800000u;  // the implicit leading 1
    const int shift = 14 - e;
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_mantissa & 1u))) ++half_mantissa;
    return f16_t{static_cast<uint16_t>(sign | half_mantissa)};  // a carry lands on the smallest normal
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry may round up to inf: correct
  return f16_t{static_cast<uint16_t>(half)};
}

float half_to_float(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13);
  else bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace hg

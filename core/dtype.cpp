#include "core/dtype.hpp"

#include <cstring>

#include "core/error.hpp"

namespace hg {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
  }
  fail("dtype_size", "unknown dtype code ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
  }
  return "unknown-dtype";
}

bf16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the top payload bits, force the quiet bit so that
    // truncating a payload living only in the low bits cannot yield infinity.
    return bf16_t{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate.
  // Overflow of the largest finite values carries into the exponent and gives +-inf, as it should.
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return bf16_t{static_cast<uint16_t>(bits >> 16)};
}

float bf16_to_float(bf16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace hg

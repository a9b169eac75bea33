#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hg {

// Element types. Arithmetic runs in F32/F64; BF16/F16 are storage types that
// the fused CUDA kernels read and write (math stays in float32).
enum class DType { F32, F64, BF16, F16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

// The dtype arithmetic on `storage` runs in: F64 for F64, else F32.
inline DType math_dtype(DType storage) { return storage == DType::F64 ? DType::F64 : DType::F32; }

// Storage of bfloat16 / half on the host: raw 16-bit patterns.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

// Round-to-nearest-even float -> bfloat16, NaN stays NaN.
bf16_t float_to_bf16(float f);
float bf16_to_float(bf16_t h);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16_t>() {
  return DType::F16;
}

}  // namespace hg

#pragma once
// float32 <-> storage element conversions for kernels templated on the
// storage type (float or bf16): exact widening, round-to-nearest-even narrowing.
#include <cuda_bf16.h>

namespace hg::gpu {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace hg::gpu

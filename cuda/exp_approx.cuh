#pragma once
// e^x and 2^x as the SFU's one instruction, ex2.approx.ftz (relative error
// about 2^-22; results below 2^-126 flush to 0, far below what a bf16 or f32
// probability next to its row's 1 / sum can hold). expf compiles to about
// nine instructions (range reduction and a subnormal fix-up): in a pass that
// takes an exponential of every element of a row already on chip (softmax,
// the classifier's row pass, attention) that is most of the pass's
// instructions. 2^0 is exactly 1, so a term equal to its row max still adds
// exactly 1 when the difference is taken before the scaling
// (exp_approx(v - m)).
#include <cuda_runtime.h>

namespace hg::gpu {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// e^x as 2^(x log2 e): the product's rounding is a relative 2^-24 of x in
// the exponent, 2^-24 |x| relative in the result.
__device__ __forceinline__ float exp_approx(float x) { return exp2_approx(x * kLog2e); }

}  // namespace hg::gpu

#pragma once
// One AdamW element update, shared by the per-tensor kernel
// (cuda/optim_kernels.cu) and the multi-tensor one (cuda/multi_tensor_adamw.cu).
// Every operation is an explicitly rounded intrinsic, so the compiler cannot
// contract one kernel's copy into other fused multiply-adds than the other's:
// both kernels give the same bits for the same inputs, whatever code surrounds
// the call.
#include <cuda_runtime.h>

namespace hg::gpu {

struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2;
};

// p, m, v updated in place from the gradient g (already clipped).
__device__ __forceinline__ void adamw_element(float g, float& p, float& m, float& v, const AdamWScalars& s) {
  p = __fmaf_rn(-__fmul_rn(s.lr, s.weight_decay), p, p);  // decoupled decay uses the pre-update value
  m = __fmaf_rn(s.beta1, m, __fmul_rn(1.0f - s.beta1, g));
  v = __fmaf_rn(s.beta2, v, __fmul_rn(__fmul_rn(1.0f - s.beta2, g), g));
  const float denominator = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, s.bias_correction2)), s.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.lr, __fdiv_rn(m, s.bias_correction1)), denominator));
}

}  // namespace hg::gpu

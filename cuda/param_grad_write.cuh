#pragma once
// The last store of a LayerNorm parameter gradient column (dgamma, dbeta):
// the column sum, or, accumulating (gpu::ParamGradWrite::Accumulate), that
// same sum added once to what the gradient holds. One float32 add of the two
// float32 values the separate elementwise add (grad + dgamma) would take,
// so the result is bitwise that composition's, without its launch.
namespace hg::gpu {

__device__ __forceinline__ void write_param_grad(float* out, float sum, bool accumulate) {
  *out = accumulate ? *out + sum : sum;
}

}  // namespace hg::gpu

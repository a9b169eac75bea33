#pragma once
// Launch API of the fused residual add + LayerNorm kernels
// (cuda/residual_layernorm.cu). Plain C++: ops/residual_layernorm.cpp calls
// these for CUDA tensors in fused mode after validating every input and
// allocating every output.
#include "core/tensor.hpp"
#include "cuda/layernorm_kernels.hpp"

namespace hg::gpu {

// Which kernels the two calls below run: 16-byte aligned rows of
// 1 <= D <= 16384 the resident LayerNorm rows (cuda/layernorm_residual.cuh;
// docs/residual_layernorm.md, "Resident rows"), any other rows the
// one-block-per-row kernels of cuda/residual_layernorm.cu (any D).
enum class ResidualLnKernel { ResidentRows, OneBlockPerRow };

// x, r, h, y: (rows, D), all F32 or all BF16; gamma, beta (D,) F32; mean,
// rstd (rows,) F32. h = x + r (rounded to the storage dtype), y = LN(h) of
// that stored h, statistics in float32 (corrected two-pass mean). h may be
// x or r (in place).
void residual_layernorm_forward_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                      float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);

// dh = dh_in + LN_backward(dy) in one pass (dh_in may be nullptr: no residual
// gradient; dh may be *dh_in). dy, h, dh, *dh_in: (rows, D) of h's dtype; dgamma, dbeta (D,)
// F32, written as `write` says (cuda/layernorm_kernels.hpp), summed
// deterministically (per-block partials, then a fixed-order column sum; no
// float atomics).
void residual_layernorm_backward_fused(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                       Tensor& dbeta, ParamGradWrite write = ParamGradWrite::Overwrite);

// y, mean and rstd of an h that residual_layernorm_forward_fused stored,
// again (activation recomputation): its kernels without the add, chosen as
// it chooses them (the resident rows where h and y are 16-byte aligned rows
// of D <= 16384), so y is bitwise the forward's wherever the forward's x and
// r were aligned like h (whole tensors are). h, y: (rows, D) of one dtype.
void residual_layernorm_output_fused(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                     Tensor& mean, Tensor& rstd);

// The same with the kernels named: OneBlockPerRow runs those on any rows
// (tests compare them with the resident rows); ResidentRows is the
// production choice above.
void residual_layernorm_forward_fused(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                      float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd,
                                      ResidualLnKernel kernel);
void residual_layernorm_backward_fused(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                       Tensor& dbeta, ResidualLnKernel kernel,
                                       ParamGradWrite write = ParamGradWrite::Overwrite);
void residual_layernorm_output_fused(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                     Tensor& mean, Tensor& rstd, ResidualLnKernel kernel);

// The resident rows (cuda/layernorm.cu), for the calls above: runs the case
// and returns true where it qualifies (16-byte aligned rows of
// 1 <= D <= 16384; the backward without dh_in is layernorm_backward_fused),
// else launches nothing and returns false. Same arguments and aliasing as
// above. The backward holds dh_in in registers or reads it as it stores dh
// as `memory`'s entry of ln_residual_backward_entry (cuda/layernorm_table.hpp)
// says; the production calls pass device_memory_system(), tests run both
// memory systems' entries on any GPU.
bool residual_layernorm_forward_resident(const Tensor& x, const Tensor& r, const Tensor& gamma, const Tensor& beta,
                                         float eps, Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd);
bool residual_layernorm_output_resident(const Tensor& h, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                        Tensor& mean, Tensor& rstd);
bool residual_layernorm_backward_resident(const Tensor& dy, const Tensor* dh_in, const Tensor& h, const Tensor& gamma,
                                          const Tensor& mean, const Tensor& rstd, Tensor& dh, Tensor& dgamma,
                                          Tensor& dbeta, ParamGradWrite write, MemorySystem memory);

}  // namespace hg::gpu

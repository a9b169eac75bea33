#pragma once
#include "core/backend.hpp"
#include "core/matmul_shape.hpp"

namespace hg {

// The device-independent rules of Backend::gemm, shared by every backend so
// they reject the same calls with the same messages: operands defined and on
// one device, a and b of one dtype, out of that dtype or F32 for BF16 inputs,
// the tensors each epilogue needs present with the right shapes (and none it
// would ignore), epilogues on 2-D operands only. Returns the product's shape.
// Device-specific dtype limits stay with the backend.
MatmulShape check_gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& args, const char* op);

}  // namespace hg

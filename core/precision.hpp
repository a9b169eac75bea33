#pragma once
#include <string>

#include "core/device.hpp"
#include "core/dtype.hpp"

namespace hg {

// How a model trains (docs/mixed_precision.md):
//   FP32: every tensor f32.
//   BF16: master weights, their gradients and the optimizer state stay f32;
//         the GEMMs read a bf16 copy of each weight matrix; activations and
//         their gradients are bf16; every reduction accumulates in f32.
// BF16 runs on CUDA only; the CPU always trains in FP32.
enum class Precision { FP32, BF16 };

const char* precision_name(Precision p);             // "fp32" / "bf16"
Precision parse_precision(const std::string& name);  // throws hg::Error naming what is allowed

// BF16 on a GPU with bf16 tensor cores (sm_80 and newer), FP32 otherwise.
Precision default_precision(Device device);

// The storage dtype of activations under `p`.
inline DType activation_dtype(Precision p) { return p == Precision::BF16 ? DType::BF16 : DType::F32; }

// Throws hg::Error when `p` cannot run on `device` (BF16 on the CPU, or on a GPU older than sm_80).
void check_precision_supported(Precision p, Device device, const char* op);

}  // namespace hg

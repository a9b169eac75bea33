#include "core/precision.hpp"

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"

namespace hg {

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  fail("parse_precision", "unknown precision '", name, "'; allowed: fp32, bf16");
}

Precision default_precision(Device device) {
  if (device == Device::CUDA && gpu::compute_capability() >= 80) return Precision::BF16;
  return Precision::FP32;
}

void check_precision_supported(Precision p, Device device, const char* op) {
  if (p == Precision::FP32) return;
  HG_CHECK(device == Device::CUDA, op,
           "bf16 precision runs only on CUDA; the CPU trains in fp32 (use --precision fp32)");
  const int cc = gpu::compute_capability();
  HG_CHECK(cc >= 80, op, "bf16 precision needs bf16 tensor cores (sm_80 or newer); this GPU is sm_", cc);
}

}  // namespace hg

#pragma once
// Internal to ops/: which implementation an op call took, at spdlog's debug
// level (`--log-level debug` or HG_LOG_LEVEL=debug); free when that level is off.
#include <spdlog/spdlog.h>

#include "core/tensor.hpp"

namespace hg {

inline void log_dispatch(const char* op, const char* path, const Tensor& x) {
  if (spdlog::should_log(spdlog::level::debug)) spdlog::debug("{}: {} path for {}", op, path, x.describe());
}

// The path name of a call on `x` under the current kernel mode.
inline const char* dispatch_path(const Tensor& x, bool unfused) {
  if (unfused) return "unfused (primitive passes)";
  return x.is_cuda() ? "CUDA fused" : "CPU fused";
}

}  // namespace hg

#pragma once

namespace hg {

// Which implementation the ops pick: one fused kernel / Eigen pass, or the
// same math composed from primitive map/zip/reduce passes (miniTorch style).
enum class KernelMode { Fused, Unfused };

KernelMode kernel_mode();
void set_kernel_mode(KernelMode mode);
const char* kernel_mode_name(KernelMode mode);

// Sets the mode for a scope and restores the previous one on exit.
class KernelModeScope {
 public:
  explicit KernelModeScope(KernelMode mode) : previous_(kernel_mode()) { set_kernel_mode(mode); }
  ~KernelModeScope() { set_kernel_mode(previous_); }
  KernelModeScope(const KernelModeScope&) = delete;
  KernelModeScope& operator=(const KernelModeScope&) = delete;

 private:
  KernelMode previous_;
};

}  // namespace hg

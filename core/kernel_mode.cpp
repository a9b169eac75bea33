#include "core/kernel_mode.hpp"

#include <atomic>

namespace hg {

namespace {
std::atomic<KernelMode> g_mode{KernelMode::Fused};
}

KernelMode kernel_mode() { return g_mode.load(std::memory_order_relaxed); }

void set_kernel_mode(KernelMode mode) { g_mode.store(mode, std::memory_order_relaxed); }

const char* kernel_mode_name(KernelMode mode) { return mode == KernelMode::Fused ? "fused" : "unfused"; }

}  // namespace hg

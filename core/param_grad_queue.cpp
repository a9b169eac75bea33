#include "core/param_grad_queue.hpp"

#include <atomic>

namespace hg {
namespace {
std::atomic<ParamGradQueue> g_queue{nullptr};
}  // namespace

void set_param_grad_queue(ParamGradQueue queue) { g_queue.store(queue); }

void run_param_grad_work(std::function<void()> work) {
  const ParamGradQueue queue = g_queue.load();
  if (queue == nullptr || !queue(work)) work();
}

}  // namespace hg

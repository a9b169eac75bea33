#include "core/parallel.hpp"

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/whole_number.hpp"

namespace hg {
namespace {

constexpr long kMaxThreads = 4096;

int threads_from_environment() {
  const char* text = std::getenv("HG_NUM_THREADS");
  if (text == nullptr || *text == '\0') {
    const unsigned cores = std::thread::hardware_concurrency();
    return cores == 0 ? 1 : static_cast<int>(cores);
  }
  const std::optional<long> n = parse_whole_number(text, 1, kMaxThreads);
  HG_CHECK(n.has_value(), "HG_NUM_THREADS", "'", text, "' is not a thread count: allowed 1..", kMaxThreads,
           " (unset it to use every core)");
  return static_cast<int>(*n);
}

std::atomic<int>& configured() {
  static std::atomic<int> n{threads_from_environment()};
  return n;
}

}  // namespace

int num_threads() { return configured().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  HG_CHECK(n >= 1 && n <= kMaxThreads, "set_num_threads", "thread count ", n, " is not allowed: 1..", kMaxThreads);
  configured().store(n, std::memory_order_relaxed);
}

}  // namespace hg

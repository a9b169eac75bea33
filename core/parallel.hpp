#pragma once

#include <algorithm>
#include <cstdint>

// How many threads the CPU backend may use, like torch.set_num_threads /
// OMP_NUM_THREADS. The default is HG_NUM_THREADS when set, else every core.
namespace hg {

int num_threads();
void set_num_threads(int n);  // n >= 1, else hg::Error naming the value

namespace detail {
using TaskFn = void (*)(const void* body, int64_t task);
// Runs fn(body, t) for t in [0, tasks) on the calling thread plus up to
// threads - 1 pool workers (core/parallel.cpp); rethrows a task's exception.
void run_tasks(int64_t tasks, int threads, TaskFn fn, const void* body);
}  // namespace detail

// Runs body(task) for every task in [0, tasks) on up to num_threads()
// threads. Callers cut their work into tasks from the problem's shape alone,
// never from the thread count, and combine per-task results in task order:
// results are then bitwise the same at any thread count. work is the number
// of elements (or flops) in all: below kSerialWork starting threads costs
// more than it saves.
constexpr int64_t kSerialWork = int64_t(1) << 15;

template <class Body>
void parallel_for(int64_t tasks, int64_t work, const Body& body) {
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), tasks));
  if (threads > 1 && work >= kSerialWork) {
    detail::run_tasks(
        tasks, threads, [](const void* b, int64_t t) { (*static_cast<const Body*>(b))(t); }, &body);
    return;
  }
  for (int64_t t = 0; t < tasks; ++t) body(t);
}

// Number of fixed-size pieces of `chunk` covering n (at least 1).
inline int64_t pieces(int64_t n, int64_t chunk) { return std::max<int64_t>(1, (n + chunk - 1) / chunk); }

// body(begin, end) for the pieces of `chunk` elements covering [0, n), on
// parallel_for's threads: the pieces depend on n alone, so per-piece results
// combined in piece order are the same at any thread count.
template <class Body>
void for_pieces(int64_t n, int64_t chunk, const Body& body) {
  parallel_for(pieces(n, chunk), n, [&](int64_t p) { body(p * chunk, std::min(n, (p + 1) * chunk)); });
}

}  // namespace hg

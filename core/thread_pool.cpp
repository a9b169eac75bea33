// The CPU backend's worker threads: hg::parallel_for's tasks run on the
// calling thread plus pool workers, which take task indices from one atomic
// counter. A worker that runs out of work spins briefly for the next call,
// then sleeps on a condition variable. Why not OpenMP: libgomp's idle threads
// spin at every barrier by default, and a program cannot change that for
// itself (OMP_WAIT_POLICY is read at load time); on a shared 2-core VM that
// made two threads 9x slower than one (docs/cpu.md). Workers are started on
// first use, up to the largest thread count asked, and live for the process.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/parallel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HG_CPU_RELAX() _mm_pause()
#else
#define HG_CPU_RELAX() std::this_thread::yield()
#endif

namespace hg::detail {
namespace {

// About 20-100 us of polling before a worker sleeps: long enough to catch
// the next op of a training step, short enough not to steal a shared core.
constexpr int kSpins = 2000;

thread_local bool t_in_worker = false;

class Pool {
 public:
  void run(int64_t tasks, int threads, TaskFn fn, const void* body) {
    // A task that calls parallel_for, or a second user thread: run serially.
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (t_in_worker || !busy.owns_lock()) {
      for (int64_t t = 0; t < tasks; ++t) fn(body, t);
      return;
    }
    grow(threads - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = fn;
      body_ = body;
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      helpers_ = threads - 1;
      pending_ = threads - 1;
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
    }
  }

  void work() {
    for (int64_t t = next_.fetch_add(1, std::memory_order_relaxed); t < tasks_;
         t = next_.fetch_add(1, std::memory_order_relaxed)) {
      try {
        fn_(body_, t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void loop(int index) {
    t_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      for (int i = 0; i < kSpins && generation_.load(std::memory_order_acquire) == seen; ++i) HG_CPU_RELAX();
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
      seen = generation_.load(std::memory_order_relaxed);
      if (index >= helpers_) continue;  // not needed for this call
      lock.unlock();
      work();
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mutex_;  // one parallel call at a time
  std::mutex mutex_;      // guards the call's description below
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  TaskFn fn_ = nullptr;
  const void* body_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int helpers_ = 0, pending_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

// Never destroyed: its workers block forever and die with the process.
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

}  // namespace

void run_tasks(int64_t tasks, int threads, TaskFn fn, const void* body) { pool().run(tasks, threads, fn, body); }

}  // namespace hg::detail

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

// One parallel call, as a worker copies it.
struct Job {
  TaskFn fn = nullptr;
  const void* body = nullptr;
  int64_t tasks = 0;
  int joining_workers = 0;  // pool workers that take tasks of this call
  uint32_t generation = 0;
};

// Tasks are claimed from `claim_`, which holds the call's generation (high
// 32 bits) and the next task index (low 32 bits): a worker that wakes late,
// after its call ended, finds the generation changed or no index left and
// claims nothing. So the caller waits only for tasks that were started, never
// for a worker to be scheduled: on a machine busy with other jobs a sleeping
// worker costs nothing (waiting for every worker to check in made two threads
// slower than one there).
class Pool {
 public:
  void run(int64_t tasks, int threads, TaskFn fn, const void* body) {
    // A task that calls parallel_for, a second user thread, or more tasks
    // than the claim counter holds: run serially.
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (t_in_worker || !busy.owns_lock() || tasks >= (int64_t(1) << 31)) {
      for (int64_t t = 0; t < tasks; ++t) fn(body, t);
      return;
    }
    grow(threads - 1);
    Job job{fn, body, tasks, threads - 1, 0};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.generation = ++generation_;
      completed_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      claim_.store(uint64_t(job.generation) << 32, std::memory_order_release);
      publish(job);
    }
    wake_.notify_all();
    work(job);
    for (int i = 0; i < kSpins && completed_.load(std::memory_order_acquire) < tasks; ++i) HG_CPU_RELAX();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return completed_.load(std::memory_order_acquire) >= tasks; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
    }
  }

  // Claims and runs tasks of `job` until none is left (or the call is over).
  void work(const Job& job) {
    for (;;) {
      uint64_t cur = claim_.load(std::memory_order_acquire);
      do {
        if (uint32_t(cur >> 32) != job.generation || int64_t(cur & 0xffffffffu) >= job.tasks) return;
      } while (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel));
      try {
        job.fn(job.body, int64_t(cur & 0xffffffffu));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (completed_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.tasks) {
        std::lock_guard<std::mutex> lock(mutex_);  // so the caller cannot miss the notification
        done_.notify_all();
      }
    }
  }

  // The job is published as a seqlock (odd sequence = being written), so a
  // polling worker reads it without the mutex: with many workers waking at
  // once, the mutex was contended and its waiters slept in the kernel, one
  // wake-up after another.
  void publish(const Job& job) {
    const uint64_t seq = sequence_.load(std::memory_order_relaxed);
    sequence_.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    fn_.store(job.fn, std::memory_order_relaxed);
    body_.store(job.body, std::memory_order_relaxed);
    tasks_.store(job.tasks, std::memory_order_relaxed);
    joining_workers_.store(job.joining_workers, std::memory_order_relaxed);
    generation_seen_.store(job.generation, std::memory_order_relaxed);
    sequence_.store(seq + 2, std::memory_order_release);
  }

  // The latest job, or false while it is being written.
  bool read(Job& job) const {
    const uint64_t seq = sequence_.load(std::memory_order_acquire);
    if (seq & 1) return false;
    job = {fn_.load(std::memory_order_relaxed), body_.load(std::memory_order_relaxed),
           tasks_.load(std::memory_order_relaxed), joining_workers_.load(std::memory_order_relaxed),
           generation_seen_.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    return sequence_.load(std::memory_order_relaxed) == seq;
  }

  void loop(int index) {
    t_in_worker = true;
    uint32_t seen = 0;
    Job job;
    for (;;) {
      bool found = false;
      for (int i = 0; i < kSpins && !found; ++i) {
        found = read(job) && job.generation != seen;
        if (!found) HG_CPU_RELAX();
      }
      if (!found) {  // sleep until the next call
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        lock.unlock();
        while (!read(job)) HG_CPU_RELAX();
      }
      seen = job.generation;
      if (index < job.joining_workers) work(job);
    }
  }

  std::mutex run_mutex_;  // one parallel call at a time
  std::mutex mutex_;      // guards generation_, error_
  std::condition_variable wake_, done_;
  uint32_t generation_ = 0;
  // The published job (publish / read): written only by the caller holding run_mutex_.
  std::atomic<uint64_t> sequence_{0};
  std::atomic<TaskFn> fn_{nullptr};
  std::atomic<const void*> body_{nullptr};
  std::atomic<int64_t> tasks_{0};
  std::atomic<int> joining_workers_{0};
  std::atomic<uint32_t> generation_seen_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> completed_{0};
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

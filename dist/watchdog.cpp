#include "dist/watchdog.hpp"

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "dist/world.hpp"

namespace hg::dist {
namespace {

using Clock = std::chrono::steady_clock;

double initial_timeout() {
  const char* v = std::getenv("HG_COMM_TIMEOUT");
  return v ? std::atof(v) : 300.0;
}

struct Dog {
  std::mutex mutex;
  std::condition_variable changed;
  bool armed = false;
  Clock::time_point deadline;
  const char* what = "";
  long long step = -1;
  double timeout = initial_timeout();
  bool thread_started = false;

  // Sleeps until the armed deadline passes, then stops this process. Never
  // calls MPI (initialised SERIALIZED: only the main thread may): a rank that
  // exits without MPI_Finalize makes mpirun stop every other rank.
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      if (!armed) {
        changed.wait(lock);
        continue;
      }
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout && armed && Clock::now() >= deadline) {
        const World& w = world();
        std::fprintf(stderr,
                     "%s: error: rank %d of %d (%s): %s did not complete within %g s%s; another rank has died or "
                     "hangs; stopping every rank (raise the limit with --comm-timeout or HG_COMM_TIMEOUT)\n",
                     program_invocation_short_name, w.rank, w.size, w.host.c_str(), what, timeout,
                     step >= 0 ? (" at step " + std::to_string(step)).c_str() : "");
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  }
};

Dog& dog() {
  static Dog* d = new Dog;  // never destroyed: its thread runs until the process ends
  return *d;
}

}  // namespace

void set_comm_timeout(double seconds) {
  std::lock_guard<std::mutex> lock(dog().mutex);
  dog().timeout = seconds;
}

double comm_timeout() {
  std::lock_guard<std::mutex> lock(dog().mutex);
  return dog().timeout;
}

void set_watch_step(long long step) {
  std::lock_guard<std::mutex> lock(dog().mutex);
  dog().step = step;
}

Watch::Watch(const char* what) {
  Dog& d = dog();
  if (!world().distributed()) return;
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.timeout <= 0) return;
  if (!d.thread_started) {
    std::thread([&d] { d.run(); }).detach();
    d.thread_started = true;
  }
  d.armed = true;
  d.what = what;
  d.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(d.timeout));
  armed_ = true;
  d.changed.notify_all();
}

Watch::~Watch() {
  if (!armed_) return;
  Dog& d = dog();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.armed = false;
  d.changed.notify_all();
}

}  // namespace hg::dist

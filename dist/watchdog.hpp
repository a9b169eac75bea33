#pragma once
// A collective that does not finish in time means a peer died or hangs: the
// watchdog then aborts every rank with a clear message instead of waiting
// forever. One thread per process; a Watch is armed for the duration of one
// blocking wait (an MPI wait, a GPU synchronisation that follows NCCL work).
#include <string>

namespace hg::dist {

// Seconds a blocking collective may take (0: no limit). Default 300, or
// HG_COMM_TIMEOUT; train --comm-timeout sets it.
void set_comm_timeout(double seconds);
double comm_timeout();

class Watch {
 public:
  explicit Watch(const char* what);  // arms the watchdog (no-op in one process or with no limit)
  ~Watch();                          // disarms it
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  bool armed_ = false;
};

// The step the program is in, named in the timeout message.
void set_watch_step(long long step);

}  // namespace hg::dist

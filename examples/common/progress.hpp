#pragma once
// Progress of long work (training steps, benchmark cases): elapsed time, ETA,
// rate and, for training, the current loss. On a terminal it is one redrawn
// status line (core/logging.hpp); when stdout is piped, a plain info line
// every `print_every` units and at the end.
#include <chrono>
#include <cstdint>
#include <string>

namespace hg::cli {

class Progress {
 public:
  // total: units of work to do (steps, cases); start_at: units already done
  // (a resumed run). rate_unit names what the rate counts ("tok", "cases").
  Progress(std::string what, int64_t total, int64_t start_at, std::string rate_unit, int64_t print_every);

  // `done` units finished; `rate_count` rate units processed since the last
  // update (tokens of this step, or 1 case); `detail` is appended (e.g. "loss 0.1234").
  void update(int64_t done, double rate_count, const std::string& detail = "");
  // Leaves the terminal on a fresh line.
  void finish();

  double elapsed_s() const;

 private:
  std::string line(int64_t done, const std::string& detail) const;

  std::string what_, rate_unit_;
  int64_t total_, start_at_, print_every_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  double rate_count_ = 0;  // since start
};

// "1h02m", "3m07s", "12.3s"
std::string format_duration(double seconds);

}  // namespace hg::cli

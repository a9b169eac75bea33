#pragma once
// A per-step CSV log that survives a crash: every row is flushed to the OS as
// it is written, so a killed run leaves whole rows (at most one partial last
// line). Reopened for a resumed run it keeps the header and the rows of steps
// 1..resume_step, drops later or broken rows (the resumed run writes them
// again), and continues the file.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace hg::cli {

class StepLog {
 public:
  // resume_step < 0: a new log (truncated, header written). Otherwise the
  // existing log is cut back to steps <= resume_step; a missing file starts a
  // new one with a warning. A file whose header differs is an hg::Error.
  StepLog(std::string path, std::string header, int64_t resume_step);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Appends one row (without the newline) and flushes; a failed write throws.
  void row(const std::string& line);

  // The rows kept from before the resume, split into fields (for plots).
  const std::vector<std::vector<std::string>>& kept_rows() const { return kept_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, header_;
  FILE* file_ = nullptr;
  std::vector<std::vector<std::string>> kept_;
};

std::vector<std::string> split_csv_line(const std::string& line);

}  // namespace hg::cli

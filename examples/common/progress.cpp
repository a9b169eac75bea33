#include "examples/common/progress.hpp"

#include <cmath>
#include <cstdio>
#include <utility>

#include "core/logging.hpp"

namespace hg::cli {

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return buf;
}

Progress::Progress(std::string what, int64_t total, int64_t start_at, std::string rate_unit, int64_t print_every)
    : what_(std::move(what)),
      rate_unit_(std::move(rate_unit)),
      total_(total),
      start_at_(start_at),
      print_every_(print_every > 0 ? print_every : 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::line(int64_t done, const std::string& detail) const {
  const double elapsed = elapsed_s();
  const double fraction_left =
      done > start_at_ ? double(total_ - done) / double(done - start_at_) : std::nan("");  // time per unit so far
  const double rate = elapsed > 0 ? rate_count_ / elapsed : 0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %lld/%lld (%3.0f%%)  elapsed %s  ETA %s  %.0f %s/s%s%s", what_.c_str(),
                static_cast<long long>(done), static_cast<long long>(total_),
                total_ > 0 ? 100.0 * double(done) / double(total_) : 100.0, format_duration(elapsed).c_str(),
                format_duration(elapsed * fraction_left).c_str(), rate, rate_unit_.c_str(), detail.empty() ? "" : "  ",
                detail.c_str());
  return buf;
}

void Progress::update(int64_t done, double rate_count, const std::string& detail) {
  rate_count_ += rate_count;
  const auto now = std::chrono::steady_clock::now();
  if (status_line_enabled()) {
    // Redraw at most ~10 times a second: a terminal is slow to scroll.
    if (done == total_ || now - last_draw_ > std::chrono::milliseconds(100)) {
      set_status_line(line(done, detail));
      last_draw_ = now;
    }
  } else if (done % print_every_ == 0 || done == total_) {
    spdlog::info("{}", line(done, detail));
  }
}

void Progress::finish() { end_status_line(); }

}  // namespace hg::cli

#include "examples/common/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/error.hpp"

namespace hg::cli {
namespace {

constexpr const char* kRecord = "schedule";  // lr, warmup, steps, from, from_lr
constexpr const char* kOp = "train schedule";

// Cosine from `high` at step `begin` down to `low` at step `end`.
double cosine(double high, double low, int64_t begin, int64_t end, int64_t step) {
  const double t = static_cast<double>(step - begin) / static_cast<double>(std::max<int64_t>(1, end - begin));
  return low + (high - low) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t)));
}

}  // namespace

double LrSchedule::at(int64_t step) const {
  const double floor = 0.1 * lr;
  if (from >= 0 && step >= from) return cosine(from_lr, floor, from, steps, step);
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  return cosine(lr, floor, warmup, steps, step);
}

LrSchedule LrSchedule::extended(int64_t start, int64_t new_steps) const {
  LrSchedule s = *this;
  s.steps = new_steps;
  // Within the warm-up the plain schedule with the new horizon is the same
  // rate up to the warm-up's end, and continuous after it.
  if (from < 0 && start <= warmup) return s;
  s.from = start;
  s.from_lr = at(start);
  return s;
}

std::string schedule_path(const std::string& checkpoint) { return checkpoint + ".schedule"; }

void save_schedule(const std::string& checkpoint, const LrSchedule& s) {
  const std::vector<double> v{s.lr, double(s.warmup), double(s.steps), double(s.from), s.from_lr};
  write_checkpoint_file(schedule_path(checkpoint), {{kRecord, Tensor::from_vector(v, {int64_t(v.size())}, DType::F64)}},
                        kOp);
}

std::optional<LrSchedule> load_schedule(const std::string& checkpoint) {
  const std::string path = schedule_path(checkpoint);
  if (!std::ifstream(path)) return std::nullopt;
  const auto records = read_checkpoint_file(path, kOp);
  const auto it = records.find(kRecord);
  HG_CHECK(it != records.end() && it->second.numel() == 5, kOp, path, ": not a schedule file (needs a 5-value '",
           kRecord, "' record)");
  const std::vector<double> v = it->second.to_vector();
  LrSchedule s;
  s.lr = v[0];
  s.warmup = static_cast<int64_t>(v[1]);
  s.steps = static_cast<int64_t>(v[2]);
  s.from = static_cast<int64_t>(v[3]);
  s.from_lr = v[4];
  HG_CHECK(std::isfinite(s.lr) && s.lr > 0 && s.warmup >= 0 && s.steps >= 1 && s.from >= -1 && s.from <= s.steps &&
               std::isfinite(s.from_lr),
           kOp, path, ": values out of range (lr ", s.lr, ", warmup ", s.warmup, ", steps ", s.steps, ", from ", s.from,
           ")");
  return s;
}

}  // namespace hg::cli

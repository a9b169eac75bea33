#include "examples/common/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/error.hpp"

namespace hg::cli {
namespace {

// lr, warmup, steps, from, from_lr, then the kind's code (0 cosine, 1 linear,
// 2 constant); an older train wrote the first five (a cosine schedule).
constexpr const char* kRecord = "schedule";
constexpr const char* kOp = "train schedule";
constexpr LrKind kKinds[] = {LrKind::Cosine, LrKind::Linear, LrKind::Constant};

// From `high` at step `begin` to `low` at step `end`, in the kind's shape.
double decay(LrKind kind, double high, double low, int64_t begin, int64_t end, int64_t step) {
  const double t = static_cast<double>(step - begin) / static_cast<double>(std::max<int64_t>(1, end - begin));
  switch (kind) {
    case LrKind::Cosine: return low + (high - low) * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t)));
    case LrKind::Linear: return low + (high - low) * (1.0 - std::min(1.0, t));
    case LrKind::Constant: break;
  }
  return high;
}

}  // namespace

const char* lr_kind_name(LrKind kind) {
  switch (kind) {
    case LrKind::Cosine: return "cosine";
    case LrKind::Linear: return "linear";
    case LrKind::Constant: return "constant";
  }
  return "?";
}

std::vector<std::string> lr_kind_names() {
  std::vector<std::string> names;
  for (LrKind k : kKinds) names.push_back(lr_kind_name(k));
  return names;
}

LrKind parse_lr_kind(const std::string& name) {
  for (LrKind k : kKinds)
    if (name == lr_kind_name(k)) return k;
  std::string allowed;
  for (const std::string& n : lr_kind_names()) allowed += (allowed.empty() ? "" : ", ") + n;
  fail("--lr-schedule", "'", name, "' is not a schedule; allowed: ", allowed);
}

double LrSchedule::at(int64_t step) const {
  const double floor = 0.1 * lr;
  if (from >= 0 && step >= from) return decay(kind, from_lr, floor, from, steps, step);
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  return decay(kind, lr, floor, warmup, steps, step);
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
  const double kind = static_cast<int>(s.kind);
  const std::vector<double> v{s.lr, double(s.warmup), double(s.steps), double(s.from), s.from_lr, kind};
  write_checkpoint_file(schedule_path(checkpoint), {{kRecord, Tensor::from_vector(v, {int64_t(v.size())}, DType::F64)}},
                        kOp);
}

std::optional<LrSchedule> load_schedule(const std::string& checkpoint) {
  const std::string path = schedule_path(checkpoint);
  if (!std::ifstream(path)) return std::nullopt;
  const auto records = read_checkpoint_file(path, kOp);
  const auto it = records.find(kRecord);
  HG_CHECK(it != records.end() && (it->second.numel() == 5 || it->second.numel() == 6), kOp, path,
           ": not a schedule file (needs a '", kRecord, "' record of 5 or 6 values)");
  const std::vector<double> v = it->second.to_vector();
  LrSchedule s;
  if (v.size() == 6) {
    HG_CHECK(v[5] == 0 || v[5] == 1 || v[5] == 2, kOp, path, ": schedule kind ", v[5],
             " is not 0 (cosine), 1 (linear) or 2 (constant)");
    s.kind = kKinds[static_cast<int>(v[5])];
  }
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

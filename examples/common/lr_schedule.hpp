#pragma once
// train's learning-rate schedule, and the copy of it kept next to a
// checkpoint (CHECKPOINT.schedule), so that a resumed run continues the
// schedule it was trained with instead of recomputing it from new flags.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hg::cli {

// What follows the warm-up (--lr-schedule): cosine or linear decay to
// 10% of lr at `steps`, or constant at lr.
enum class LrKind { Cosine, Linear, Constant };

// A kind's name ("cosine", "linear", "constant"), every name in that order,
// and the kind of a name (hg::Error naming the allowed ones otherwise).
const char* lr_kind_name(LrKind kind);
std::vector<std::string> lr_kind_names();
LrKind parse_lr_kind(const std::string& name);

// Linear warm-up to `lr` over `warmup` steps, then `kind`. An extended
// schedule (a resumed run given more steps) goes on from the rate `from_lr`
// it had reached at step `from`, in the same kind (decaying to the same
// floor at the new `steps`, or flat), so the rate never jumps at the resume.
struct LrSchedule {
  LrKind kind = LrKind::Cosine;
  double lr = 0;
  int64_t warmup = 0, steps = 0;
  int64_t from = -1;  // -1: not extended
  double from_lr = 0;

  double at(int64_t step) const;  // the rate of step `step` (0-based)
  // This schedule run to `new_steps` instead, from step `start` on, without a jump.
  LrSchedule extended(int64_t start, int64_t new_steps) const;
};

std::string schedule_path(const std::string& checkpoint);
// Atomic (temporary file, fsync, rename) and checksummed, like the checkpoint.
void save_schedule(const std::string& checkpoint, const LrSchedule& s);
// Empty when the checkpoint has no schedule file (written by an older train).
// A file without the kind (also an older train's) is a cosine schedule.
std::optional<LrSchedule> load_schedule(const std::string& checkpoint);

}  // namespace hg::cli

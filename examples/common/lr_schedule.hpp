#pragma once
// train's learning-rate schedule, and the copy of it kept next to a
// checkpoint (CHECKPOINT.schedule), so that a resumed run continues the
// schedule it was trained with instead of recomputing it from new flags.
#include <cstdint>
#include <optional>
#include <string>

namespace hg::cli {

// Linear warm-up to `lr` over `warmup` steps, then cosine decay to 10% of
// `lr` at `steps`. An extended schedule (a resumed run given more steps)
// decays from the rate `from_lr` it had reached at step `from` to the same
// floor at the new `steps`, so the rate never jumps at the resume.
struct LrSchedule {
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
std::optional<LrSchedule> load_schedule(const std::string& checkpoint);

}  // namespace hg::cli

// train's learning-rate schedule (examples/common/lr_schedule.hpp): each
// kind's rate at the steps that define it, extension of a resumed run
// without a jump (every kind, mid-decay, within the warm-up, twice), the
// file beside the checkpoint (the kind round-trips; an older file without
// it is cosine; a bad kind code is refused) and the names.
#include <cmath>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/error.hpp"
#include "examples/common/lr_schedule.hpp"
#include "tests/catch.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::cli::LrKind;
using hg::cli::LrSchedule;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

constexpr LrKind kAll[] = {LrKind::Cosine, LrKind::Linear, LrKind::Constant};

// lr 1, 10 warm-up steps, then 100 steps of decay (to the floor 0.1 at step 110).
LrSchedule schedule(LrKind kind) {
  LrSchedule s;
  s.kind = kind;
  s.lr = 1.0;
  s.warmup = 10;
  s.steps = 110;
  return s;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-12; }

// The largest change of the rate from one step to the next over [from, to).
double largest_step_change(const LrSchedule& s, int64_t from, int64_t to) {
  double worst = 0;
  for (int64_t k = from; k + 1 < to; ++k) worst = std::max(worst, std::abs(s.at(k + 1) - s.at(k)));
  return worst;
}

}  // namespace

TEST_CASE("LrSchedule: every kind warms up linearly to lr", "[lr_schedule]") {
  for (LrKind kind : kAll) {
    INFO(cli::lr_kind_name(kind));
    const LrSchedule s = schedule(kind);
    CHECK(near(s.at(0), 0.1));
    CHECK(near(s.at(4), 0.5));
    CHECK(near(s.at(9), 1.0));
    CHECK(near(s.at(10), 1.0));  // the first step after the warm-up: still the peak, no jump
    LrSchedule no_warmup = s;
    no_warmup.warmup = 0;
    CHECK(near(no_warmup.at(0), 1.0));
  }
}

TEST_CASE("LrSchedule: cosine, linear and constant after the warm-up", "[lr_schedule]") {
  const LrSchedule cosine = schedule(LrKind::Cosine), linear = schedule(LrKind::Linear),
                   constant = schedule(LrKind::Constant);
  // A quarter, half and all of the decay: 0.1 + 0.9 * (1 + cos(pi t)) / 2, and 0.1 + 0.9 * (1 - t).
  CHECK(near(cosine.at(35), 0.1 + 0.45 * (1 + std::cos(M_PI / 4))));
  CHECK(near(cosine.at(60), 0.55));
  CHECK(near(cosine.at(110), 0.1));
  CHECK(near(linear.at(35), 0.775));
  CHECK(near(linear.at(60), 0.55));
  CHECK(near(linear.at(109), 0.109));
  CHECK(near(linear.at(110), 0.1));
  for (int64_t k : {10, 35, 60, 109, 110, 500}) CHECK(constant.at(k) == 1.0);
  // Past --steps the decays stay at the floor (a run may stop later only when extended).
  CHECK(near(cosine.at(500), 0.1));
  CHECK(near(linear.at(500), 0.1));
  // Linear falls by the same amount every step; cosine slowest at both ends.
  CHECK(near(linear.at(20) - linear.at(21), 0.009));
  CHECK(near(linear.at(100) - linear.at(101), 0.009));
  CHECK(cosine.at(10) - cosine.at(11) < 0.001);
  CHECK(cosine.at(60) - cosine.at(61) > 0.014);
}

TEST_CASE("LrSchedule: an extended schedule goes on without a jump, for every kind", "[lr_schedule]") {
  for (LrKind kind : kAll) {
    INFO(cli::lr_kind_name(kind));
    const LrSchedule s = schedule(kind);
    // Mid-decay: from step 60 on (the resumed run's first step), down to the
    // floor at step 210 instead of 110.
    const LrSchedule e = s.extended(60, 210);
    CHECK(e.kind == kind);
    CHECK(std::abs(e.at(60) - s.at(60)) <= 1e-15);  // the rate the saved schedule had reached
    const double floor = kind == LrKind::Constant ? 1.0 : 0.1;
    CHECK(near(e.at(210), floor));
    CHECK(near(e.at(1000), floor));
    // The step before the resume (the saved schedule's) to the first after it,
    // and every step after: no change larger than the plain schedule's steepest.
    const double steepest = largest_step_change(s, 10, 120);
    CHECK(std::abs(e.at(60) - s.at(59)) <= steepest + 1e-12);
    CHECK(largest_step_change(e, 60, 300) <= steepest + 1e-12);
    // Half way from 0.55 at step 60 to the floor at 210, both decays are half way down.
    if (kind != LrKind::Constant) CHECK(near(e.at(135), 0.325));
    // Extended again, from the extension's middle.
    const LrSchedule twice = e.extended(135, 400);
    CHECK(std::abs(twice.at(135) - e.at(135)) <= 1e-15);
    CHECK(near(twice.at(400), floor));
    CHECK(largest_step_change(twice, 135, 450) <= steepest + 1e-12);
    // Within the warm-up: the plain schedule with the longer horizon.
    LrSchedule longer = s;
    longer.steps = 210;
    const LrSchedule early = s.extended(5, 210);
    for (int64_t k : {0, 5, 9, 10, 60, 150, 210}) CHECK(early.at(k) == longer.at(k));
  }
}

TEST_CASE("LrSchedule: the file beside the checkpoint records the kind; an older file is cosine", "[lr_schedule]") {
  const auto dir = test::make_temp_dir("lr_schedule");
  const std::string ck = (dir / "run.ck").string();
  CHECK(!cli::load_schedule(ck).has_value());  // no file: a checkpoint of an older train
  for (LrKind kind : kAll) {
    INFO(cli::lr_kind_name(kind));
    const LrSchedule s = schedule(kind).extended(60, 210);
    cli::save_schedule(ck, s);
    const auto back = cli::load_schedule(ck);
    REQUIRE(back.has_value());
    CHECK(back->kind == kind);
    CHECK(back->lr == s.lr);
    CHECK(back->warmup == s.warmup);
    CHECK(back->steps == s.steps);
    CHECK(back->from == s.from);
    CHECK(back->from_lr == s.from_lr);
  }
  const auto write_record = [&](const std::vector<double>& v) {
    write_checkpoint_file(cli::schedule_path(ck),
                          {{"schedule", Tensor::from_vector(v, {int64_t(v.size())}, DType::F64)}}, "test");
  };
  write_record({1.0, 10, 110, -1, 0});  // what train wrote before the kinds
  const auto old = cli::load_schedule(ck);
  REQUIRE(old.has_value());
  CHECK(old->kind == LrKind::Cosine);
  CHECK(old->at(60) == schedule(LrKind::Cosine).at(60));
  for (double code : {3.0, 1.5, -1.0}) {
    write_record({1.0, 10, 110, -1, 0, code});
    CHECK(contains(thrown_message([&] { cli::load_schedule(ck); }), "is not 0 (cosine), 1 (linear) or 2 (constant)"));
  }
  write_record({1.0, 10, 110});
  CHECK(contains(thrown_message([&] { cli::load_schedule(ck); }), "record of 5 or 6 values"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("LrSchedule: names parse both ways; a bad name is refused with the allowed list", "[lr_schedule]") {
  CHECK(cli::lr_kind_names() == std::vector<std::string>{"cosine", "linear", "constant"});
  for (LrKind kind : kAll) CHECK(cli::parse_lr_kind(cli::lr_kind_name(kind)) == kind);
  for (const char* bad : {"foo", "Cosine", "", "linear "}) {
    INFO("'" << bad << "'");
    CHECK(contains(thrown_message([&] { cli::parse_lr_kind(bad); }),
                   std::string("'") + bad + "' is not a schedule; allowed: cosine, linear, constant"));
  }
}

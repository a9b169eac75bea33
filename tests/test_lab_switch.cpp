// cuda/lab_switch.hpp: the environment value of a lab switch
// (HG_SOFTMAX_VARIANT) picks a variant only when it is one of 0 .. count-1;
// anything else is an error naming the variable and the allowed values.
// Plain C++: runs without a GPU.
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "cuda/lab_switch.hpp"
#include "tests/catch.hpp"

namespace {

constexpr const char* kVar = "HG_TEST_LAB_SWITCH";

// A fresh switch per value: the environment is read once per switch.
int read_with(const char* value) {
  if (value == nullptr) {
    unsetenv(kVar);
  } else {
    setenv(kVar, value, 1);
  }
  hg::gpu::LabSwitch lab(kVar, 5);
  const int v = lab.pick(42);
  unsetenv(kVar);
  return v;
}

}  // namespace

TEST_CASE("lab switch: unset or empty runs the production table, 0..count-1 force a variant", "[lab_switch]") {
  CHECK(read_with(nullptr) == 42);
  CHECK(read_with("") == 42);
  CHECK(read_with("0") == 0);
  CHECK(read_with("4") == 4);
}

TEST_CASE("lab switch: other values are errors naming the variable and the range", "[lab_switch]") {
  for (const char* bad : {"5", "-1", "x", "3x", "1.5", "99999999999999999999"}) {
    INFO("value '" << bad << "'");
    try {
      read_with(bad);
      FAIL("accepted");
    } catch (const hg::Error& e) {
      const std::string what = e.what();
      CHECK(what.find(kVar) != std::string::npos);
      CHECK(what.find("0..4") != std::string::npos);
      CHECK(what.find(std::string("'") + bad + "'") != std::string::npos);
    }
  }
  unsetenv(kVar);
}

TEST_CASE("lab switch: a scope forces a variant and restores the environment's", "[lab_switch]") {
  hg::gpu::LabSwitch lab(kVar, 3);
  CHECK(lab.pick(7) == 7);
  {
    hg::gpu::LabSwitchScope scope(lab, 2);
    CHECK(lab.pick(7) == 2);
  }
  CHECK(lab.pick(7) == 7);
  CHECK_THROWS_AS(hg::gpu::LabSwitchScope(lab, 3), hg::Error);
}

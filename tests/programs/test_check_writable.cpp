// Output paths checked before any work (examples/common/cli.hpp,
// check_writable): what is refused and why, that a check leaves nothing
// behind and touches no existing file, and that ranks checking the same path
// at the same moment do not refuse each other.
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "examples/common/cli.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
namespace fs = std::filesystem;
using hg::cli::check_writable;
using hg::cli::UsageError;

TEST_CASE("check_writable: a new file in an existing folder passes and is not left behind", "[cli]") {
  const auto dir = hg::test::make_temp_dir("check_writable_new");
  const auto path = (dir / "log.csv").string();
  check_writable(path, "--log-csv");
  CHECK(fs::is_empty(dir));         // neither the file nor the probe is left
  check_writable("", "--log-csv");  // empty: nothing to check
  fs::remove_all(dir);
}

TEST_CASE("check_writable: an existing file passes untouched", "[cli]") {
  const auto dir = hg::test::make_temp_dir("check_writable_existing");
  const auto path = dir / "model.ck";
  hg::test::write_bytes(path, "kept bytes");
  check_writable(path.string(), "--checkpoint");
  CHECK(hg::test::read_bytes(path) == "kept bytes");
  fs::remove_all(dir);
}

TEST_CASE("check_writable: a folder, or a path in a missing folder, is refused by name", "[cli]") {
  const auto dir = hg::test::make_temp_dir("check_writable_refused");
  CHECK_THROWS_WITH(check_writable(dir.string(), "--log-csv"),
                    Contains("--log-csv " + dir.string()) && Contains("is a directory, expected a file path"));
  const auto missing = (dir / "no" / "such" / "log.csv").string();
  CHECK_THROWS_AS(check_writable(missing, "--log-csv"), UsageError);
  CHECK_THROWS_WITH(check_writable(missing, "--log-csv"), Contains("directory '") && Contains("' does not exist"));
  const auto too_long = (dir / std::string(300, 'x')).string();
  CHECK_THROWS_WITH(check_writable(too_long, "--plot"),
                    Contains("--plot " + too_long) && Contains("characters, at most"));
  fs::remove_all(dir);
}

// Every rank of `mpirun -np N train --log-csv x.csv` checks x.csv at once:
// no rank's check may fail or disturb another's.
TEST_CASE("check_writable: many checks of one path at the same moment all pass", "[cli]") {
  const auto dir = hg::test::make_temp_dir("check_writable_race");
  const auto path = (dir / "shared.csv").string();
  constexpr int kThreads = 4, kChecks = 2000;
  std::atomic<int> refused{0};
  std::string first_error;  // written by the one thread that counts the first refusal
  std::vector<std::thread> ranks;
  for (int t = 0; t < kThreads; ++t)
    ranks.emplace_back([&] {
      for (int i = 0; i < kChecks; ++i) try {
          check_writable(path, "--log-csv");
        } catch (const UsageError& e) {
          if (refused++ == 0) first_error = e.what();
        }
    });
  for (auto& r : ranks) r.join();
  INFO(first_error);
  CHECK(refused.load() == 0);
  CHECK(fs::is_empty(dir));
  fs::remove_all(dir);
}

// run_program (examples/common/cli.hpp): what a program prints and returns
// when its body fails, by kind of failure.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <new>
#include <string>

#include "core/error.hpp"
#include "examples/common/cli.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
namespace fs = std::filesystem;

namespace {

struct Run {
  int code;
  std::string err;  // what the program wrote to stderr
};

// run_program with no arguments and `body`, its stderr captured.
Run run(const std::function<int()>& body) {
  const auto dir = hg::test::make_temp_dir("run_program");
  const fs::path path = dir / "stderr.txt";
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  std::FILE* file = std::fopen(path.c_str(), "w");
  REQUIRE(file != nullptr);
  dup2(fileno(file), STDERR_FILENO);
  CLI::App app{"a test program", "test_program"};
  hg::cli::CommonFlags flags;
  hg::cli::add_common_flags(app, flags);
  char name[] = "test_program";
  char* argv[] = {name, nullptr};
  const int code = hg::cli::run_program(app, flags, 1, argv, body);
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(file);
  Run r{code, hg::test::read_bytes(path)};
  fs::remove_all(dir);
  return r;
}

}  // namespace

TEST_CASE("run_program: each kind of failure gets its exit code and a message", "[cli]") {
  CHECK(run([] { return hg::cli::kExitOk; }).code == hg::cli::kExitOk);

  const Run usage = run([]() -> int { hg::cli::usage_error("--batch", "0: must be at least 1"); });
  CHECK(usage.code == hg::cli::kExitUsage);
  CHECK_THAT(usage.err, Contains("--batch 0: must be at least 1"));

  const Run error = run([]() -> int { hg::fail("layernorm_forward", "gamma shape (5) does not match"); });
  CHECK(error.code == hg::cli::kExitRuntime);
  CHECK_THAT(error.err, Contains("layernorm_forward: gamma shape (5) does not match"));

  const Run host = run([]() -> int { throw std::bad_alloc(); });
  CHECK(host.code == hg::cli::kExitRuntime);
  CHECK_THAT(host.err, Contains("more host memory than is available"));

  // The GPU's out of memory: the allocator's message, then what would fit.
  const Run gpu = run([]() -> int { throw hg::OutOfMemory("gpu::allocate: cudaMalloc of 1073741824 bytes failed"); });
  CHECK(gpu.code == hg::cli::kExitRuntime);
  CHECK_THAT(gpu.err, Contains("cudaMalloc of 1073741824 bytes failed"));
  CHECK_THAT(gpu.err, Contains("--recompute-gelu"));
  CHECK_THAT(gpu.err, Contains("smaller batch"));
  CHECK_THAT(error.err, !Contains("--recompute-gelu"));  // only for the GPU's out of memory
}

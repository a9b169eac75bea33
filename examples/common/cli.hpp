#pragma once
// What every handgrad program shares on its command line and at its exit:
// the common flags (--log-level, --quiet, --threads, --version), --device
// resolution, up-front checks of output paths, and one exit-code convention:
//
//   0    success
//   1    runtime error (a file that cannot be read or written, out of memory,
//        a failed check, an interrupted run's I/O failing, ...)
//   2    usage error (an unknown flag, a value out of range, flags that
//        contradict each other, --device cuda without a CUDA GPU)
//   130  interrupted by SIGINT, 143 by SIGTERM (train: after saving)
#include <functional>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "core/device.hpp"
#include "core/logging.hpp"  // spdlog, for every program

namespace hg::cli {

constexpr int kExitOk = 0, kExitRuntime = 1, kExitUsage = 2;

// A command line that cannot work; exits with kExitUsage. Its message names
// the flag, the value given and what is allowed.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError("--flag VALUE: <why>") from the parts, streamed.
template <class... Parts>
[[noreturn]] void usage_error(const std::string& flag, const Parts&... parts);

struct CommonFlags {
  std::string log_level;
  bool quiet = false;
  int threads = 0;  // 0: leave hg::num_threads() as it is (HG_NUM_THREADS or every core)
};

// Adds --log-level, --quiet, --threads and --version to `app`. threads_flag
// false: the program has its own --threads (a list of counts it sweeps).
void add_common_flags(CLI::App& app, CommonFlags& flags, bool threads_flag = true);

// Parses the command line, sets up logging and threads, runs `body` and turns
// every failure into a message and an exit code (see the table above).
// `body` returns the program's exit code.
int run_program(CLI::App& app, CommonFlags& flags, int argc, char** argv, const std::function<int()>& body);

// "cpu", "cuda" or "auto" (CUDA when a GPU is present). "cuda" without a GPU
// is a UsageError: "--device cuda: no CUDA GPU ...".
Device resolve_device(const std::string& name, const std::string& flag = "--device");

// For a program that runs only on CUDA (it has no --device): a UsageError
// "<program> times CUDA kernels only, and there is no CUDA GPU ...", naming
// what runs on the CPU instead when cpu_alternative is given.
void require_cuda(const std::string& program, const std::string& cpu_alternative = "");

// Output paths are checked before any work: the file must be creatable (or,
// when it exists, writable) in an existing directory. Empty: nothing to check.
void check_writable(const std::string& path, const std::string& flag);

// The version line: "handgrad 0.1.0".
std::string version_string();

// ---- implementation of the template above ----
namespace detail {
std::string join(const std::function<void(std::ostream&)>& write);
}
template <class... Parts>
[[noreturn]] void usage_error(const std::string& flag, const Parts&... parts) {
  throw UsageError(flag + " " + detail::join([&](std::ostream& os) { (os << ... << parts); }));
}

}  // namespace hg::cli

namespace hg::cli {

// A CLI11 check that a real number lies in [lo, hi] (finite), whose message
// names the value and the range with %g ("Value 0 not in range [1e-09, 10]").
CLI::Validator real_range(double lo, double hi);

// A CLI11 check that an integer is at least `lo`, with no made-up upper
// bound in the help ("INT >= 1") or the message ("Value 0 not in range: at
// least 1"). The option's own type bounds it above.
CLI::Validator at_least(int64_t lo);

}  // namespace hg::cli

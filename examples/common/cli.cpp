#include "examples/common/cli.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <sstream>

#include "core/error.hpp"
#include "core/logging.hpp"
#include "core/parallel.hpp"

namespace hg::cli {

namespace detail {
std::string join(const std::function<void(std::ostream&)>& write) {
  std::ostringstream os;
  write(os);
  return os.str();
}
}  // namespace detail

std::string version_string() { return std::string("handgrad ") + HG_VERSION; }

void add_common_flags(CLI::App& app, CommonFlags& flags, bool threads_flag) {
  app.add_option("--log-level", flags.log_level,
                 "trace, debug, info, warn, error or off (default: $HG_LOG_LEVEL, $SPDLOG_LEVEL, else info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "off"}));
  app.add_flag("--quiet,-q", flags.quiet, "only warnings, errors and results (log level warn)");
  if (threads_flag)
    app.add_option("--threads", flags.threads, "CPU threads (default: $HG_NUM_THREADS, else every core)")
        ->check(CLI::Range(1, 1024));
  app.set_version_flag("--version", version_string());
}

int run_program(CLI::App& app, CommonFlags& flags, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, the version, or the error and a hint
    return code == 0 ? kExitOk : kExitUsage;
  }
  const std::string program = app.get_name().empty() ? "handgrad" : app.get_name();
  try {
    init_logging(flags.quiet && flags.log_level.empty() ? "warn" : flags.log_level, program);
  } catch (const std::exception& e) {  // a bad HG_LOG_LEVEL / SPDLOG_LEVEL
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return kExitUsage;
  }
  try {
    if (flags.threads > 0) set_num_threads(flags.threads);
    const int code = body();
    end_status_line();
    return code;
  } catch (const UsageError& e) {
    end_status_line();
    spdlog::error("{}", e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    end_status_line();
    spdlog::error("out of memory (std::bad_alloc): the sizes asked for need more host memory than is available");
    return kExitRuntime;
  } catch (const OutOfMemory& e) {
    end_status_line();
    spdlog::error("{}", e.what());
    spdlog::error("the GPU has no room for this run: a smaller batch or sequence, or, where the program has them, "
                  "--recompute-gelu and --recompute-layernorm, which keep fewer activations (docs/mixed_precision.md)");
    return kExitRuntime;
  } catch (const std::exception& e) {
    end_status_line();
    spdlog::error("{}", e.what());
    return kExitRuntime;
  }
}

namespace {
const char* why_no_cuda() {
#ifdef HG_WITH_CUDA
  return "is visible to this process";
#else
  return "support: this build has no CUDA backend (nvcc was not found at configure time)";
#endif
}
}  // namespace

Device resolve_device(const std::string& name, const std::string& flag) {
  if (name == "cpu") return Device::CPU;
  if (name == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  if (name == "cuda") {
    if (!cuda_available()) usage_error(flag, "cuda: no CUDA GPU ", why_no_cuda(), "; use ", flag, " cpu");
    return Device::CUDA;
  }
  usage_error(flag, name, ": unknown device (allowed: cpu, cuda, auto)");
}

void require_cuda(const std::string& program, const std::string& cpu_alternative) {
  if (!cuda_available())
    throw UsageError(program + " times CUDA kernels only, and there is no CUDA GPU " + why_no_cuda() +
                     (cpu_alternative.empty() ? "" : "; on the CPU: " + cpu_alternative));
}

void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) usage_error(flag, path, ": is a directory, expected a file path");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) usage_error(flag, path, ": directory '", dir.string(), "' does not exist");
  if (fs::exists(p, ec)) {
    const int fd = ::open(path.c_str(), O_WRONLY);  // neither truncates nor writes
    if (fd >= 0) {
      ::close(fd);
      return;
    }
    // Removed between the two calls: it is checked below as a new file.
    if (errno != ENOENT) usage_error(flag, path, ": the file exists and cannot be written: ", std::strerror(errno));
  }
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const auto name_length = static_cast<long>(p.filename().string().size());
  if (name_max > 0 && name_length > name_max)
    usage_error(flag, path, ": the file name has ", name_length, " characters, at most ", name_max, " allowed here");
  // access() trusts the mode bits, which /proc, /sys and read-only mounts do
  // not honour: only creating a file shows that the folder takes one. The
  // probe has a name of its own, never the path itself, so that every rank of
  // a data-parallel job can check the same path at the same moment.
  std::string probe = (dir / ".handgrad-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) usage_error(flag, path, ": cannot create a file in '", dir.string(), "': ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace hg::cli

namespace hg::cli {

CLI::Validator real_range(double lo, double hi) {
  char range[96];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  const std::string text = range;
  return CLI::Validator(
      [lo, hi, text](std::string& input) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(input, &used);
        } catch (const std::exception&) {
          return "Value " + input + " is not a number";
        }
        if (used != input.size() || !std::isfinite(v) || v < lo || v > hi)
          return "Value " + input + " not in range " + text;
        return std::string();
      },
      "REAL in " + text);
}

CLI::Validator at_least(int64_t lo) {
  const std::string bound = std::to_string(lo);
  return CLI::Validator(
      [lo, bound](std::string& input) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(input, &used);
        } catch (const std::exception&) {
          return "Value " + input + " is not an integer";
        }
        if (used != input.size() || v < lo) return "Value " + input + " not in range: at least " + bound;
        return std::string();
      },
      "INT >= " + bound);
}

}  // namespace hg::cli

#include "core/logging.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include "core/error.hpp"
#include "core/mpi_launcher.hpp"

namespace hg {
namespace {

spdlog::level::level_enum parse_level(const std::string& name, const std::string& source) {
  if (name == "trace") return spdlog::level::trace;
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warn" || name == "warning") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  if (name == "off") return spdlog::level::off;
  fail("init_logging", "unknown log level '", name, "' from ", source,
       " (expected trace, debug, info, warn, error or off)");
}

// Whether stdout is a terminal the user watches. Under mpirun a rank's
// stdout is a pseudo-terminal of the launcher even when mpirun's own output
// goes to a file, so a process started by an MPI launcher (Open MPI, MPICH /
// Hydra, PMIx) never counts as one: no carriage returns or ESC[K in a log.
bool stdout_is_terminal() { return !launched_by_mpi() && isatty(fileno(stdout)) != 0; }

// Routes info and below to stdout, warnings and errors to stderr, and keeps
// the status line (if any) below the messages.
class ConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  ConsoleSink()
      : out_(std::make_unique<spdlog::pattern_formatter>("%v")),
        err_(std::make_unique<spdlog::pattern_formatter>("%n: %l: %v")),
        tty_(stdout_is_terminal()) {}

  void status(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = line;
    draw_status();
  }
  void end_status() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!status_.empty()) std::fputs("\n", stdout);
    std::fflush(stdout);
    status_.clear();
  }
  bool tty() const { return tty_; }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const bool to_err = msg.level >= spdlog::level::warn;
    spdlog::memory_buf_t buf;
    (to_err ? err_ : out_)->format(msg, buf);
    if (!status_.empty()) std::fputs("\r\x1b[K", stdout);  // erase the status line first
    std::fflush(stdout);
    FILE* f = to_err ? stderr : stdout;
    std::fwrite(buf.data(), 1, buf.size(), f);
    std::fflush(f);
    draw_status();
  }
  void flush_() override {
    std::fflush(stdout);
    std::fflush(stderr);
  }

 private:
  void draw_status() {
    if (status_.empty()) return;
    std::fputs(("\r\x1b[K" + status_).c_str(), stdout);
    std::fflush(stdout);
  }

  std::unique_ptr<spdlog::formatter> out_, err_;
  bool tty_;
  std::string status_;
};

std::shared_ptr<ConsoleSink>& console_sink() {
  static std::shared_ptr<ConsoleSink> sink;
  return sink;
}

}  // namespace

spdlog::level::level_enum resolve_log_level(const std::string& level) {
  if (!level.empty()) return parse_level(level, "--log-level");
  for (const char* var : {"HG_LOG_LEVEL", "SPDLOG_LEVEL"}) {
    const char* env = std::getenv(var);
    if (env != nullptr && *env != '\0') return parse_level(env, std::string("the environment variable ") + var);
  }
  return spdlog::level::info;
}

void init_logging(const std::string& level, const std::string& program) {
  const spdlog::level::level_enum parsed = resolve_log_level(level);
  auto& sink = console_sink();
  if (!sink) sink = std::make_shared<ConsoleSink>();
  auto logger = std::make_shared<spdlog::logger>(program.empty() ? "handgrad" : program, sink);
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  spdlog::set_level(parsed);
}

bool status_line_enabled() {
  const auto& sink = console_sink();
  return sink && sink->tty() && spdlog::should_log(spdlog::level::info);
}

void set_status_line(const std::string& line) {
  if (status_line_enabled()) console_sink()->status(line);
}

void end_status_line() {
  if (console_sink()) console_sink()->end_status();
}

}  // namespace hg

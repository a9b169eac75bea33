#pragma once
#include <string>

#include <spdlog/spdlog.h>

namespace hg {

// Sets up handgrad's console logger and its level.
//
// Level: `level` when non-empty (a --log-level flag passes it here), else the
// environment variable HG_LOG_LEVEL, else SPDLOG_LEVEL (spdlog's variable; a
// single level name), else info. Names: trace, debug, info, warn, error, off.
// An unknown name throws hg::Error naming where it came from.
//
// Output: trace/debug/info go to stdout as plain lines; warnings and errors go
// to stderr as "<program>: warning: ..." / "<program>: error: ...". `program`
// (when non-empty) names the logger, so a program's messages carry its name.
void init_logging(const std::string& level = "", const std::string& program = "");

// The level init_logging would choose from `level` and the environment.
spdlog::level::level_enum resolve_log_level(const std::string& level);

// One redrawn status line (progress) at the bottom of a terminal: shown only
// when stdout is a terminal and info messages are enabled; log messages are
// written above it and the line is drawn again after them. end_status_line()
// leaves the last state on screen and moves to a fresh line.
bool status_line_enabled();
void set_status_line(const std::string& line);
void end_status_line();

}  // namespace hg

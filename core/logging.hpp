#pragma once
#include <string>

#include <spdlog/spdlog.h>

namespace hg {

// Sets spdlog's level from HG_LOG_LEVEL (trace, debug, info, warn, error, off)
// unless `level` is non-empty, which wins (a --log-level flag passes it here).
void init_logging(const std::string& level = "");

}  // namespace hg

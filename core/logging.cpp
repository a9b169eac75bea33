#include "core/logging.hpp"

#include <cstdlib>

#include "core/error.hpp"

namespace hg {

void init_logging(const std::string& level) {
  std::string name = level;
  if (name.empty()) {
    const char* env = std::getenv("HG_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return;  // keep spdlog's default (info)
    name = env;
  }
  spdlog::level::level_enum parsed;
  if (name == "trace") parsed = spdlog::level::trace;
  else if (name == "debug") parsed = spdlog::level::debug;
  else if (name == "info") parsed = spdlog::level::info;
  else if (name == "warn" || name == "warning") parsed = spdlog::level::warn;
  else if (name == "error") parsed = spdlog::level::err;
  else if (name == "off") parsed = spdlog::level::off;
  else fail("init_logging", "unknown log level '", name, "' (expected trace, debug, info, warn, error or off)");
  spdlog::set_level(parsed);
}

}  // namespace hg

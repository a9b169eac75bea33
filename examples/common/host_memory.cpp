#include "examples/common/host_memory.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace hg::cli {

int64_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1) return static_cast<int64_t>(kib) * 1024;
  }
  return -1;
}

std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024 * 1024) std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  else std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024));
  return text;
}

}  // namespace hg::cli

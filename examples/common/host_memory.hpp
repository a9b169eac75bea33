#pragma once
// The host memory a program can still allocate without swapping or being
// killed: Linux's MemAvailable (/proc/meminfo), in bytes.
#include <cstdint>
#include <string>

namespace hg::cli {

// -1 where it cannot be read (no /proc/meminfo, or no MemAvailable line).
int64_t host_memory_available();

// "3.2 GiB", "512.0 MiB": a byte count for a message.
std::string format_bytes(double bytes);

}  // namespace hg::cli

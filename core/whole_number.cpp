#include "core/whole_number.hpp"

#include <cerrno>
#include <cstdlib>

namespace hg {

std::optional<long> parse_whole_number(const char* text, long lo, long hi) {
  if (text == nullptr) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || n < lo || n > hi) return std::nullopt;
  return n;
}

}  // namespace hg

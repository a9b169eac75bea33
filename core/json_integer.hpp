#pragma once
// Whether a JSON value is an integer that T holds. nlohmann's get<T>() wraps
// one that does not (4294967296 read as an int is 0, 2^63 as an int64_t is
// negative), so a reader that checks only is_number_integer() would accept a
// different value from the one in the file.
#include <cstdint>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace hg {

template <class T>
bool json_integer_fits(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
  if (!v.is_number_integer()) return false;
  const int64_t x = v.get<int64_t>();
  return x >= int64_t(std::numeric_limits<T>::min()) && x <= int64_t(std::numeric_limits<T>::max());
}

// The range json_integer_fits<T> accepts, for messages.
template <class T>
constexpr const char* json_integer_range() {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, int64_t>, "a range text for int and int64_t only");
  return std::is_same_v<T, int> ? "[-2^31, 2^31)" : "[-2^63, 2^63)";
}

}  // namespace hg

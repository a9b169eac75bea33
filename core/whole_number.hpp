#pragma once
// A whole decimal number in [lo, hi] read from text (an environment value,
// a flag), or nothing: the callers word their own error with what is allowed.
#include <optional>

namespace hg {

// text as a base-10 integer if all of it is one and it lies in [lo, hi].
std::optional<long> parse_whole_number(const char* text, long lo, long hi);

}  // namespace hg

#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/shape.hpp"

namespace hg {

// The one exception type for bad input and failed runtime calls. The message
// always starts with the op name: "layernorm_forward: gamma shape (5) does not match ...".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The GPU allocator found no memory for a request (the driver's out of
// memory, or a request over gpu::set_memory_limit). An Error like any other,
// apart so that a caller with a way that needs less memory can take it.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void append(std::ostringstream& os, const Shape& s) { os << shape_str(s); }
template <class T>
void append(std::ostringstream& os, const T& v) {
  os << v;
}
}  // namespace detail

// fail("matmul", "inner dims differ: a ", a.shape(), " b ", b.shape()) throws
// hg::Error("matmul: inner dims differ: a (2, 3) b (4, 5)"). Shapes print as tuples.
template <class... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  std::ostringstream os;
  os << op << ": ";
  (detail::append(os, parts), ...);
  throw Error(os.str());
}

}  // namespace hg

// Check a condition; on failure throw hg::Error with the op name and message parts.
#define HG_CHECK(cond, op, ...)               \
  do {                                        \
    if (!(cond)) ::hg::fail(op, __VA_ARGS__); \
  } while (0)

// A precondition the op boundary has already validated, restated by a kernel
// launcher: checked in Debug and sanitizer builds, compiled out under NDEBUG
// (Release), so a Release call validates its input exactly once.
#ifdef NDEBUG
#define HG_DEBUG_CHECKS 0
#else
#define HG_DEBUG_CHECKS 1
#endif
#define HG_DCHECK(cond, op, ...)                                 \
  do {                                                           \
    if (HG_DEBUG_CHECKS && !(cond)) ::hg::fail(op, __VA_ARGS__); \
  } while (0)

#include "core/shape.hpp"

#include <sstream>

#include "core/error.hpp"

namespace hg {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

Shape contiguous_strides(const Shape& s) {
  Shape strides(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * s[i + 1];
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    // Align from the trailing dimension; missing leading dims count as 1.
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      fail(op, "shapes ", a, " and ", b, " do not broadcast");
    }
  }
  return out;
}

int normalize_dim(int dim, int ndim, const char* op) {
  if (dim < -ndim || dim >= ndim) fail(op, "dim ", dim, " out of range for a tensor of rank ", ndim);
  return dim < 0 ? dim + ndim : dim;
}

}  // namespace hg

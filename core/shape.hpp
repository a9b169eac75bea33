#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hg {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);     // "(2, 3, 4)"
Shape contiguous_strides(const Shape& s);  // row-major, in elements

// NumPy broadcasting of two shapes; throws hg::Error naming `op` if they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Normalises a possibly negative dim into [0, ndim); throws hg::Error naming `op`.
int normalize_dim(int dim, int ndim, const char* op);

}  // namespace hg

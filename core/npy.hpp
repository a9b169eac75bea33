#pragma once
#include <string>

#include "core/tensor.hpp"

namespace hg {

// NumPy .npy v1/v2 files, little-endian float32/float64, C order.
// A malformed, truncated or oversized file throws hg::Error naming the file;
// the reader never allocates more than the file can actually hold.
void save_npy(const std::string& path, const Tensor& t);  // any device; written via host
Tensor load_npy(const std::string& path);                 // CPU tensor

// The same on an in-memory buffer (used by the loader, its fuzz target and tests).
Tensor parse_npy(const std::string& bytes, const std::string& what = "<buffer>");
std::string serialize_npy(const Tensor& t);

}  // namespace hg

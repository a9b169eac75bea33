#pragma once
// Tensors that live as long as the model (parameter values, gradients,
// optimizer moments, bf16 compute copies) cut out of one buffer per dtype.
// The CUDA caching allocator rounds every block of 1 MiB or more up to a
// multiple of 2 MiB: GPT-2 small's 2.25 MiB projection weight takes 4 MiB,
// and over its 150 parameters and their gradients, moments and bf16 copies
// the rounding holds about 300 MiB that no tensor uses. One buffer per
// dtype rounds once.
#include <optional>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// Offsets of the views in a packed buffer are multiples of this many bytes
// (cudaMalloc's own alignment), so every kernel's alignment rule holds.
constexpr int64_t kPackedAlignment = 256;

// One zero-filled buffer per dtype on `device`, cut into contiguous views
// like[i].shape() of dtype `dtype` (like[i].dtype() where `dtype` is
// unset), in order. An undefined like[i] gives an undefined view.
std::vector<Tensor> packed_zeros_like(const std::vector<Tensor>& like, Device device,
                                      std::optional<DType> dtype = std::nullopt);

// packed_zeros_like with each view holding like[i]'s values (cast where the dtype differs).
std::vector<Tensor> packed_copies(const std::vector<Tensor>& like, Device device,
                                  std::optional<DType> dtype = std::nullopt);

}  // namespace hg

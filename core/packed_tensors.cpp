#include "core/packed_tensors.hpp"

#include <map>

#include "core/backend.hpp"

namespace hg {

std::vector<Tensor> packed_zeros_like(const std::vector<Tensor>& like, Device device, std::optional<DType> dtype) {
  const auto dtype_of = [&](const Tensor& t) { return dtype ? *dtype : t.dtype(); };
  // Each view's offset in elements of its dtype, and each dtype's total.
  std::vector<int64_t> offset(like.size(), 0);
  std::map<DType, int64_t> total;
  for (size_t i = 0; i < like.size(); ++i) {
    if (!like[i].defined()) continue;
    const DType dt = dtype_of(like[i]);
    const int64_t align = kPackedAlignment / static_cast<int64_t>(dtype_size(dt));
    int64_t& end = total[dt];
    offset[i] = end;
    end += (like[i].numel() + align - 1) / align * align;
  }
  std::map<DType, Tensor> buffer;
  for (const auto& [dt, elements] : total) buffer[dt] = Tensor::zeros({elements}, dt, device);
  std::vector<Tensor> out(like.size());
  for (size_t i = 0; i < like.size(); ++i) {
    if (!like[i].defined()) continue;
    out[i] = buffer[dtype_of(like[i])].slice(offset[i], offset[i] + like[i].numel()).reshape(like[i].shape());
  }
  return out;
}

std::vector<Tensor> packed_copies(const std::vector<Tensor>& like, Device device, std::optional<DType> dtype) {
  std::vector<Tensor> out = packed_zeros_like(like, device, dtype);
  for (size_t i = 0; i < like.size(); ++i) {
    if (!like[i].defined() || like[i].numel() == 0) continue;
    // A cast on the device writes the view itself; copy_ would cast into a
    // temporary first, and each would stay in the allocator's cache.
    if (like[i].device() == device && like[i].dtype() != out[i].dtype()) backend_for(device).cast(like[i], out[i]);
    else out[i].copy_(like[i]);
  }
  return out;
}

}  // namespace hg

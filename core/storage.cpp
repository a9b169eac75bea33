#include "core/storage.hpp"

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "core/host_allocator.hpp"

namespace hg {

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  void* data = nullptr;
  if (device == Device::CPU) {
    data = host::allocate(bytes);
  } else {
    if (bytes > 0) data = gpu::allocate(bytes);  // throws hg::Error in CPU-only builds
  }
  return std::shared_ptr<Storage>(new Storage(data, bytes, device));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t bytes, Device device, std::function<void()> release) {
  HG_CHECK(release != nullptr, "Storage::wrap", "a release callback is required");
  HG_CHECK(data != nullptr || bytes == 0, "Storage::wrap", "null data for ", bytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, std::move(release)));
}

Storage::~Storage() {
  if (release_) {
    try {  // the owner's callback must not throw out of a destructor
      release_();
    } catch (...) {
    }
    return;
  }
  if (data_ == nullptr) return;
  if (device_ == Device::CPU) {
    host::release(data_, bytes_);
  } else {
    // A destructor must not throw; the caching allocator only fails on a corrupted pointer.
    try {
      gpu::release(data_);
    } catch (...) {
    }
  }
}

}  // namespace hg

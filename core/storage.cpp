#include "core/storage.hpp"

#include <cstdlib>
#include <new>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"

namespace hg {

namespace {
constexpr size_t kCpuAlignment = 64;  // one cache line; also enough for any SIMD load Eigen issues
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  void* data = nullptr;
  if (device == Device::CPU) {
    // aligned_alloc wants a multiple of the alignment; always hand out at least one line
    // so that empty tensors still have a valid, distinct pointer.
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded < bytes) fail("Storage::allocate", "size ", bytes, " bytes overflows");
    data = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (data == nullptr) fail("Storage::allocate", "out of host memory allocating ", bytes, " bytes");
  } else {
    if (bytes > 0) data = gpu::allocate(bytes);  // throws hg::Error in CPU-only builds
  }
  return std::shared_ptr<Storage>(new Storage(data, bytes, device));
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  if (device_ == Device::CPU) {
    std::free(data_);
  } else {
    // A destructor must not throw; the caching allocator only fails on a corrupted pointer.
    try {
      gpu::release(data_);
    } catch (...) {
    }
  }
}

}  // namespace hg

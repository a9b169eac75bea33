#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.hpp"

namespace hg {

// A flat block of bytes on one device. Tensors share a Storage through a
// shared_ptr, so views (reshape, leading-dim slices) never copy.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device);
  // Memory handgrad does not own (a NumPy array, a DLPack tensor): the bytes
  // are used in place and `release` runs once, when the last view goes, to
  // hand them back to their owner instead of freeing them.
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t bytes, Device device, std::function<void()> release = nullptr)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void()> release_;  // set for wrapped (not owned) memory
};

}  // namespace hg

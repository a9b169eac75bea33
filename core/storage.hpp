#pragma once
#include <cstddef>
#include <memory>

#include "core/device.hpp"

namespace hg {

// A flat block of bytes on one device. Tensors share a Storage through a
// shared_ptr, so views (reshape, leading-dim slices) never copy.
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  size_t bytes_;
  Device device_;
};

}  // namespace hg

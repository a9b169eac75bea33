#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <vector>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/random.hpp"
#include "core/shape.hpp"
#include "core/storage.hpp"

namespace hg {

// A dense, contiguous, row-major n-d array on one device.
//
// Storage is shared between views: reshape()/view() and slice() along the
// leading dimension return tensors that alias the same bytes (an element
// offset records where a slice starts). Every tensor is contiguous, so
// kernels can treat data() as a flat array of numel() elements.
class Tensor {
 public:
  Tensor() = default;  // undefined tensor; defined() is false

  // ---- factories (CPU by default) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor arange(int64_t n, DType dtype = DType::F32, Device device = Device::CPU);  // 0..n-1
  // Values given in row-major order; throws if their count is not numel(shape).
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::F32,
                            Device device = Device::CPU);
  // Random draws happen on the host from `gen`, then move to `device`.
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::CPU,
                      double mean = 0.0, double stddev = 1.0);
  static Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::CPU,
                     double low = 0.0, double high = 1.0);

  // Uses `data` (contiguous, row-major, `device` memory) in place without
  // owning it; `release` runs when the last tensor viewing it is gone.
  // Interop (NumPy, DLPack) builds on this: see python/ and docs/python.md.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release);

  // ---- metadata ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_ == Device::CUDA; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::string describe() const;  // "Tensor(2, 3) f32 cpu"

  // ---- raw data (device pointer for CUDA tensors) ----
  void* raw_data() const;
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>(), "Tensor::data");
    return static_cast<T*>(raw_data());
  }

  // ---- conversions and copies ----
  Tensor to(Device device) const;  // same tensor if already there
  Tensor to(DType dtype) const;    // cast (F32/F64/BF16/F16), same device; same tensor if already that dtype
  Tensor clone() const;            // deep copy, same device and dtype
  void copy_(const Tensor& src);   // same shape, any device/dtype; writes into this storage
  Tensor& fill_(double value);

  // ---- views (share storage) ----
  Tensor reshape(const Shape& shape) const;  // one dim may be -1
  Tensor view(const Shape& shape) const { return reshape(shape); }
  Tensor slice(int64_t start, int64_t end) const;  // rows [start, end) of dim 0
  Tensor operator[](int64_t i) const;              // row i of dim 0, one rank less
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

  // ---- element access for tests and printing (copies one element from a GPU) ----
  double item() const;  // numel() must be 1
  double at(std::initializer_list<int64_t> index) const;
  void set(std::initializer_list<int64_t> index, double value);
  std::vector<double> to_vector() const;  // all elements as double, row-major

  // ---- checks used by ops; each throws hg::Error naming `op` ----
  void check_dtype(DType expected, const char* op) const;
  void check_device(Device expected, const char* op) const;
  void check_defined(const char* op) const;

 private:
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, DType dtype, Device device)
      : storage_(std::move(storage)), offset_(offset), shape_(std::move(shape)), dtype_(dtype), device_(device) {}

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Readable printing: shape, dtype, device and (abbreviated) values.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Ops that take several tensors check them with these (messages name op and shapes).
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
// An output the caller provides (ops' *_into variants): defined, exactly this shape, dtype and device.
void check_output(const char* op, const char* name, const Tensor& out, const Shape& shape, DType dtype, Device device);

}  // namespace hg

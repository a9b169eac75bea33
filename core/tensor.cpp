#include "core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/half.hpp"
#include "core/parallel.hpp"

namespace hg {

namespace {

// ---- host conversions of single elements (used by at/set) ----

double read_element(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16_t*>(base)[i]);
    case DType::F16: return half_to_float(static_cast<const f16_t*>(base)[i]);
  }
  return 0.0;
}

void write_element(void* base, DType dtype, int64_t i, double value) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(value); break;
    case DType::F64: static_cast<double*>(base)[i] = value; break;
    case DType::BF16: static_cast<bf16_t*>(base)[i] = float_to_bf16(static_cast<float>(value)); break;
    case DType::F16: static_cast<f16_t*>(base)[i] = float_to_half(static_cast<float>(value)); break;
  }
}

// Element conversions (from_vector, to_vector) run in pieces of this many
// elements on the library's threads: tests convert millions at a time. Each
// element is converted alone, so the thread count changes nothing.
constexpr int64_t kConvertPiece = int64_t(1) << 16;

void copy_any(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memmove(dst, src, bytes);  // memmove: copy_ between overlapping views of one storage
  } else {
    gpu::copy_bytes(dst, dst_device, src, src_device, bytes);
  }
}

// Rejects negative dims and element counts whose byte size would overflow size_t.
void check_shape(const Shape& shape, DType dtype, const char* op) {
  int64_t n = 1;
  const int64_t limit = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    if (d < 0) fail(op, "negative dimension in shape ", shape);
    if (d != 0 && n > limit / d) fail(op, "shape ", shape, " has too many elements");
    n *= d;
  }
}

int64_t flat_index(const Tensor& t, std::initializer_list<int64_t> index, const char* op) {
  if (static_cast<int>(index.size()) != t.ndim())
    fail(op, "got ", index.size(), " indices for a tensor of shape ", t.shape());
  int64_t flat = 0;
  int d = 0;
  for (int64_t i : index) {
    const int64_t size = t.shape()[d];
    if (i < 0 || i >= size) fail(op, "index ", i, " out of range for dim ", d, " of shape ", t.shape());
    flat = flat * size + i;
    ++d;
  }
  return flat;
}

}  // namespace

// ---- factories ----

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype, "Tensor::empty");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(Storage::allocate(bytes, device), 0, shape, dtype, device);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device, std::function<void()> release) {
  check_shape(shape, dtype, "Tensor::from_blob");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(Storage::wrap(data, bytes, device, std::move(release)), 0, shape, dtype, device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  if (n < 0) fail("Tensor::arange", "n must be >= 0, got ", n);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<double>(i);
  return from_vector(values, {n}, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  check_shape(shape, dtype, "Tensor::from_vector");
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    fail("Tensor::from_vector", "got ", values.size(), " values for shape ", shape, " (", shape_numel(shape),
         " elements)");
  Tensor host = empty(shape, dtype, Device::CPU);
  const auto narrow = [&](auto* p, auto convert) {
    for_pieces(host.numel(), kConvertPiece,
               [&](int64_t b, int64_t e) { std::transform(values.begin() + b, values.begin() + e, p + b, convert); });
  };
  const auto through_float = [](auto to) { return [to](double v) { return to(static_cast<float>(v)); }; };
  switch (dtype) {
    case DType::F32: narrow(host.data<float>(), [](double v) { return static_cast<float>(v); }); break;
    case DType::F64: narrow(host.data<double>(), [](double v) { return v; }); break;
    case DType::BF16: narrow(host.data<bf16_t>(), through_float(float_to_bf16)); break;
    case DType::F16: narrow(host.data<f16_t>(), through_float(float_to_half)); break;
  }
  return host.to(device);
}

namespace {

// Random draws a thread fills at a time (about 1 ms of Box-Muller).
constexpr int64_t kDrawPiece = int64_t(1) << 14;

// n draws of `numbers` generator numbers each: draw i is draw(the counter
// the i-th of n calls one after another would start at), so any thread may
// fill any piece; the generator is left where those calls would leave it.
template <class Draw>
std::vector<double> draws(Generator& gen, int64_t n, uint64_t numbers, const Draw& draw) {
  std::vector<double> values(static_cast<size_t>(n));
  const uint64_t first = gen.counter();
  for_pieces(n, kDrawPiece, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) values[i] = draw(first + numbers * uint64_t(i));
  });
  gen.advance(numbers * uint64_t(n));
  return values;
}

}  // namespace

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, Device device, double mean, double stddev) {
  check_shape(shape, dtype, "Tensor::randn");
  const auto normal = [&](uint64_t c) { return mean + stddev * gen.normal_at(c); };  // Box-Muller: two numbers
  return from_vector(draws(gen, shape_numel(shape), 2, normal), shape, dtype, device);
}

Tensor Tensor::rand(const Shape& shape, Generator& gen, DType dtype, Device device, double low, double high) {
  check_shape(shape, dtype, "Tensor::rand");
  if (!(low <= high)) fail("Tensor::rand", "low ", low, " must not exceed high ", high);
  const auto uniform = [&](uint64_t c) { return low + (high - low) * gen.uniform_at(c); };
  return from_vector(draws(gen, shape_numel(shape), 1, uniform), shape, dtype, device);
}

// ---- metadata ----

int64_t Tensor::size(int dim) const { return shape_[normalize_dim(dim, ndim(), "Tensor::size")]; }

std::string Tensor::describe() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor" << shape_str(shape_) << " " << dtype_name(dtype_) << " " << device_name(device_);
  return os.str();
}

void* Tensor::raw_data() const {
  check_defined("Tensor::raw_data");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

// ---- conversions and copies ----

Tensor Tensor::to(Device device) const {
  check_defined("Tensor::to");
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device);
  copy_any(out.raw_data(), device, raw_data(), device_, nbytes());
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_defined("Tensor::to");
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device_);
  if (numel() > 0) backend_for(device_).cast(*this, out);
  return out;
}

Tensor Tensor::clone() const {
  check_defined("Tensor::clone");
  Tensor out = empty(shape_, dtype_, device_);
  copy_any(out.raw_data(), device_, raw_data(), device_, nbytes());
  return out;
}

void Tensor::copy_(const Tensor& src) {
  check_defined("Tensor::copy_");
  src.check_defined("Tensor::copy_");
  check_same_shape("Tensor::copy_", *this, src);
  // Convert on the source's device first, then move bytes of matching dtype.
  const Tensor converted = src.to(dtype_);
  copy_any(raw_data(), device_, converted.raw_data(), converted.device_, nbytes());
}

Tensor& Tensor::fill_(double value) {
  check_defined("Tensor::fill_");
  if (numel() > 0) backend_for(device_).fill(*this, value);
  return *this;
}

// ---- views ----

Tensor Tensor::reshape(const Shape& shape) const {
  check_defined("Tensor::reshape");
  Shape out = shape;
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (inferred >= 0) fail("reshape", "only one dim may be -1, got ", shape, " for tensor ", shape_);
      inferred = static_cast<int>(i);
    } else if (out[i] < 0) {
      fail("reshape", "invalid dim ", out[i], " in ", shape, " for tensor ", shape_);
    } else {
      if (out[i] != 0 && known > std::numeric_limits<int64_t>::max() / out[i])
        fail("reshape", "cannot reshape ", shape_, " into ", shape, " (too many elements)");
      known *= out[i];
    }
  }
  if (inferred >= 0) {
    // -1 is ambiguous when the other dims multiply to 0.
    if (known == 0 || numel() % known != 0)
      fail("reshape", "cannot reshape ", shape_, " (", numel(), " elements) into ", shape);
    out[inferred] = numel() / known;
  } else if (known != numel()) {
    fail("reshape", "cannot reshape ", shape_, " (", numel(), " elements) into ", shape);
  }
  return Tensor(storage_, offset_, out, dtype_, device_);
}

Tensor Tensor::slice(int64_t start, int64_t end) const {
  check_defined("Tensor::slice");
  if (ndim() == 0) fail("Tensor::slice", "cannot slice a 0-d tensor");
  if (start < 0 || end < start || end > shape_[0])
    fail("Tensor::slice", "range [", start, ", ", end, ") out of bounds for shape ", shape_);
  Shape out = shape_;
  out[0] = end - start;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  return Tensor(storage_, offset_ + start * row, out, dtype_, device_);
}

Tensor Tensor::operator[](int64_t i) const {
  check_defined("Tensor::operator[]");
  if (ndim() == 0) fail("Tensor::operator[]", "cannot index a 0-d tensor");
  if (i < -shape_[0] || i >= shape_[0]) fail("Tensor::operator[]", "index ", i, " out of range for shape ", shape_);
  if (i < 0) i += shape_[0];
  Tensor row = slice(i, i + 1);
  row.shape_.erase(row.shape_.begin());
  return row;
}

// ---- element access ----

double Tensor::item() const {
  check_defined("Tensor::item");
  if (numel() != 1) fail("Tensor::item", "needs exactly one element, tensor has shape ", shape_);
  return to_vector()[0];
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  check_defined("Tensor::at");
  const int64_t i = flat_index(*this, index, "Tensor::at");
  const size_t esize = dtype_size(dtype_);
  alignas(8) unsigned char element[8];
  copy_any(element, Device::CPU, static_cast<const char*>(raw_data()) + i * esize, device_, esize);
  return read_element(element, dtype_, 0);
}

void Tensor::set(std::initializer_list<int64_t> index, double value) {
  check_defined("Tensor::set");
  const int64_t i = flat_index(*this, index, "Tensor::set");
  const size_t esize = dtype_size(dtype_);
  alignas(8) unsigned char element[8];
  write_element(element, dtype_, 0, value);
  copy_any(static_cast<char*>(raw_data()) + i * esize, device_, element, Device::CPU, esize);
}

std::vector<double> Tensor::to_vector() const {
  check_defined("Tensor::to_vector");
  const Tensor host = to(Device::CPU);
  const int64_t n = numel();
  std::vector<double> out(static_cast<size_t>(n));
  const auto widen = [&](const auto* p, auto convert) {
    for_pieces(n, kConvertPiece, [&](int64_t b, int64_t e) { std::transform(p + b, p + e, out.begin() + b, convert); });
  };
  const auto same = [](auto v) { return static_cast<double>(v); };
  switch (dtype_) {
    case DType::F32: widen(host.data<float>(), same); break;
    case DType::F64: widen(host.data<double>(), same); break;
    case DType::BF16: widen(host.data<bf16_t>(), bf16_to_float); break;
    case DType::F16: widen(host.data<f16_t>(), half_to_float); break;
  }
  return out;
}

// ---- checks ----

void Tensor::check_dtype(DType expected, const char* op) const {
  check_defined(op);
  if (dtype_ != expected)
    fail(op, "expected dtype ", dtype_name(expected), " but got ", dtype_name(dtype_), " for tensor ", shape_);
}

void Tensor::check_device(Device expected, const char* op) const {
  check_defined(op);
  if (device_ != expected)
    fail(op, "expected a ", device_name(expected), " tensor but got a ", device_name(device_), " tensor ", shape_);
}

void Tensor::check_defined(const char* op) const {
  if (!defined()) fail(op, "tensor is undefined");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  a.check_defined(op);
  b.check_defined(op);
  if (a.device() != b.device())
    fail(op, "device mismatch: ", a.shape(), " on ", device_name(a.device()), " vs ", b.shape(), " on ",
         device_name(b.device()));
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  a.check_defined(op);
  b.check_defined(op);
  if (a.dtype() != b.dtype())
    fail(op, "dtype mismatch: ", a.shape(), " ", dtype_name(a.dtype()), " vs ", b.shape(), " ", dtype_name(b.dtype()));
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  a.check_defined(op);
  b.check_defined(op);
  if (a.shape() != b.shape()) fail(op, "shape mismatch: ", a.shape(), " vs ", b.shape());
}

void check_output(const char* op, const char* name, const Tensor& out, const Shape& shape, DType dtype, Device device) {
  HG_CHECK(out.defined(), op, "output ", name, " is undefined");
  HG_CHECK(out.shape() == shape && out.dtype() == dtype && out.device() == device, op, "output ", name, " is ",
           out.describe(), " but must be ", shape, " ", dtype_name(dtype), " ", device_name(device));
}

// ---- printing ----

namespace {

constexpr int64_t kSummariseAbove = 1000;  // like NumPy: abbreviate big tensors
constexpr int64_t kEdgeItems = 3;

void print_values(std::ostream& os, const std::vector<double>& v, const Shape& shape, const Shape& strides, int dim,
                  int64_t offset, bool summarise, int indent) {
  const int64_t n = shape[dim];
  const bool last = dim + 1 == static_cast<int>(shape.size());
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (last ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (last) {
      os << v[offset + i];
    } else {
      print_values(os, v, shape, strides, dim + 1, offset + i * strides[dim], summarise, indent + 1);
    }
    if (i + 1 < n) os << (last ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  std::ostringstream body;  // own stream: the caller's formatting flags stay untouched
  body << std::setprecision(6);
  body << "Tensor(shape=" << shape_str(t.shape()) << ", " << dtype_name(t.dtype()) << ", " << device_name(t.device())
       << ")\n";
  const std::vector<double> v = t.to_vector();
  if (t.ndim() == 0) {
    body << v[0];
  } else {
    print_values(body, v, t.shape(), contiguous_strides(t.shape()), 0, 0, t.numel() > kSummariseAbove, 0);
  }
  return os << body.str();
}

}  // namespace hg

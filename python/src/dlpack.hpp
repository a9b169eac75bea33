#pragma once
// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), written
// from the specification: only the structs and constants handgrad exchanges.
// Unversioned DLManagedTensor travels in a capsule named "dltensor", the
// versioned one (DLPack >= 1.0) in "dltensor_versioned"; a consumer renames
// the capsule to "used_dltensor[_versioned]" and then owns the tensor.
#include <cstdint>

namespace hg::dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct Version {
  uint32_t major;
  uint32_t minor;
};

constexpr uint64_t kFlagReadOnly = 1;
constexpr uint64_t kFlagIsCopied = 2;

struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};

}  // namespace hg::dlpack

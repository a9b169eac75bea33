#pragma once
// The bridge between handgrad._C and handgrad._torch_ext (the drop-ins as C++
// autograd functions, python/src/torch_ext/). The extension does not link
// handgrad: it calls the one copy inside handgrad._C through this table of
// functions, which _C publishes as the capsule handgrad._C._torch_bridge. So
// there is one kernel mode, one caching allocator and one CUDA stream per
// process, and the two modules share no C++ library types (torch's headers
// may be built with another _GLIBCXX_USE_CXX11_ABI or pybind11 than _C):
// only plain structs, pointers and numbers cross.
//
// Included by both modules: no handgrad, pybind11 or PyTorch headers here.
#include <cstdint>

namespace hg::python::torch_bridge {

// Bumped on every change to the structs or the table below; the extension
// refuses to import when _C publishes another version or size.
inline constexpr uint32_t kVersion = 1;
inline constexpr const char* kCapsuleName = "handgrad._C._torch_bridge";

enum DTypeCode : int32_t { kFloat32 = 0, kFloat64 = 1, kBFloat16 = 2, kFloat16 = 3, kOtherDType = -1 };
enum DeviceCode : int32_t { kCPU = 0, kCUDA = 1, kOtherDevice = -1 };

// An at::Tensor as the extension read it. _C checks it exactly as it checks
// a torch.Tensor read from Python (python/src/torch_memory.hpp) and views the
// memory without owning it.
struct TensorFacts {
  void* data = nullptr;
  const int64_t* sizes = nullptr;  // ndim entries, owned by the at::Tensor
  int64_t ndim = 0;
  int32_t dtype = kOtherDType;
  int32_t device = kOtherDevice;
  int64_t cuda_index = -1;  // device == kCUDA
  bool contiguous = false;
  const char* dtype_name = nullptr;   // dtype == kOtherDType: Python's spelling, "torch.int64"
  const char* device_name = nullptr;  // device == kOtherDevice: "meta"
};

// No stream to follow (an extension built without CUDA): a CUDA tensor is refused.
inline constexpr intptr_t kNoStream = -1;

// Memory handgrad allocated (cross-entropy's loss and gradient), handed to
// the extension, which wraps it as an at::Tensor and calls release(owner) when
// PyTorch frees it.
struct OwnedTensor {
  void* data = nullptr;
  int64_t numel = 0;
  int32_t dtype = kOtherDType;
  void* owner = nullptr;
};

// What a call returned: kOk, or a failure whose message lives until the next
// failing call on this thread.
enum StatusKind : int32_t { kOk = 0, kHandgradError = 1, kOutOfMemory = 2, kOtherError = 3 };
struct Status {
  int32_t kind = kOk;
  const char* message = nullptr;
};

// Every function is noexcept. `stream` is PyTorch's current CUDA stream
// (cudaStream_t as an integer; ignored for CPU tensors). Semantics: the _torch_*
// entry points of handgrad._C (python/src/torch_ops.cpp), with LayerNorm's mean
// and rstd in memory the extension allocated.
struct Api {
  uint32_t version;
  uint32_t size;  // sizeof(Api)
  Status (*layernorm_forward)(const TensorFacts& x, const TensorFacts& weight, const TensorFacts& bias, double eps,
                              const TensorFacts& y, const TensorFacts& mean, const TensorFacts& rstd, intptr_t stream);
  Status (*layernorm_backward)(const TensorFacts& dy, const TensorFacts& x, const TensorFacts& weight,
                               const TensorFacts& mean, const TensorFacts& rstd, const TensorFacts& dx,
                               const TensorFacts& dweight, const TensorFacts& dbias, intptr_t stream);
  // mask may be nullptr (no mask).
  Status (*softmax_forward)(const TensorFacts& scores, const TensorFacts* mask, bool causal, double scale,
                            const TensorFacts& y, intptr_t stream);
  Status (*softmax_backward)(const TensorFacts& dy, const TensorFacts& y, double scale, const TensorFacts& dx,
                             intptr_t stream);
  // *saved: handgrad's CrossEntropySaved, which may view logits and targets
  // without owning them; free it with free_cross_entropy_saved.
  Status (*cross_entropy_forward)(const TensorFacts& logits, const TensorFacts& targets, int64_t ignore_index,
                                  intptr_t stream, OwnedTensor* loss, void** saved);
  Status (*cross_entropy_backward)(const void* saved, const TensorFacts& logits, double dloss, intptr_t stream,
                                   OwnedTensor* dlogits);
  void (*free_cross_entropy_saved)(void* saved);
  void (*release)(void* owner);
};

}  // namespace hg::python::torch_bridge

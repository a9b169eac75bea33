#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

class Module;

// A trainable tensor and its gradient (same shape, dtype, device).
// Modules accumulate into grad in backward(); zero_grad() clears it.
// Under bf16 precision a module that feeds the value to a GEMM also keeps a
// bf16 copy in `compute` (made by bf16_copy() on first use, or beforehand by
// make_bf16_copies); every optimizer step and Module::load refresh it,
// Module::to drops it. value and grad stay f32.
struct Parameter {
  Tensor value;
  Tensor grad;
  Tensor compute;  // undefined unless bf16_copy() made it
};

// The bf16 copy of p.value, made on first use on value's device.
const Tensor& bf16_copy(Parameter& p);
// The bf16 copies of every parameter of `params` (values on one device) made
// now, cut out of one buffer (core/packed_tensors.hpp) instead of one
// allocation each at first use.
void make_bf16_copies(const std::vector<Parameter*>& params);
// Rewrites p.compute from p.value when the copy exists (one cast pass).
void refresh_compute_copy(Parameter& p);
// Sets every grad of `params` to 0 with one Backend::zero_multi per device:
// one launch on CUDA however many parameters. `op` names the caller in errors.
void zero_grads(const std::vector<Parameter*>& params, const char* op);

// Told, during a backward, which parameters' gradients have just become
// final (nothing later in that backward adds to them): data parallelism
// starts reducing them while the rest of the backward runs (dist/grad_reducer.hpp).
using GradsReadyHook = std::function<void(const std::vector<Parameter*>& final_params)>;
// Told, before a module's forward, that its parameter values are about to be
// read: ZeRO-1 waits there for the all-gathers that bring them
// (dist/grad_reducer.hpp), so the gathers of later modules run behind the
// forward of earlier ones.
using ValuesNeededHook = std::function<void(Module& about_to_run)>;

// Base of every layer. A module owns its Parameters and child modules as
// plain members and registers them by name, so named_parameters() walks the
// tree ("layers.0.attn.qkv.weight"). Each subclass defines its own
// forward(...) and backward(dy): forward caches what backward needs,
// backward accumulates parameter grads and returns the input gradient.
// Modules are not copyable (registrations point at members).
class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  std::vector<Parameter*> parameters();
  int64_t num_parameters();

  void zero_grad();
  // Moves values and grads of the whole tree, each into one buffer per dtype
  // (core/packed_tensors.hpp); a tree already on `device` keeps its tensors.
  void to(Device device);
  void to(DType dtype);  // casts values and grads (e.g. F64 for gradient checks)
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // One file holds every parameter by name. Written to "<path>.tmp" and
  // renamed, so a crash never leaves a half-written checkpoint; load()
  // verifies names, shapes, dtypes and a checksum before touching any value.
  // A training step >= 0 passed to save() is stored with the parameters (as
  // the record "@step") and returned by load(); -1 when the file has none.
  // Training programs compare it with the optimizer state's step count.
  void save(const std::string& path, int64_t step = -1);
  int64_t load(const std::string& path);

 protected:
  // Registers `p` (a member) under `name`; value is `init`, grad zeros like it.
  Parameter& register_parameter(const std::string& name, Parameter& p, Tensor init);
  void register_module(const std::string& name, Module& child);
  // Called by train()/to() for modules with non-parameter state to move.
  virtual void on_device_change(Device) {}

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>& out);
  void device_changed(Device device);  // on_device_change of this module and every descendant
  std::vector<std::pair<std::string, Parameter*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace hg

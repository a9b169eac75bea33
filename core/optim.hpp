#pragma once
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/module.hpp"

namespace hg {

// Optimizers update Parameter::value from Parameter::grad in place, on the
// parameters' device, through its Backend (sgd_update per parameter;
// AdamW: one adamw_multi over all parameters, 3 launches on CUDA).
class Optimizer {
 public:
  explicit Optimizer(std::vector<Parameter*> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  int64_t steps() const { return steps_; }
  const std::vector<Parameter*>& parameters() const { return params_; }
  // True when step() can be captured in a CUDA graph: it reads its per-step
  // scalars (learning rate, step count) from device memory and skips the
  // update on a non-finite gradient norm without the host. False here.
  virtual bool capturable() const { return false; }
  // For a capturable optimizer whose step() a CUDA graph replays: the lr goes
  // to the device before each replay, and the host's step count follows it.
  virtual void write_lr_to_device() {}
  virtual void step_replayed() { ++steps_; }
  // The last step's global L2 gradient norm before clipping (NaN where the
  // optimizer does not compute one: SGD), and whether that norm was not
  // finite so the step left every parameter unchanged.
  virtual double last_grad_norm() const;
  virtual bool last_step_skipped() const { return false; }
  // Both, read together (one copy from the device for AdamW).
  struct StepReport {
    double grad_norm = std::nan("");
    bool skipped = false;
  };
  virtual StepReport last_step_report() const { return {last_grad_norm(), last_step_skipped()}; }

  // The step count and every per-parameter buffer (momentum, Adam moments),
  // so a resumed run continues exactly where it stopped. Same file format and
  // crash-safe write as Module::save; load_state checks the buffer names,
  // shapes and dtypes against this optimizer before changing anything.
  // Virtual: a sharded optimizer (dist/sharded_adamw.hpp) gathers its state
  // into this same per-parameter format, collectively on every rank.
  virtual void save_state(const std::string& path);
  virtual void load_state(const std::string& path);
  // load_state's checks and restore, from records already read ("steps" and
  // the state tensors by name); `source` names them in errors.
  void restore_state(const std::map<std::string, Tensor>& entries, const std::string& source);
  // The named state tensors (empty names: none), as state_buffers().
  std::vector<std::pair<std::string, Tensor*>> named_state() { return state_buffers(); }

 protected:
  // Rewrites every parameter's bf16 compute copy after an update (no-op in fp32).
  void refresh_compute_copies();
  // Named state tensors, in parameter order ("m.3", "v.3", ...); empty where none.
  virtual std::vector<std::pair<std::string, Tensor*>> state_buffers() = 0;
  // Called after load_state has restored steps_ and the buffers.
  virtual void on_state_loaded() {}

  std::vector<Parameter*> params_;
  double lr_ = 1e-3;
  int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;      // v = momentum * v + g ; p -= lr * v
  double weight_decay = 0.0;  // L2 added to the gradient: g += wd * p
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Parameter*> params, SGDOptions options);
  void step() override;

 private:
  std::vector<std::pair<std::string, Tensor*>> state_buffers() override;
  SGDOptions options_;
  std::vector<Tensor> velocity_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: p -= lr * wd * p
  double max_grad_norm = 0.0;  // > 0: clip the global grad norm to it inside step(); 0: off
};

// Loshchilov & Hutter's AdamW with bias correction, one Backend::adamw_multi
// per step over all parameters (clipping included when max_grad_norm > 0).
// The step reads lr, the step count and the clip scale from a device-side
// state, so once a step has run (uploading the tensor table), step() issues
// only device work and can be captured in a CUDA graph. For graph replays:
// call write_lr_to_device() after set_lr and before the replay (it is one
// fill launch, and a no-op when lr has not changed since the last write).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions options);
  void step() override;

  // BF16 compute copies of the parameters (one per parameter, undefined where
  // none), rewritten from the new fp32 value in the same pass as the update.
  void set_compute_copies(std::vector<Tensor> copies);
  // step() reads lr and the step count from device memory: capturable in a CUDA graph.
  bool capturable() const override { return true; }
  // One fill launch, and a no-op when lr has not changed since the last write.
  void write_lr_to_device() override;
  // Read back from the device (synchronises).
  double last_grad_norm() const override;
  bool last_step_skipped() const override;
  StepReport last_step_report() const override;

 private:
  std::vector<std::pair<std::string, Tensor*>> state_buffers() override;
  void on_state_loaded() override;
  AdamWConfig config_() const;
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
  AdamWGroup group_;       // views of params, grads, m, v (+ compute copies)
  Tensor state_;           // F64 (kAdamWStateSize,) on the parameters' device
  double device_lr_ = -1;  // the lr last written into state_
};

// Clips the global L2 norm of all grads to max_norm; returns the norm before clipping.
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm);

}  // namespace hg

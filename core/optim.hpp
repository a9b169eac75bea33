#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/module.hpp"

namespace hg {

// Optimizers update Parameter::value from Parameter::grad in place, on the
// parameter's own device (one fused kernel per parameter on CUDA).
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

  // The step count and every per-parameter buffer (momentum, Adam moments),
  // so a resumed run continues exactly where it stopped. Same file format and
  // crash-safe write as Module::save; load_state checks the buffer names,
  // shapes and dtypes against this optimizer before changing anything.
  void save_state(const std::string& path);
  void load_state(const std::string& path);

 protected:
  // Rewrites every parameter's bf16 compute copy after an update (no-op in fp32).
  void refresh_compute_copies();
  // Named state tensors, in parameter order ("m.3", "v.3", ...); empty where none.
  virtual std::vector<std::pair<std::string, Tensor*>> state_buffers() = 0;

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
};

// Loshchilov & Hutter's AdamW with bias correction.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions options);
  void step() override;

 private:
  std::vector<std::pair<std::string, Tensor*>> state_buffers() override;
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
};

// Clips the global L2 norm of all grads to max_norm; returns the norm before clipping.
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm);

}  // namespace hg

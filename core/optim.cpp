#include "core/optim.hpp"

#include <cmath>
#include <map>

#include "core/checkpoint.hpp"

#ifdef HG_WITH_CUDA
#include "cuda/optim_kernels.hpp"  // hg::gpu::sgd_step / adamw_step / sum_of_squares / scale_inplace
#endif

namespace hg {

namespace {

// The parameter's grad must be its twin: same shape, dtype and device.
void check_param(const Parameter& p, const char* op) {
  p.value.check_defined(op);
  p.grad.check_defined(op);
  check_same_shape(op, p.value, p.grad);
  check_same_dtype(op, p.value, p.grad);
  check_same_device(op, p.value, p.grad);
  if (p.value.dtype() != DType::F32 && p.value.dtype() != DType::F64)
    fail(op, "parameters must be f32 or f64, got ", dtype_name(p.value.dtype()), " tensor ", p.value.shape());
  if (p.value.is_cuda() && p.value.dtype() != DType::F32)
    fail(op, "CUDA parameters must be f32, got ", dtype_name(p.value.dtype()), " tensor ", p.value.shape());
}

#ifndef HG_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) { fail(op, "CUDA parameter but handgrad was built without CUDA"); }
#endif

template <class T>
void sgd_cpu(T* p, const T* g, T* v, int64_t n, double lr, double momentum, double wd) {
  for (int64_t i = 0; i < n; ++i) {
    const double grad = static_cast<double>(g[i]) + wd * static_cast<double>(p[i]);
    double step = grad;
    if (v != nullptr) {
      v[i] = static_cast<T>(momentum * static_cast<double>(v[i]) + grad);
      step = v[i];
    }
    p[i] = static_cast<T>(static_cast<double>(p[i]) - lr * step);
  }
}

template <class T>
void adamw_cpu(T* p, const T* g, T* m, T* v, int64_t n, const AdamWOptions& o, double lr, double bc1, double bc2) {
  for (int64_t i = 0; i < n; ++i) {
    double param = static_cast<double>(p[i]) * (1.0 - lr * o.weight_decay);  // decoupled decay
    const double grad = g[i];
    const double m1 = o.beta1 * static_cast<double>(m[i]) + (1.0 - o.beta1) * grad;
    const double v1 = o.beta2 * static_cast<double>(v[i]) + (1.0 - o.beta2) * grad * grad;
    m[i] = static_cast<T>(m1);
    v[i] = static_cast<T>(v1);
    param -= lr * (m1 / bc1) / (std::sqrt(v1 / bc2) + o.eps);
    p[i] = static_cast<T>(param);
  }
}

template <class T> double sum_of_squares_cpu(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

template <class T> void scale_cpu(T* x, int64_t n, double s) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<double>(x[i]) * s);
}

}  // namespace

void Optimizer::refresh_compute_copies() {
  for (Parameter* p : params_) refresh_compute_copy(*p);
}

void Optimizer::zero_grad() {
  for (Parameter* p : params_) {
    p->grad.check_defined("Optimizer::zero_grad");
    p->grad.fill_(0.0);
  }
}

// ---- state files ----

void Optimizer::save_state(const std::string& path) {
  std::vector<CheckpointRecord> records;
  records.push_back({"steps", Tensor::from_vector({static_cast<double>(steps_)}, {1}, DType::F64)});
  for (const auto& [name, t] : state_buffers()) records.push_back({name, *t});
  write_checkpoint_file(path, records, "Optimizer::save_state");
}

void Optimizer::load_state(const std::string& path) {
  constexpr const char* kOp = "Optimizer::load_state";
  const std::map<std::string, Tensor> entries = read_checkpoint_file(path, kOp);
  const auto buffers = state_buffers();
  // Everything is checked before anything is written.
  HG_CHECK(entries.size() == buffers.size() + 1 && entries.count("steps") && entries.at("steps").numel() == 1, kOp,
           path, ": expected 'steps' and ", buffers.size(), " state tensors, the file has ", entries.size(),
           " tensors");
  const double steps = entries.at("steps").to_vector()[0];
  HG_CHECK(steps >= 0 && steps == static_cast<double>(static_cast<int64_t>(steps)), kOp, path, ": bad step count ",
           steps);
  for (const auto& [name, t] : buffers) {
    const auto it = entries.find(name);
    HG_CHECK(it != entries.end(), kOp, path, ": state tensor '", name, "' missing from the file");
    HG_CHECK(it->second.shape() == t->shape() && it->second.dtype() == t->dtype(), kOp, path, ": '", name,
             "' is ", dtype_name(it->second.dtype()), " of shape ", it->second.shape(),
             " in the file but ", dtype_name(t->dtype()), " of shape ", t->shape(), " here");
  }
  for (const auto& [name, t] : buffers) t->copy_(entries.at(name));
  steps_ = static_cast<int64_t>(steps);
}

// ---- SGD ----

SGD::SGD(std::vector<Parameter*> params, SGDOptions options) : Optimizer(std::move(params)), options_(options) {
  HG_CHECK(options.lr >= 0, "SGD", "lr must be >= 0, got ", options.lr);
  HG_CHECK(options.momentum >= 0, "SGD", "momentum must be >= 0, got ", options.momentum);
  HG_CHECK(options.weight_decay >= 0, "SGD", "weight_decay must be >= 0, got ", options.weight_decay);
  lr_ = options.lr;
  for (Parameter* p : params_) {
    check_param(*p, "SGD");
    // Zero velocity makes the first step v = g, as in PyTorch.
    velocity_.push_back(options.momentum != 0
                            ? Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device())
                            : Tensor());
  }
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    check_param(p, "SGD::step");
    Tensor& v = velocity_[i];
    const int64_t n = p.value.numel();
    if (p.value.is_cuda()) {
#ifdef HG_WITH_CUDA
      gpu::sgd_step(p.value.data<float>(), p.grad.data<float>(), v.defined() ? v.data<float>() : nullptr, n,
                    static_cast<float>(lr_), static_cast<float>(options_.momentum),
                    static_cast<float>(options_.weight_decay));
#else
      no_cuda("SGD::step");
#endif
    } else if (p.value.dtype() == DType::F32) {
      sgd_cpu(p.value.data<float>(), p.grad.data<float>(), v.defined() ? v.data<float>() : nullptr, n, lr_,
              options_.momentum, options_.weight_decay);
    } else {
      sgd_cpu(p.value.data<double>(), p.grad.data<double>(), v.defined() ? v.data<double>() : nullptr, n, lr_,
              options_.momentum, options_.weight_decay);
    }
  }
  refresh_compute_copies();
  ++steps_;
}

std::vector<std::pair<std::string, Tensor*>> SGD::state_buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < velocity_.size(); ++i)
    if (velocity_[i].defined()) out.emplace_back("velocity." + std::to_string(i), &velocity_[i]);
  return out;
}

// ---- AdamW ----

AdamW::AdamW(std::vector<Parameter*> params, AdamWOptions options) : Optimizer(std::move(params)), options_(options) {
  HG_CHECK(options.lr >= 0, "AdamW", "lr must be >= 0, got ", options.lr);
  HG_CHECK(options.beta1 >= 0 && options.beta1 < 1, "AdamW", "beta1 must be in [0, 1), got ", options.beta1);
  HG_CHECK(options.beta2 >= 0 && options.beta2 < 1, "AdamW", "beta2 must be in [0, 1), got ", options.beta2);
  HG_CHECK(options.eps > 0, "AdamW", "eps must be > 0, got ", options.eps);
  HG_CHECK(options.weight_decay >= 0, "AdamW", "weight_decay must be >= 0, got ", options.weight_decay);
  lr_ = options.lr;
  for (Parameter* p : params_) {
    check_param(*p, "AdamW");
    m_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device()));
    v_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device()));
  }
}

void AdamW::step() {
  const double t = static_cast<double>(steps_ + 1);
  const double bc1 = 1.0 - std::pow(options_.beta1, t);
  const double bc2 = 1.0 - std::pow(options_.beta2, t);
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    check_param(p, "AdamW::step");
    const int64_t n = p.value.numel();
    if (p.value.is_cuda()) {
#ifdef HG_WITH_CUDA
      gpu::adamw_step(p.value.data<float>(), p.grad.data<float>(), m_[i].data<float>(), v_[i].data<float>(), n,
                      static_cast<float>(lr_), static_cast<float>(options_.beta1),
                      static_cast<float>(options_.beta2), static_cast<float>(options_.eps),
                      static_cast<float>(options_.weight_decay), static_cast<float>(bc1), static_cast<float>(bc2));
#else
      no_cuda("AdamW::step");
#endif
    } else if (p.value.dtype() == DType::F32) {
      adamw_cpu(p.value.data<float>(), p.grad.data<float>(), m_[i].data<float>(), v_[i].data<float>(), n, options_,
                lr_, bc1, bc2);
    } else {
      adamw_cpu(p.value.data<double>(), p.grad.data<double>(), m_[i].data<double>(), v_[i].data<double>(), n,
                options_, lr_, bc1, bc2);
    }
  }
  refresh_compute_copies();
  ++steps_;
}

std::vector<std::pair<std::string, Tensor*>> AdamW::state_buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < m_.size(); ++i) {
    out.emplace_back("m." + std::to_string(i), &m_[i]);
    out.emplace_back("v." + std::to_string(i), &v_[i]);
  }
  return out;
}

// ---- gradient clipping ----

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm) {
  HG_CHECK(max_norm > 0, "clip_grad_norm", "max_norm must be > 0, got ", max_norm);
  double total = 0;
  for (Parameter* p : params) {
    check_param(*p, "clip_grad_norm");
    const int64_t n = p->grad.numel();
    if (p->grad.is_cuda()) {
#ifdef HG_WITH_CUDA
      total += gpu::sum_of_squares(p->grad.data<float>(), n);
#else
      no_cuda("clip_grad_norm");
#endif
    } else if (p->grad.dtype() == DType::F32) {
      total += sum_of_squares_cpu(p->grad.data<float>(), n);
    } else {
      total += sum_of_squares_cpu(p->grad.data<double>(), n);
    }
  }
  const double norm = std::sqrt(total);
  // A non-finite norm has no meaningful scale: leave grads alone and let the caller see it and skip the step.
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const double scale = max_norm / norm;
  for (Parameter* p : params) {
    const int64_t n = p->grad.numel();
    if (p->grad.is_cuda()) {
#ifdef HG_WITH_CUDA
      gpu::scale_inplace(p->grad.data<float>(), n, static_cast<float>(scale));
#endif
    } else if (p->grad.dtype() == DType::F32) {
      scale_cpu(p->grad.data<float>(), n, scale);
    } else {
      scale_cpu(p->grad.data<double>(), n, scale);
    }
  }
  return norm;
}

}  // namespace hg

#include "core/optim.hpp"

#include <cmath>
#include <map>

#include "core/backend.hpp"
#include "core/checkpoint.hpp"
#include "core/optimizer_ops.hpp"
#include "core/packed_tensors.hpp"

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

// Every parameter on one device (the one of the first): the optimizer's
// device work runs on that device's backend.
Device device_of(const std::vector<Parameter*>& params, const char* op) {
  if (params.empty()) return Device::CPU;
  const Device d = params[0]->value.device();
  for (size_t i = 0; i < params.size(); ++i)
    HG_CHECK(params[i]->value.device() == d, op, "parameter ", i, " ", params[i]->value.shape(), " is on ",
             device_name(params[i]->value.device()), " but parameter 0 is on ", device_name(d),
             "; one optimizer updates parameters of one device");
  return d;
}

// Writes one element of an F64 state tensor on its device (one fill launch).
void set_state(Tensor& state, int index, double value) {
  Tensor slot = state.slice(index, index + 1);
  backend_for(state.device()).fill(slot, value);
}

}  // namespace

void Optimizer::refresh_compute_copies() {
  for (Parameter* p : params_) refresh_compute_copy(*p);
}

void Optimizer::zero_grad() { zero_grads(params_, "Optimizer::zero_grad"); }

// ---- state files ----

void Optimizer::save_state(const std::string& path) {
  std::vector<CheckpointRecord> records;
  records.push_back({"steps", Tensor::from_vector({static_cast<double>(steps_)}, {1}, DType::F64)});
  for (const auto& [name, t] : state_buffers()) records.push_back({name, *t});
  write_checkpoint_file(path, records, "Optimizer::save_state");
}

void Optimizer::load_state(const std::string& path) {
  restore_state(read_checkpoint_file(path, "Optimizer::load_state"), path);
}

void Optimizer::restore_state(const std::map<std::string, Tensor>& entries, const std::string& path) {
  constexpr const char* kOp = "Optimizer::load_state";
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
    HG_CHECK(it->second.shape() == t->shape() && it->second.dtype() == t->dtype(), kOp, path, ": '", name, "' is ",
             dtype_name(it->second.dtype()), " of shape ", it->second.shape(), " in the file but ",
             dtype_name(t->dtype()), " of shape ", t->shape(), " here");
  }
  for (const auto& [name, t] : buffers) t->copy_(entries.at(name));
  steps_ = static_cast<int64_t>(steps);
  on_state_loaded();
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
    velocity_.push_back(options.momentum != 0 ? Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device())
                                              : Tensor());
  }
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    check_param(p, "SGD::step");
    Tensor& v = velocity_[i];
    backend_for(p.value.device())
        .sgd_update(p.value, p.grad, v.defined() ? &v : nullptr, lr_, options_.momentum, options_.weight_decay);
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

double Optimizer::last_grad_norm() const { return std::nan(""); }

// ---- AdamW ----

AdamW::AdamW(std::vector<Parameter*> params, AdamWOptions options) : Optimizer(std::move(params)), options_(options) {
  HG_CHECK(options.lr >= 0, "AdamW", "lr must be >= 0, got ", options.lr);
  HG_CHECK(options.beta1 >= 0 && options.beta1 < 1, "AdamW", "beta1 must be in [0, 1), got ", options.beta1);
  HG_CHECK(options.beta2 >= 0 && options.beta2 < 1, "AdamW", "beta2 must be in [0, 1), got ", options.beta2);
  HG_CHECK(options.eps > 0, "AdamW", "eps must be > 0, got ", options.eps);
  HG_CHECK(options.weight_decay >= 0, "AdamW", "weight_decay must be >= 0, got ", options.weight_decay);
  HG_CHECK(options.max_grad_norm >= 0 && std::isfinite(options.max_grad_norm), "AdamW",
           "max_grad_norm must be finite and >= 0 (0 = no clipping), got ", options.max_grad_norm);
  lr_ = options.lr;
  std::vector<Tensor> values;
  for (Parameter* p : params_) {
    check_param(*p, "AdamW");
    values.push_back(p->value);
  }
  // Each moment in one buffer per dtype (core/packed_tensors.hpp).
  const Device device = device_of(params_, "AdamW");
  m_ = packed_zeros_like(values, device);
  v_ = packed_zeros_like(values, device);
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    group_.params.push_back(p->value);
    group_.grads.push_back(p->grad);
    group_.m.push_back(m_[i]);
    group_.v.push_back(v_[i]);
  }
  state_ = Tensor::zeros({kAdamWStateSize}, DType::F64, device);
}

void AdamW::set_compute_copies(std::vector<Tensor> copies) {
  HG_CHECK(copies.empty() || copies.size() == params_.size(), "AdamW::set_compute_copies", "got ", copies.size(),
           " copies for ", params_.size(), " parameters (give one per parameter, undefined where none)");
  group_.compute_copies = std::move(copies);
  const AdamWConfig config = config_();
  check_adamw_group(group_, config, state_, !state_.is_cuda(), "AdamW::set_compute_copies");
}

AdamWConfig AdamW::config_() const {
  AdamWConfig c;
  c.beta1 = options_.beta1;
  c.beta2 = options_.beta2;
  c.eps = options_.eps;
  c.weight_decay = options_.weight_decay;
  c.max_grad_norm = options_.max_grad_norm;
  return c;
}

void AdamW::write_lr_to_device() {
  if (device_lr_ == lr_) return;
  set_state(state_, kAdamWLr, lr_);
  device_lr_ = lr_;
}

void AdamW::step() {
  // Re-read the parameters' tensors: a module may have replaced them since.
  for (size_t i = 0; i < params_.size(); ++i) {
    check_param(*params_[i], "AdamW::step");
    group_.params[i] = params_[i]->value;
    group_.grads[i] = params_[i]->grad;
  }
  // bf16 compute copies the modules made (Parameter::compute) are rewritten in the same pass.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i]->compute.defined()) continue;
    group_.compute_copies.resize(params_.size());
    group_.compute_copies[i] = params_[i]->compute;
  }
  write_lr_to_device();
  backend_for(state_.device()).adamw_multi(group_, config_(), state_);
  ++steps_;
}

double AdamW::last_grad_norm() const { return last_step_report().grad_norm; }
bool AdamW::last_step_skipped() const { return last_step_report().skipped; }
Optimizer::StepReport AdamW::last_step_report() const {
  const Tensor state = state_.to(Device::CPU);
  return {state.data<double>()[kAdamWGradNorm], state.data<double>()[kAdamWSkipped] != 0};
}

void AdamW::on_state_loaded() { set_state(state_, kAdamWStep, static_cast<double>(steps_)); }

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
  std::vector<Tensor> grads;
  for (Parameter* p : params) {
    check_param(*p, "clip_grad_norm");
    grads.push_back(p->grad);
  }
  const Device device = device_of(params, "clip_grad_norm");
  Tensor total = Tensor::zeros({1}, DType::F64, device);
  backend_for(device).sum_of_squares(grads, total);
  const double norm = std::sqrt(total.item());
  // A non-finite norm has no meaningful scale: leave grads alone and let the caller see it and skip the step.
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const double scale = max_norm / norm;
  Tensor factor;  // made once per dtype, not per gradient (one fill launch each on CUDA)
  for (Tensor& g : grads) {
    if (!factor.defined() || factor.dtype() != g.dtype()) factor = Tensor::full({1}, scale, g.dtype(), device);
    backend_for(device).zip(BinaryOp::Mul, g, factor, g);
  }
  return norm;
}

}  // namespace hg

#include "core/module.hpp"

#include <cmath>
#include <map>

#include "core/backend.hpp"
#include "core/checkpoint.hpp"
#include "core/packed_tensors.hpp"

namespace hg {

// ---- bf16 compute copies ----

const Tensor& bf16_copy(Parameter& p) {
  p.value.check_defined("bf16_copy");
  if (!p.compute.defined() || p.compute.device() != p.value.device() || p.compute.shape() != p.value.shape())
    p.compute = p.value.to(DType::BF16);
  return p.compute;
}

void make_bf16_copies(const std::vector<Parameter*>& params) {
  if (params.empty()) return;
  std::vector<Tensor> values;
  for (Parameter* p : params) {
    p->value.check_defined("make_bf16_copies");
    check_same_device("make_bf16_copies", params.front()->value, p->value);
    values.push_back(p->value);
  }
  const std::vector<Tensor> copies = packed_copies(values, params.front()->value.device(), DType::BF16);
  for (size_t i = 0; i < params.size(); ++i) params[i]->compute = copies[i];
}

void refresh_compute_copy(Parameter& p) {
  if (p.compute.defined()) p.compute.copy_(p.value);
}

void zero_grads(const std::vector<Parameter*>& params, const char* op) {
  std::vector<Tensor> on_cpu, on_cuda;  // every grad checked before any is cleared
  for (Parameter* p : params) {
    p->grad.check_defined(op);
    (p->grad.device() == Device::CPU ? on_cpu : on_cuda).push_back(p->grad);
  }
  if (!on_cpu.empty()) backend_for(Device::CPU).zero_multi(on_cpu);
  if (!on_cuda.empty()) backend_for(Device::CUDA).zero_multi(on_cuda);
}

// ---- the tree ----

Parameter& Module::register_parameter(const std::string& name, Parameter& p, Tensor init) {
  init.check_defined("Module::register_parameter");
  for (const auto& entry : params_)
    if (entry.first == name) fail("Module::register_parameter", "parameter '", name, "' registered twice");
  p.value = std::move(init);
  p.grad = Tensor::zeros(p.value.shape(), p.value.dtype(), p.value.device());
  params_.emplace_back(name, &p);
  return p;
}

void Module::register_module(const std::string& name, Module& child) {
  for (const auto& entry : children_)
    if (entry.first == name) fail("Module::register_module", "child module '", name, "' registered twice");
  if (&child == this) fail("Module::register_module", "module '", name, "' cannot be its own child");
  children_.emplace_back(name, &child);
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>& out) {
  for (auto& [name, p] : params_) out.emplace_back(prefix + name, p);
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect("", out);
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& entry : named_parameters()) out.push_back(entry.second);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

void Module::zero_grad() { zero_grads(parameters(), "Module::zero_grad"); }

void Module::to(Device device) {
  const std::vector<Parameter*> params = parameters();
  std::vector<Tensor> values, grads;
  bool moves = false;  // a tree already on `device` keeps its tensors, as Tensor::to does
  for (Parameter* p : params) {
    values.push_back(p->value);
    grads.push_back(p->grad);
    moves = moves || p->value.device() != device || p->grad.device() != device;
  }
  if (moves) {
    // The whole tree's values, and its gradients, each in one buffer per
    // dtype (core/packed_tensors.hpp: no allocator rounding per parameter).
    values = packed_copies(values, device);
    grads = packed_copies(grads, device);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->value = values[i];
    params[i]->grad = grads[i];
    params[i]->compute = Tensor();  // remade on the new device at first use
  }
  device_changed(device);
}

void Module::device_changed(Device device) {
  on_device_change(device);
  for (auto& entry : children_) entry.second->device_changed(device);
}

void Module::to(DType dtype) {
  for (Parameter* p : parameters()) {
    p->value = p->value.to(dtype);
    p->grad = p->grad.to(dtype);
    p->compute = Tensor();
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& entry : children_) entry.second->train(on);
}

// ---- checkpoints ----
// The format and the crash-safe file I/O live in core/checkpoint.cpp; here:
// matching the file's records against this module before touching any value.

namespace {
constexpr const char* kStepRecord = "@step";  // '@' never occurs in a parameter name
}

void Module::save(const std::string& path, int64_t step) {
  std::vector<CheckpointRecord> records;
  for (const auto& [name, p] : named_parameters()) records.push_back({name, p->value});
  if (step >= 0) records.push_back({kStepRecord, Tensor::from_vector({static_cast<double>(step)}, {1}, DType::F64)});
  write_checkpoint_file(path, records, "Module::save");
}

int64_t Module::load(const std::string& path) {
  std::map<std::string, Tensor> entries = read_checkpoint_file(path, "Module::load");
  int64_t step = -1;
  if (const auto it = entries.find(kStepRecord); it != entries.end()) {
    const std::vector<double> v = it->second.to_vector();
    HG_CHECK(v.size() == 1 && v[0] >= 0 && v[0] < 9e15 && v[0] == std::floor(v[0]), "Module::load", path,
             ": the '@step' record is not one non-negative integer");
    step = static_cast<int64_t>(v[0]);
    entries.erase(it);
  }

  // Verify every parameter against the file before writing any of them.
  const auto named = named_parameters();
  std::map<std::string, Parameter*> by_name(named.begin(), named.end());
  for (const auto& entry : entries)
    if (!by_name.count(entry.first))
      fail("Module::load", path, ": tensor '", entry.first, "' in the file is not a parameter of the module (file has ",
           entries.size(), " tensors, module has ", named.size(), " parameters)");
  for (const auto& [name, p] : named) {
    const auto it = entries.find(name);
    if (it == entries.end())
      fail("Module::load", path, ": parameter '", name, "' missing from the file (file has ", entries.size(),
           " tensors, module has ", named.size(), " parameters)");
    const Tensor& e = it->second;
    if (e.dtype() != p->value.dtype())
      fail("Module::load", path, ": '", name, "' is ", dtype_name(e.dtype()), " in the file but ",
           dtype_name(p->value.dtype()), " in the module");
    if (e.shape() != p->value.shape())
      fail("Module::load", path, ": '", name, "' has shape ", e.shape(), " in the file but ", p->value.shape(),
           " in the module");
  }
  for (const auto& [name, p] : named) {
    p->value.copy_(entries.at(name));
    refresh_compute_copy(*p);
  }
  return step;
}

}  // namespace hg

#include "models/weight_grads_beside.hpp"

#include <atomic>

#include "core/error.hpp"

namespace hg {
namespace {
std::atomic<WeightGradsBeside*> g_open{nullptr};
}  // namespace

WeightGradsBeside::WeightGradsBeside() {
  WeightGradsBeside* none = nullptr;
  HG_CHECK(g_open.compare_exchange_strong(none, this), "WeightGradsBeside",
           "another scope is open; finish and close it first");
}

WeightGradsBeside::~WeightGradsBeside() {
  pending_.reset();  // joins (quietly) what is still queued
  kept_.clear();
  g_open.store(nullptr);
}

void WeightGradsBeside::finish() {
  if (pending_) pending_->join();
  pending_.reset();
  kept_.clear();  // released after the join: later allocations are ordered after the work
}

bool WeightGradsBeside::run(const std::function<void()>& work, std::vector<Tensor> keep) {
  WeightGradsBeside* scope = g_open.load();
  if (scope == nullptr) return false;
  scope->finish();
  scope->pending_.emplace(work);
  scope->kept_ = std::move(keep);
  return true;
}

}  // namespace hg

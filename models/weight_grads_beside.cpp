#include "models/weight_grads_beside.hpp"

#include <atomic>

#include "core/error.hpp"
#include "core/param_grad_queue.hpp"

namespace hg {
namespace {
std::atomic<WeightGradsBeside*> g_open{nullptr};
}  // namespace

WeightGradsBeside::WeightGradsBeside() {
  WeightGradsBeside* none = nullptr;
  HG_CHECK(g_open.compare_exchange_strong(none, this), "WeightGradsBeside",
           "another scope is open; finish and close it first");
  set_param_grad_queue(&WeightGradsBeside::take);
}

WeightGradsBeside::~WeightGradsBeside() {
  set_param_grad_queue(nullptr);
  pending_.reset();  // joins (quietly) what is still queued
  kept_.clear();
  queued_.clear();
  // Work still waiting runs now, so that no gradient is left half summed
  // (its launches fail quietly with the error that ended the scope, if any).
  for (std::function<void()>& w : waiting_) try {
      w();
    } catch (...) {
    }
  g_open.store(nullptr);
}

void WeightGradsBeside::join_pending() {
  if (pending_) pending_->join();
  pending_.reset();
  kept_.clear();  // released after the join: later allocations are ordered after the work
  queued_.clear();
}

void WeightGradsBeside::finish() {
  join_pending();
  std::vector<std::function<void()>> waiting = std::move(waiting_);
  waiting_.clear();
  for (std::function<void()>& w : waiting) w();  // on handgrad's stream
}

bool WeightGradsBeside::take(std::function<void()>& work) {
  WeightGradsBeside* scope = g_open.load();
  if (scope == nullptr) return false;
  scope->waiting_.push_back(std::move(work));
  return true;
}

bool WeightGradsBeside::run(const std::function<void()>& work, std::vector<Tensor> keep) {
  WeightGradsBeside* scope = g_open.load();
  if (scope == nullptr) return false;
  scope->join_pending();
  std::vector<std::function<void()>> waiting = std::move(scope->waiting_);
  scope->waiting_.clear();
  scope->pending_.emplace([&] {
    for (std::function<void()>& w : waiting) w();
    work();
  });
  scope->queued_ = std::move(waiting);
  scope->kept_ = std::move(keep);
  return true;
}

}  // namespace hg

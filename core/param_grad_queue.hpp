#pragma once
// Work that only writes parameter gradients, which nothing reads before the
// optimizer step: LayerNorm's reduction of its dgamma / dbeta partial sums
// into the module's grads (cuda/layernorm.cu). While a queue is set (the
// weight-gradient scope of a training step's backward,
// models/weight_grads_beside.hpp) the work goes there and runs beside the
// backward's next kernels; otherwise it runs at once. The closure owns what
// it reads (its captures) until it has run.
#include <functional>

namespace hg {

// Takes `work` (returns true) or leaves it to the caller (false).
using ParamGradQueue = bool (*)(std::function<void()>& work);

void set_param_grad_queue(ParamGradQueue queue);  // nullptr: none
void run_param_grad_work(std::function<void()> work);

}  // namespace hg

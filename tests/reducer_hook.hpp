#pragma once
// The gradient reducer as TrainStep's data-parallel hook, wired as
// examples/common/data_parallel.cpp wires it (dist/ cannot see models/).
#include "dist/grad_reducer.hpp"
#include "models/train_step.hpp"

namespace hg::test {

struct ReducerHook : DataParallelHook {
  dist::GradReducer& reducer;
  explicit ReducerHook(dist::GradReducer& r) : reducer(r) {}
  void begin_step(double weight) override { reducer.begin_step(weight); }
  void end_backward() override { reducer.finish(); }
};

}  // namespace hg::test

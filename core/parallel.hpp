#pragma once

// How many threads the CPU backend may use, like torch.set_num_threads /
// OMP_NUM_THREADS. The default is HG_NUM_THREADS when set, else every core.
namespace hg {

int num_threads();
void set_num_threads(int n);  // n >= 1, else hg::Error naming the value

}  // namespace hg

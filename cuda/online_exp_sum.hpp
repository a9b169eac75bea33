#pragma once
// A row's max and sum of exponentials in ONE pass over its elements, one
// thread's share: the running max m, the sum of exp(v - m) over the terms
// below m (rest) and the count of the terms equal to m (at_max). When m
// rises, what was summed is rescaled by exp(old - new), at most once per
// 16-byte word; the block then shifts every thread's share to the row max
// and sums them (block_row_stats, cuda/reduce.cuh). A word entirely below
// the running max (nearly every word) adds its exponentials with no test per
// term; one that holds the max counts the terms equal to it exactly, as
// ShiftedExpSum (cuda/reduce.cuh) does. Exponentials by exp_approx
// (cuda/exp_approx.hpp): expf's instructions made the row pass's passes
// over a staged row compute-bound. -inf, +inf and NaN logits give what
// ShiftedExpSum gives over the row max, and
// -inf, +inf and NaN logits give what ShiftedExpSum gives over the row max:
// -inf terms add 0 (an all -inf row: m = -inf, every term counted at the
// max), +inf terms are the max (every finite term adds 0), a NaN makes the
// sum NaN (the max skips it, as fmaxf does). Plain C++ shared by the staged
// row pass (cuda/lse_rows_staged.cuh) and the host, so
// tests/test_cross_entropy_lse.cpp checks it on the CPU.
#include <math.h>

#include "cuda/exp_approx.hpp"

#if defined(__CUDACC__)
#define HG_ONLINE_EXP_SUM_FN __host__ __device__ __forceinline__
#else
#define HG_ONLINE_EXP_SUM_FN inline
#endif
#if defined(__CUDA_ARCH__)
#define HG_ONLINE_EXP_SUM_UNROLL _Pragma("unroll")
#else
#define HG_ONLINE_EXP_SUM_UNROLL
#endif

namespace hg::gpu {

struct OnlineExpSum {
  float m = -INFINITY, rest = 0.f, at_max = 0.f;

  // The terms v[0..W), one 16-byte word (or one element: W = 1).
  template <int W>
  HG_ONLINE_EXP_SUM_FN void add(const float (&v)[W]) {
    float word_max = v[0];
    HG_ONLINE_EXP_SUM_UNROLL
    for (int k = 1; k < W; ++k) word_max = fmaxf(word_max, v[k]);
    if (word_max > m) raise_to(word_max);  // false for a NaN word_max (an all-NaN word)
    if (word_max < m) {                    // no term at the max; m = +inf: every term adds 0
      HG_ONLINE_EXP_SUM_UNROLL
      for (int k = 0; k < W; ++k) rest += exp_approx(v[k] - m);  // NaN - m: NaN, kept by every later rescale
      return;
    }
    HG_ONLINE_EXP_SUM_UNROLL
    for (int k = 0; k < W; ++k) {
      if (v[k] == m) at_max += 1.f;
      else rest += exp_approx(v[k] - m);
    }
  }
  HG_ONLINE_EXP_SUM_FN void add(float v) {
    const float one[1] = {v};
    add(one);
  }
  // Rescaled to a max new_m > m: the terms at m are below new_m now.
  // exp(m - new_m) is 0 where m = -inf or new_m = +inf (m finite or -inf).
  HG_ONLINE_EXP_SUM_FN void raise_to(float new_m) {
    rest = (rest + at_max) * exp_approx(m - new_m);
    at_max = 0.f;
    m = new_m;
  }
  // Shifted to the row max (the max of every share's m, so >= m).
  HG_ONLINE_EXP_SUM_FN void shift_to(float row_max) {
    if (m != row_max) raise_to(row_max);
  }
};

}  // namespace hg::gpu

#undef HG_ONLINE_EXP_SUM_FN
#undef HG_ONLINE_EXP_SUM_UNROLL

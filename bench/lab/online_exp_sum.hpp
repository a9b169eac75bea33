#pragma once
// The lab's one-pass max and sum of exponentials (the `one_pass` and
// `pieces_online` candidates of bench/lab/classifier_lab_kernels.cuh), one
// thread's share: the running max m, the sum of exp(v - m) over the terms
// below m (rest) and the count of the terms equal to m (at_max). When m
// rises, what was summed is rescaled by exp(old - new), at most once per
// 16-byte word; block_row_stats then shifts every thread's share to the row
// max and sums them as ShiftedExpSum (cuda/reduce.cuh) does. A word entirely
// below the running max adds its exponentials with no test per term; one
// that holds the max counts the terms equal to it exactly. -inf, +inf and
// NaN logits give what ShiftedExpSum gives over the row max: -inf terms add
// 0 (an all -inf row: m = -inf, every term counted at the max), +inf terms
// are the max (every finite term adds 0), a NaN makes the sum NaN (the max
// skips it, as fmaxf does).
#include <math.h>

#include "cuda/exp_approx.cuh"
#include "cuda/reduce.cuh"

namespace lab {

struct OnlineExpSum {
  float m = -INFINITY, rest = 0.f, at_max = 0.f;

  // The terms v[0..W), one 16-byte word (or one element: W = 1).
  template <int W>
  __device__ __forceinline__ void add(const float (&v)[W]) {
    float word_max = v[0];
#pragma unroll
    for (int k = 1; k < W; ++k) word_max = fmaxf(word_max, v[k]);
    if (word_max > m) raise_to(word_max);  // false for a NaN word_max (an all-NaN word)
    if (word_max < m) {                    // no term at the max; m = +inf: every term adds 0
#pragma unroll
      for (int k = 0; k < W; ++k) rest += hg::gpu::exp_approx(v[k] - m);  // NaN - m: NaN, kept by every rescale
      return;
    }
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (v[k] == m) at_max += 1.f;
      else rest += hg::gpu::exp_approx(v[k] - m);
    }
  }
  __device__ __forceinline__ void add(float v) {
    const float one[1] = {v};
    add(one);
  }
  // Rescaled to a max new_m > m: the terms at m are below new_m now.
  // exp(m - new_m) is 0 where m = -inf or new_m = +inf (m finite or -inf).
  __device__ __forceinline__ void raise_to(float new_m) {
    rest = (rest + at_max) * hg::gpu::exp_approx(m - new_m);
    at_max = 0.f;
    m = new_m;
  }
};

// Every thread of the block, each with its share over its own terms: the
// row's stats.
__device__ __forceinline__ hg::gpu::RowStats block_row_stats(OnlineExpSum share, float* scratch) {
  const float row_max = hg::gpu::block_max(share.m, scratch);
  if (share.m != row_max) share.raise_to(row_max);
  hg::gpu::ShiftedExpSum sum{row_max, share.rest, share.at_max};
  return {row_max, sum.log_sum(scratch)};
}

}  // namespace lab

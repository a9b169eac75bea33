#include "ops/cpu/cross_entropy_cpu.hpp"

#include <cmath>

namespace hg::cpu {
namespace {

// One pass per row: log-sum-exp, the row loss and its gradient together.
template <class T>
double fused_rows(const Tensor& logits, const std::vector<double>& targets, int64_t vocab, int64_t ignore_index,
                  double inv_count, Tensor& dlogits) {
  const T* x_all = logits.data<T>();
  T* dx_all = dlogits.data<T>();
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    const T* x = x_all + static_cast<int64_t>(r) * vocab;
    T* dx = dx_all + static_cast<int64_t>(r) * vocab;
    if (targets[r] == static_cast<double>(ignore_index)) {
      for (int64_t j = 0; j < vocab; ++j) dx[j] = 0;
      continue;
    }
    const auto target = static_cast<int64_t>(targets[r]);
    T m = x[0];
    for (int64_t j = 1; j < vocab; ++j) m = x[j] > m ? x[j] : m;
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(x[j] - m));
    // Relative to the max, so large offsets keep their digits (see docs/cross_entropy.md).
    const double log_s = std::log(s);
    for (int64_t j = 0; j < vocab; ++j) {
      const double z = static_cast<double>(x[j] - m) - log_s;  // the target's p - 1 as expm1 (no cancellation)
      dx[j] = static_cast<T>((j == target ? std::expm1(z) : std::exp(z)) * inv_count);
    }
    total += log_s - static_cast<double>(x[target] - m);
  }
  return total * inv_count;
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const std::vector<double>& targets, int64_t vocab,
                             int64_t ignore_index, double inv_count, Tensor& dlogits) {
  return logits.dtype() == DType::F32 ? fused_rows<float>(logits, targets, vocab, ignore_index, inv_count, dlogits)
                                      : fused_rows<double>(logits, targets, vocab, ignore_index, inv_count, dlogits);
}

}  // namespace hg::cpu

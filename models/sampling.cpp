#include "models/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"

namespace hg {

void check_sampling_options(const SamplingOptions& o) {
  const char* op = "sampling";
  HG_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, op, "temperature ", o.temperature,
           " must be finite and >= 0 (0: greedy)");
  HG_CHECK(o.top_k >= 0, op, "top_k ", o.top_k, " must be >= 0 (0: no limit)");
  HG_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, op, "top_p ", o.top_p,
           " must lie in (0, 1] (1: no limit)");
}

int64_t sample_token(const double* logits, int64_t vocab, const SamplingOptions& o, Generator& gen) {
  const char* op = "sample_token";
  check_sampling_options(o);
  HG_CHECK(vocab > 0, op, "vocab must be positive, got ", vocab);
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    HG_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, op, "logit ", i, " is ", logits[i],
             "; the model's output is not usable");
    if (logits[i] > -INFINITY && (best < 0 || logits[i] > logits[best])) best = i;
  }
  HG_CHECK(best >= 0, op, "every one of the ", vocab, " logits is -inf: no token can be drawn");
  if (o.temperature == 0) return best;

  // Candidates, largest logit first (lower id first among equals), cut to top_k.
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = o.top_k > 0 ? std::min(order.size(), static_cast<size_t>(o.top_k)) : order.size();
  if (keep < order.size() || o.top_p < 1) {
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), before);
    order.resize(keep);
  }
  // p_i = exp((z_i - z_max) / T) / sum, in double.
  std::vector<double> p(order.size());
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - logits[best]) / o.temperature);
  if (o.top_p < 1) {  // order is sorted here: keep the shortest prefix reaching top_p
    double mass = 0;
    size_t n = 0;
    while (n < p.size() && (n == 0 || mass < o.top_p * sum)) mass += p[n++];
    order.resize(n);
    p.resize(n);
    sum = mass;
  }
  const double u = gen.uniform() * sum;
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  // u fell on the rounding of the last sum: the last token with weight.
  for (size_t i = p.size(); i-- > 0;)
    if (p[i] > 0) return order[i];
  return best;
}

}  // namespace hg

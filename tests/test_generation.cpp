// Sampling (models/sampling.hpp) and generate() (models/generation.hpp):
// greedy, top-k and top-p picks, the distribution of the draws, seeds, and
// refused values. The cache's equality with the full forward is in
// test_kv_cache.cpp.
//
// Distribution checks: N = 60000 draws from a fixed row of logits; Pearson's
// chi-square sum over the kept tokens of (count - N p)^2 / (N p) must stay
// under the chi-square quantile of upper tail 1e-6 for its degrees of freedom
// (kept tokens - 1: 36.0 for 5, 30.7 for 3, 27.6 for 2). The draws are
// seeded, so the outcome is fixed; a wrong distribution (temperature ignored,
// a token off by one, the wrong renormalisation) gives a sum in the hundreds
// or more at this N. Tokens that are cut must never be drawn.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "models/decoder_lm.hpp"
#include "models/generation.hpp"
#include "models/sampling.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::thrown_message;

namespace {

const std::vector<double> kLogits = {1.0, 0.0, -0.5, 2.0, 0.3, -1.0};

int64_t argmax(const std::vector<double>& z) { return std::max_element(z.begin(), z.end()) - z.begin(); }

std::vector<double> softmax(const std::vector<double>& z, double temperature) {
  const double m = *std::max_element(z.begin(), z.end());
  std::vector<double> p(z.size());
  double sum = 0;
  for (size_t i = 0; i < z.size(); ++i) sum += p[i] = std::exp((z[i] - m) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

std::vector<int64_t> counts(const std::vector<double>& z, const SamplingOptions& o, int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> c(z.size(), 0);
  for (int64_t i = 0; i < n; ++i)
    ++c[static_cast<size_t>(sample_token(z.data(), static_cast<int64_t>(z.size()), o, gen))];
  return c;
}

// Pearson's sum over tokens with want > 0; a draw of a token with want == 0 is infinite.
double chi_square(const std::vector<int64_t>& c, const std::vector<double>& want, int64_t n) {
  double x = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (want[i] == 0) {
      if (c[i] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = static_cast<double>(n) * want[i];
    x += (static_cast<double>(c[i]) - e) * (static_cast<double>(c[i]) - e) / e;
  }
  return x;
}

// p restricted to `kept` (ids), renormalised; 0 elsewhere.
std::vector<double> restricted(const std::vector<double>& p, const std::vector<int64_t>& kept) {
  std::vector<double> r(p.size(), 0.0);
  double sum = 0;
  for (int64_t i : kept) sum += p[static_cast<size_t>(i)];
  for (int64_t i : kept) r[static_cast<size_t>(i)] = p[static_cast<size_t>(i)] / sum;
  return r;
}

DecoderLMConfig tiny() {
  DecoderLMConfig c;
  c.vocab_size = 30;
  c.max_seq_len = 16;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  c.seed = 4;
  return c;
}

}  // namespace

TEST_CASE("sampling: temperature 0 is argmax; top-k 1 and a tiny top-p are greedy, ties to the lower id",
          "[generation][sampling]") {
  Generator rows(1);
  for (int r = 0; r < 300; ++r) {
    std::vector<double> z(17);
    for (double& x : z) x = std::round(rows.normal() * 4) / 4;  // quarter steps: many ties
    const int64_t greedy = argmax(z);                           // the first of the largest
    SamplingOptions o;
    o.temperature = 0;
    Generator gen(static_cast<uint64_t>(r));
    CHECK(sample_token(z.data(), 17, o, gen) == greedy);
    for (double t : {0.5, 1.0, 3.0}) {
      INFO("row " << r << ", temperature " << t);
      SamplingOptions k1;
      k1.temperature = t;
      k1.top_k = 1;
      SamplingOptions p0;
      p0.temperature = t;
      p0.top_p = 1e-9;
      CHECK(sample_token(z.data(), 17, k1, gen) == greedy);
      CHECK(sample_token(z.data(), 17, p0, gen) == greedy);
    }
  }
  // -inf logits are never drawn; a single finite one is always drawn.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> one = {-inf, -inf, 0.5, -inf};
  SamplingOptions o;
  Generator gen(3);
  for (int i = 0; i < 50; ++i) CHECK(sample_token(one.data(), 4, o, gen) == 2);
}

TEST_CASE("sampling: draws follow softmax(logits / temperature), cut by top-k and top-p (chi-square)",
          "[generation][sampling]") {
  const int64_t n = 60000;
  for (double t : {1.0, 0.5, 2.0}) {
    INFO("temperature " << t);
    SamplingOptions o;
    o.temperature = t;
    CHECK(chi_square(counts(kLogits, o, n, 7), softmax(kLogits, t), n) < 36.0);  // 5 degrees of freedom
  }
  const std::vector<double> p = softmax(kLogits, 1.0);
  SECTION("top-k 3 keeps ids 3, 0, 4, renormalised") {
    SamplingOptions o;
    o.top_k = 3;
    CHECK(chi_square(counts(kLogits, o, n, 8), restricted(p, {3, 0, 4}), n) < 27.6);
  }
  SECTION("top-p keeps the fewest largest tokens reaching p") {
    // p sorted: id 3 (0.550), 0 (0.202), 4 (0.100), 1 (0.074), 2 (0.045), 5 (0.027).
    SamplingOptions o;
    o.top_p = 0.8;  // 0.550 + 0.202 = 0.752 < 0.8: id 4 joins
    CHECK(chi_square(counts(kLogits, o, n, 9), restricted(p, {3, 0, 4}), n) < 27.6);
    o.top_p = 0.9;  // 0.853 < 0.9: id 1 joins too
    CHECK(chi_square(counts(kLogits, o, n, 10), restricted(p, {3, 0, 4, 1}), n) < 30.7);
    o.top_p = 0.5;
    CHECK(chi_square(counts(kLogits, o, n, 11), restricted(p, {3}), n) == 0.0);
  }
  SECTION("top-k then top-p: p is taken over the top-k tokens") {
    SamplingOptions o;
    o.top_k = 2;    // ids 3 and 0: 0.731 and 0.269 after renormalising
    o.top_p = 0.7;  // 0.731 >= 0.7: id 3 alone
    CHECK(chi_square(counts(kLogits, o, n, 12), restricted(p, {3}), n) == 0.0);
    o.top_p = 0.75;
    CHECK(chi_square(counts(kLogits, o, n, 13), restricted(p, {3, 0}), n) < 24.0);  // 1 dof: 1e-6 tail at 23.9
  }
  SECTION("the same check fails on a wrong distribution (the bound bites)") {
    SamplingOptions o;
    CHECK(chi_square(counts(kLogits, o, n, 7), softmax(kLogits, 1.2), n) > 100);
  }
}

TEST_CASE("sampling: bad options and bad logits are refused with messages", "[generation][sampling]") {
  const auto message = [](double t, int64_t k, double p) {
    SamplingOptions o;
    o.temperature = t;
    o.top_k = k;
    o.top_p = p;
    return thrown_message([&] { check_sampling_options(o); });
  };
  CHECK(message(1, 0, 1).empty());
  CHECK(message(0, 5, 0.3).empty());
  CHECK(contains(message(-0.5, 0, 1), "temperature -0.5 must be finite and >= 0 (0: greedy)"));
  CHECK(contains(message(std::nan(""), 0, 1), "temperature nan"));
  CHECK(contains(message(1, -1, 1), "top_k -1 must be >= 0 (0: no limit)"));
  CHECK(contains(message(1, 0, 0), "top_p 0 must lie in (0, 1] (1: no limit)"));
  CHECK(contains(message(1, 0, 1.5), "top_p 1.5 must lie in (0, 1]"));
  CHECK(contains(message(1, 0, -0.1), "top_p -0.1"));
  Generator gen(0);
  SamplingOptions o;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> with_nan = {0.0, std::nan(""), 1.0}, with_inf = {0.0, inf}, none = {-inf, -inf};
  CHECK(contains(thrown_message([&] { sample_token(with_nan.data(), 3, o, gen); }), "logit 1 is nan"));
  CHECK(contains(thrown_message([&] { sample_token(with_inf.data(), 2, o, gen); }), "logit 1 is inf"));
  CHECK(contains(thrown_message([&] { sample_token(none.data(), 2, o, gen); }), "every one of the 2 logits is -inf"));
}

TEST_CASE("generate: same seed gives the same tokens, another seed others; options checked", "[generation]") {
  DecoderLM model(tiny());
  model.eval();
  const Tensor prompt = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 1.0;
  o.seed = 42;
  const Tensor a = generate(model, prompt, o), b = generate(model, prompt, o);
  REQUIRE(a.shape() == Shape({2, 23}));
  CHECK(a.to_vector() == b.to_vector());
  const std::vector<double> va = a.to_vector();
  CHECK(std::vector<double>(va.begin(), va.begin() + 3) == std::vector<double>{1, 2, 3});
  CHECK(std::vector<double>(va.begin() + 23, va.begin() + 26) == std::vector<double>{4, 5, 6});
  o.seed = 43;
  CHECK(generate(model, prompt, o).to_vector() != a.to_vector());
  // With and without the cache the draws see the same logits: the same tokens.
  o.kv_cache = false;
  o.seed = 42;
  CHECK(generate(model, prompt, o).to_vector() == a.to_vector());
  // on_step sees each step's (B,) tokens, in order.
  o.kv_cache = true;
  std::vector<std::vector<int64_t>> steps;
  o.on_step = [&](const std::vector<int64_t>& t) { steps.push_back(t); };
  generate(model, prompt, o);
  REQUIRE(steps.size() == 20);
  CHECK(steps[4][1] == static_cast<int64_t>(a.at({1, 3 + 4})));
  o.on_step = nullptr;
  o.max_new_tokens = 0;
  CHECK(generate(model, prompt, o).to_vector() == prompt.to_vector());

  o.max_new_tokens = -1;
  CHECK(contains(thrown_message([&] { generate(model, prompt, o); }), "max_new_tokens must be >= 0, got -1"));
  o.max_new_tokens = 3;
  o.sampling.top_p = 2;
  CHECK(contains(thrown_message([&] { generate(model, prompt, o); }), "top_p 2 must lie in (0, 1]"));
  o.sampling.top_p = 1;
  CHECK(contains(thrown_message([&] {
                   generate(model, Tensor::from_vector({1, 30}, {1, 2}), o);
                 }),
                 "prompt 0 holds id 30, not a token of the model's vocabulary [0, 30)"));
  CHECK(contains(thrown_message([&] { generate(model, Tensor::from_vector({1.5}, {1, 1}), o); }), "id 1.5"));
  CHECK(contains(thrown_message([&] { generate(model, Tensor::zeros({3}), o); }), "must be (B, T) ids"));
}

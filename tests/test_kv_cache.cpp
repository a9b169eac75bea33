// Incremental decoding with a key/value cache (models/kv_cache.hpp,
// DecoderLM::forward_cached, attention_forward_kv_cache; docs/generation.md):
// the logits from the cache against DecoderLM::forward on the whole prefix.
//
// Bounds (and why):
// - fp32 (CPU and CUDA): the cached forward computes every position with the
//   same weights and the same attention over the same keys; only the shapes
//   of the GEMMs (T rows against 1) and the order of a few sums differ, so
//   the logits agree to float32 rounding, a few 1e-7 of their scale. CPU:
//   max |cache - forward| <= 1e-5 max |forward| (the logit scale). CUDA:
//   <= 1e-4 of the scale, as cuBLASLt may pick another algorithm (split-K)
//   for one row than for T rows. A wrong position, key or mask moves the
//   logits by a tenth of their scale or more.
// - bf16 (CUDA) against the fp32 forward of the same weights: every
//   activation is rounded to bf16 (2^-9 relative) and the GEMMs read bf16
//   weights, so the logits carry errors at the percent level
//   (docs/mixed_precision.md): relative L2 error <= 3e-2 over every logit
//   compared. The bf16 full forward is held to the same bound, beside it.
// - the attention op on the cache against attention_forward on contiguous
//   copies: F64 to 1e-12, F32 to 2e-6 relative norm (test_attention's
//   bounds), BF16 to 8e-3.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/kernel_mode.hpp"
#include "core/optim.hpp"
#include "core/tensor_functions.hpp"
#include "models/decoder_lm.hpp"
#include "models/generation.hpp"
#include "models/kv_cache.hpp"
#include "models/train_step.hpp"
#include "ops/attention.hpp"
#include "tests/test_util.hpp"

using namespace hg;
using hg::test::contains;
using hg::test::f64;
using hg::test::thrown_message;

namespace {

using Seqs = std::vector<std::vector<double>>;

DecoderLMConfig config(int64_t d_model, int64_t heads, int64_t context, Precision precision = Precision::FP32,
                       AttentionImpl impl = AttentionImpl::Auto) {
  DecoderLMConfig c;
  c.vocab_size = 40;
  c.max_seq_len = context;
  c.d_model = d_model;
  c.n_heads = heads;
  c.n_layers = 2;
  c.seed = 11;
  c.precision = precision;
  c.attention = impl;
  return c;
}

// Larger head weights: logits of a few units, so greedy picks are clear
// (random initial weights give logits of ~0.1, where float rounding could
// reorder near-ties between two paths).
void sharpen(DecoderLM& model) {
  Tensor& w = model.head.weight.value;
  w.copy_(mul_scalar(w, 30.0));
  model.eval();
}

// 200 AdamW steps on counting (next token = token + 1 mod V): its greedy
// continuations run through the whole vocabulary, where a random model soon
// repeats one token, and its predictions are confident (no near-ties).
void learn_counting(DecoderLM& model) {
  AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0;
  AdamW opt(model.parameters(), options);
  TrainStep step(model, opt);
  Generator g(3);
  const int64_t b = 8, t = model.config().max_seq_len, v = model.config().vocab_size;
  for (int s = 0; s < 200; ++s) {
    std::vector<double> ids, targets;
    for (int64_t r = 0; r < b; ++r) {
      const uint64_t start = g.next_u64() % static_cast<uint64_t>(v);
      for (int64_t i = 0; i < t; ++i) {
        ids.push_back(static_cast<double>((start + static_cast<uint64_t>(i)) % static_cast<uint64_t>(v)));
        targets.push_back(static_cast<double>((start + static_cast<uint64_t>(i) + 1) % static_cast<uint64_t>(v)));
      }
    }
    step.run(Tensor::from_vector(ids, {b, t}), Tensor::from_vector(targets, {b, t}));
  }
  model.eval();
}

Seqs random_seqs(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  Seqs s(static_cast<size_t>(b));
  for (auto& row : s)
    for (int64_t i = 0; i < t; ++i) row.push_back(static_cast<double>(g.next_u64() % static_cast<uint64_t>(vocab)));
  return s;
}

// Columns [from, to) of every row as (B, to - from) ids on `dev`.
Tensor ids_of(const Seqs& s, int64_t from, int64_t to, Device dev) {
  std::vector<double> flat;
  for (const auto& row : s) flat.insert(flat.end(), row.begin() + from, row.begin() + to);
  return Tensor::from_vector(flat, {static_cast<int64_t>(s.size()), to - from}, DType::F32, dev);
}

struct Agreement {
  double max_rel = 0;  // max |got - want| / max |want| (the logit scale), worst step
  double sum_sq_diff = 0, sum_sq_want = 0;
  double l2_rel() const { return std::sqrt(sum_sq_diff / sum_sq_want); }
};

// got (B, n, V): the logits of positions [end - n, end); `reference` runs
// forward on the whole prefix [0, end) and gives its last n positions.
void compare(Agreement& a, const Tensor& got, DecoderLM& reference, const Seqs& s, int64_t end, Device ref_dev) {
  const int64_t b = got.size(0), n = got.size(1), v = got.size(2);
  const std::vector<double> g = got.to_vector();
  const std::vector<double> w = reference.forward(ids_of(s, 0, end, ref_dev)).to_vector();
  double worst = 0, scale = 0;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < v; ++k) {
        const double want = w[static_cast<size_t>((r * end + end - n + j) * v + k)];
        const double diff = g[static_cast<size_t>((r * n + j) * v + k)] - want;
        worst = std::max(worst, std::abs(diff));
        scale = std::max(scale, std::abs(want));
        a.sum_sq_diff += diff * diff;
        a.sum_sq_want += want * want;
      }
  a.max_rel = std::max(a.max_rel, worst / scale);
}

// A teacher-forced run over s (B, N), N <= context: a prefill of `prompt`
// tokens (every position compared), a chunk of 3 tokens after it (queries
// that see part of the cache), then one token a step (the last position).
Agreement cache_vs_forward(DecoderLM& model, DecoderLM& reference, const Seqs& s, int64_t prompt, Device dev,
                           Device ref_dev) {
  const int64_t n = static_cast<int64_t>(s[0].size());
  KvCache cache = model.make_kv_cache(static_cast<int64_t>(s.size()));
  Agreement a;
  compare(a, model.forward_cached(ids_of(s, 0, prompt, dev), cache), reference, s, prompt, ref_dev);
  int64_t end = std::min(prompt + 3, n);
  if (end > prompt) compare(a, model.forward_cached(ids_of(s, prompt, end, dev), cache), reference, s, end, ref_dev);
  for (; end < n; ++end) {
    const Tensor last = model.forward_cached(ids_of(s, end, end + 1, dev), cache, DecoderLM::CachedLogits::Last);
    REQUIRE(last.shape() == Shape({static_cast<int64_t>(s.size()), 1, 40}));
    compare(a, last, reference, s, end + 1, ref_dev);
  }
  CHECK(cache.length() == n);
  return a;
}

// nanoGPT's greedy loop on DecoderLM::forward: the last `context` tokens,
// the last position's argmax (the lowest id among equals).
Seqs greedy_by_forward(DecoderLM& model, Seqs s, int64_t steps, Device dev) {
  const int64_t context = model.config().max_seq_len, v = model.config().vocab_size;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t len = static_cast<int64_t>(s[0].size()), w = std::min(len, context);
    const std::vector<double> logits = model.forward(ids_of(s, len - w, len, dev)).to_vector();
    for (size_t r = 0; r < s.size(); ++r) {
      const double* row = logits.data() + (static_cast<int64_t>(r) * w + w - 1) * v;
      s[r].push_back(static_cast<double>(std::max_element(row, row + v) - row));
    }
  }
  return s;
}

Seqs rows_of(const Tensor& ids) {
  const std::vector<double> flat = ids.to_vector();
  const int64_t b = ids.size(0), t = ids.size(1);
  Seqs s(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) s[static_cast<size_t>(r)].assign(flat.begin() + r * t, flat.begin() + (r + 1) * t);
  return s;
}

Tensor greedy_generate(DecoderLM& model, const Seqs& prompt, int64_t steps, bool kv_cache, Device dev) {
  GenerateOptions o;
  o.max_new_tokens = steps;
  o.sampling.temperature = 0;
  o.kv_cache = kv_cache;
  return generate(model, ids_of(prompt, 0, static_cast<int64_t>(prompt[0].size()), dev), o);
}

const char* impl_name(AttentionImpl impl) { return attention_impl_name(impl); }

}  // namespace

TEST_CASE("KV cache: fp32 CPU logits equal the full forward (prefill, a chunk, single tokens)", "[generation]") {
  // Head dims 16 and 64; both kernel modes; the fused mode's softmax path and
  // its flash path (the CPU fused attention reading the cache through strides).
  for (const int64_t d : {32, 128})
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
      for (AttentionImpl impl : {AttentionImpl::Softmax, AttentionImpl::Flash}) {
        if (mode == KernelMode::Unfused && impl == AttentionImpl::Flash) continue;  // unfused ignores impl
        INFO("d_model " << d << ", " << kernel_mode_name(mode) << ", " << impl_name(impl));
        KernelModeScope scope(mode);
        DecoderLM model(config(d, 2, 24, Precision::FP32, impl));
        sharpen(model);
        const Seqs s = random_seqs(3, 20, 40, 5);
        for (const int64_t prompt : {1, 6}) {
          const Agreement a = cache_vs_forward(model, model, s, prompt, Device::CPU, Device::CPU);
          INFO("prompt " << prompt << ": max |cache - forward| / logit scale " << a.max_rel);
          CHECK(a.max_rel <= 1e-5);
        }
      }
}

TEST_CASE("KV cache: fp32 CPU greedy tokens equal nanoGPT's loop on forward over 60 steps", "[generation]") {
  DecoderLM model(config(32, 2, 16));
  learn_counting(model);
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    INFO(kernel_mode_name(mode));
    KernelModeScope scope(mode);
    // 5 + 60 tokens pass the context of 16: the cache is cropped and prefilled again.
    const Seqs prompt = random_seqs(2, 5, 40, 8);
    const Seqs want = greedy_by_forward(model, prompt, 60, Device::CPU);
    CHECK(rows_of(greedy_generate(model, prompt, 60, true, Device::CPU)) == want);
    CHECK(rows_of(greedy_generate(model, prompt, 60, false, Device::CPU)) == want);
    // The tokens vary: a constant sequence would pass the check above too easily.
    std::set<double> made;
    for (const auto& row : want) made.insert(row.begin() + 5, row.end());
    INFO("row 0: " << ::Catch::Detail::stringify(want[0]) << " row 1: " << ::Catch::Detail::stringify(want[1]));
    CHECK(made.size() > 20);
  }
}

TEST_CASE("KV cache: hostile prompts (length 1, longer than the context, a batch against its rows alone)",
          "[generation]") {
  DecoderLM model(config(32, 2, 12));
  sharpen(model);
  SECTION("a prompt of one token") {
    const Seqs prompt = random_seqs(1, 1, 40, 2);
    CHECK(rows_of(greedy_generate(model, prompt, 20, true, Device::CPU)) ==
          greedy_by_forward(model, prompt, 20, Device::CPU));
  }
  SECTION("a prompt longer than max_seq_len is cropped to its last tokens") {
    const Seqs prompt = random_seqs(2, 30, 40, 3);
    const Tensor got = greedy_generate(model, prompt, 8, true, Device::CPU);
    CHECK(got.shape() == Shape({2, 38}));
    CHECK(rows_of(got) == greedy_by_forward(model, prompt, 8, Device::CPU));
    // Only the last 12 tokens matter: a prompt that differs before them continues the same way.
    Seqs other = prompt;
    other[0][0] = other[0][0] == 1 ? 2 : 1;
    other[1][17] = other[1][17] == 1 ? 2 : 1;
    const Seqs a = rows_of(got), b = rows_of(greedy_generate(model, other, 8, true, Device::CPU));
    for (size_t r = 0; r < 2; ++r) CHECK(std::equal(a[r].begin() + 30, a[r].end(), b[r].begin() + 30));
  }
  SECTION("a batch of prompts: each row as it would be alone") {
    const Seqs prompt = random_seqs(4, 3, 40, 4);
    const Seqs batch = rows_of(greedy_generate(model, prompt, 15, true, Device::CPU));
    for (size_t r = 0; r < prompt.size(); ++r) {
      INFO("row " << r);
      CHECK(rows_of(greedy_generate(model, {prompt[r]}, 15, true, Device::CPU))[0] == batch[r]);
    }
    CHECK(batch == greedy_by_forward(model, prompt, 15, Device::CPU));
  }
}

TEST_CASE("KV cache: forward_cached refuses what does not fit, naming it", "[generation]") {
  DecoderLM model(config(32, 2, 8));
  model.eval();
  KvCache cache = model.make_kv_cache(2);
  CHECK(cache.capacity() == 8);
  CHECK(cache.dtype() == DType::F32);
  CHECK(contains(thrown_message([&] {
                   model.forward_cached(Tensor::zeros({3, 2}), cache);
                 }),
                 "does not fit this model and ids (3, 2): make it with make_kv_cache(3)"));
  model.forward_cached(Tensor::zeros({2, 6}), cache);
  CHECK(cache.length() == 6);
  CHECK(contains(thrown_message([&] {
                   model.forward_cached(Tensor::zeros({2, 3}), cache);
                 }),
                 "3 new tokens after the 6 cached ones pass the context of 8 positions: crop the context"));
  CHECK(cache.length() == 6);  // a refused call leaves the cache as it was
  CHECK(contains(thrown_message([&] { model.forward_cached(Tensor::zeros({2, 0}), cache); }), "T >= 1"));
  CHECK(contains(thrown_message([&] { model.forward_cached(Tensor::full({2, 1}, 40), cache); }), "40"));
  model.forward_cached(Tensor::zeros({2, 2}), cache);
  CHECK(cache.length() == 8);
  cache.reset();
  CHECK(cache.length() == 0);
  CHECK(contains(thrown_message([] { KvCache(1, 0, 2, 16, 8, DType::F32, Device::CPU); }), "batch 0"));
  // A training forward and its backward with a cached forward between them: the backward is unchanged.
  DecoderLM a(config(32, 2, 8)), b(config(32, 2, 8));
  a.eval();
  b.eval();
  const Tensor ids = ids_of(random_seqs(2, 8, 40, 1), 0, 8, Device::CPU);
  const Tensor dlogits = Tensor::full({2, 8, 40}, 0.01);
  a.forward(ids);
  b.forward(ids);
  KvCache other = b.make_kv_cache(2);
  b.forward_cached(ids, other);
  CHECK(hg::test::same_bytes(a.backward(dlogits), b.backward(dlogits)));
}

TEST_CASE("attention_forward_kv_cache: equals attention_forward on contiguous copies (CPU, both modes)",
          "[generation][attention]") {
  // B 2, H 3, dh 8: the new tokens' packed qkv against a cache of capacity 11.
  Generator g(4);
  for (DType t : {DType::F64, DType::F32})
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused})
      for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{1, 1}, {1, 9}, {4, 4}, {3, 7}, {5, 11}})
        for (bool causal : {true, false}) {
          INFO(dtype_name(t) << " " << kernel_mode_name(mode) << " Tq " << tq << " Tk " << tk << " causal " << causal);
          KernelModeScope scope(mode);
          const int64_t b = 2, h = 3, dh = 8, cap = 11;
          const Tensor qkv = Tensor::randn({b, tq, 3 * h * dh}, g, t);
          const Tensor kc = Tensor::randn({cap, b, h, dh}, g, t), vc = Tensor::randn({cap, b, h, dh}, g, t);
          AttentionOptions o;
          o.causal = causal;
          if (!causal) {  // a padding mask instead: a bias on every third key, row 1's last key removed
            std::vector<double> m(static_cast<size_t>(b * tk), 0.0);
            for (int64_t j = 1; j < tk; j += 3) m[static_cast<size_t>(j)] = -2.0;
            if (tk > 1) m.back() = -INFINITY;
            o.mask = Tensor::from_vector(m, {b, 1, 1, tk}, t);
          }
          const Tensor got = attention_forward_kv_cache(qkv, h, kc, vc, tk, o);
          const Tensor q = split_heads(qkv, 3, h)[0];
          const Tensor want =
              merge_heads(attention_forward(q, kv_cache_heads(kc, tk), kv_cache_heads(vc, tk), o, nullptr));
          REQUIRE(got.shape() == Shape({b, tq, h * dh}));
          CHECK(rel_error(f64(got), f64(want)) <= (t == DType::F64 ? 1e-12 : 2e-6));
        }
}

TEST_CASE("attention_forward_kv_cache: a padding mask and a single query over many keys (CPU fused)",
          "[generation][attention]") {
  Generator g(6);
  const int64_t b = 2, h = 2, dh = 4, cap = 9, tk = 9;
  const Tensor qkv = Tensor::randn({b, 1, 3 * h * dh}, g, DType::F64);
  const Tensor kc = Tensor::randn({cap, b, h, dh}, g, DType::F64), vc = Tensor::randn({cap, b, h, dh}, g, DType::F64);
  AttentionOptions o;
  o.causal = true;
  std::vector<double> m(static_cast<size_t>(b * tk), 0.0);
  m[0] = m[4] = -INFINITY;  // row 0 drops keys 0 and 4
  m[tk + 8] = -1e30;        // row 1 drops its last key
  o.mask = Tensor::from_vector(m, {b, 1, 1, tk}, DType::F64);
  // Reference by hand: softmax over the kept keys of q . k / sqrt(dh), then sum p v.
  const Tensor got = attention_forward_kv_cache(qkv, h, kc, vc, tk, o);
  const std::vector<double> qv = qkv.to_vector(), kv = kc.to_vector(), vv = vc.to_vector(), out = got.to_vector();
  double worst = 0;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t hh = 0; hh < h; ++hh) {
      std::vector<double> z(static_cast<size_t>(tk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < dh; ++e)
          dot += qv[static_cast<size_t>(r * 3 * h * dh + hh * dh + e)] *
                 kv[static_cast<size_t>(((j * b + r) * h + hh) * dh + e)];
        z[static_cast<size_t>(j)] = m[static_cast<size_t>(r * tk + j)] <= -1e9 ? -INFINITY : dot / std::sqrt(4.0);
        mx = std::max(mx, z[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& zj : z) sum += zj = std::exp(zj - mx);
      for (int64_t e = 0; e < dh; ++e) {
        double o_e = 0;
        for (int64_t j = 0; j < tk; ++j)
          o_e += z[static_cast<size_t>(j)] / sum * vv[static_cast<size_t>(((j * b + r) * h + hh) * dh + e)];
        worst = std::max(worst, std::abs(o_e - out[static_cast<size_t>(r * h * dh + hh * dh + e)]));
      }
    }
  CHECK(worst <= 1e-12);
}

TEST_CASE("attention_forward_kv_cache: bad operands give errors naming them", "[generation][attention]") {
  const Tensor qkv = Tensor::zeros({2, 3, 3 * 2 * 4});
  const Tensor kc = Tensor::zeros({8, 2, 2, 4});
  AttentionOptions o;
  o.causal = true;
  CHECK(contains(thrown_message([&] { attention_forward_kv_cache(qkv, 2, kc, kc, 2, o); }),
                 "tk 2 must lie in [Tq, capacity] = [3, 8]"));
  CHECK(contains(thrown_message([&] { attention_forward_kv_cache(qkv, 2, kc, kc, 9, o); }), "tk 9"));
  CHECK(contains(thrown_message([&] {
                   attention_forward_kv_cache(qkv, 2, Tensor::zeros({8, 2, 4, 2}), kc, 4, o);
                 }),
                 "k_cache (8, 2, 4, 2) must be (capacity, B, H, dh) = (capacity, 2, 2, 4)"));
  CHECK(contains(thrown_message([&] { attention_forward_kv_cache(qkv, 2, kc, kc.to(DType::F64), 4, o); }),
                 "attention_forward_kv_cache"));
  CHECK(contains(thrown_message([&] { attention_forward_kv_cache(qkv, 5, kc, kc, 4, o); }),
                 "qkv must be (B, T, 3 * heads * dh)"));
  o.mask = Tensor::zeros({2, 1, 1, 3});
  CHECK(contains(thrown_message([&] { attention_forward_kv_cache(qkv, 2, kc, kc, 4, o); }),
                 "mask shape (2, 1, 1, 3) must be (B, 1, 1, Tk) = (2, 1, 1, 4)"));
}

// ---- CUDA ----

TEST_CASE("CUDA KV cache: fp32 logits equal the full forward, fused and unfused, head dims 16 and 64",
          "[generation][cuda]") {
  HG_REQUIRE_GPU();
  // d 32 / 2 heads: dh 16, the softmax path (no flash kernel); d 128 / 2 heads: dh 64, the flash path.
  for (const int64_t d : {32, 128})
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
      INFO("d_model " << d << ", " << kernel_mode_name(mode));
      KernelModeScope scope(mode);
      DecoderLM model(config(d, 2, 40));
      learn_counting(model);
      model.to(Device::CUDA);
      const Seqs s = random_seqs(3, 36, 40, 5);
      for (const int64_t prompt : {1, 7}) {
        const Agreement a = cache_vs_forward(model, model, s, prompt, Device::CUDA, Device::CUDA);
        INFO("prompt " << prompt << ": max |cache - forward| / logit scale " << a.max_rel);
        CHECK(a.max_rel <= 1e-4);
      }
      // Greedy tokens over 50 steps, past the context of 40 (cropped, prefilled again), against nanoGPT's loop.
      const Seqs prompt = random_seqs(2, 4, 40, 9);
      CHECK(rows_of(greedy_generate(model, prompt, 50, true, Device::CUDA)) ==
            greedy_by_forward(model, prompt, 50, Device::CUDA));
    }
}

TEST_CASE("CUDA KV cache: bf16 logits against the fp32 forward, fused and unfused, head dims 16 and 64",
          "[generation][cuda]") {
  HG_REQUIRE_GPU();
  for (const int64_t d : {32, 128})
    for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
      INFO("d_model " << d << ", " << kernel_mode_name(mode));
      KernelModeScope scope(mode);
      DecoderLM b16(config(d, 2, 40, Precision::BF16)), f32(config(d, 2, 40));
      sharpen(b16);
      sharpen(f32);
      b16.to(Device::CUDA);
      f32.to(Device::CUDA);
      KvCache cache = b16.make_kv_cache(1);
      CHECK(cache.dtype() == DType::BF16);
      const Seqs s = random_seqs(3, 36, 40, 5);
      const Agreement cached = cache_vs_forward(b16, f32, s, 7, Device::CUDA, Device::CUDA);
      const Agreement full = cache_vs_forward(f32, b16, s, 7, Device::CUDA, Device::CUDA);  // bf16 forward vs fp32
      INFO("relative L2 error vs fp32: cache " << cached.l2_rel() << ", bf16 full forward " << full.l2_rel());
      CHECK(cached.l2_rel() <= 3e-2);
      CHECK(full.l2_rel() <= 3e-2);
    }
}

TEST_CASE("CUDA attention_forward_kv_cache: equals the contiguous op (F32, BF16; head dims 32, 64, 128)",
          "[generation][attention][cuda]") {
  HG_REQUIRE_GPU();
  Generator g(12);
  for (DType t : {DType::F32, DType::BF16})
    for (const int64_t dh : {32, 64, 128})
      for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{1, 1}, {1, 130}, {7, 7}, {65, 200}, {3, 129}}) {
        INFO(dtype_name(t) << " dh " << dh << " Tq " << tq << " Tk " << tk);
        const int64_t b = 3, h = 2, cap = 201;
        const Tensor qkv = Tensor::randn({b, tq, 3 * h * dh}, g, DType::F32, Device::CUDA).to(t);
        const Tensor kc = Tensor::randn({cap, b, h, dh}, g, DType::F32, Device::CUDA).to(t);
        const Tensor vc = Tensor::randn({cap, b, h, dh}, g, DType::F32, Device::CUDA).to(t);
        AttentionOptions o;
        o.causal = true;
        const Tensor got = attention_forward_kv_cache(qkv, h, kc, vc, tk, o);
        const Tensor q = split_heads(qkv, 3, h)[0];
        const Tensor want =
            merge_heads(attention_forward(q, kv_cache_heads(kc, tk), kv_cache_heads(vc, tk), o, nullptr));
        CHECK(rel_error(f64(got), f64(want)) <= (t == DType::BF16 ? 8e-3 : 2e-6));
      }
}

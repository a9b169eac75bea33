#pragma once
// The built-in synthetic translation task, framed decoder-only like machine
// translation with a GPT: every example is
//   BOS s_1 .. s_n SEP t_1 .. t_n EOS
// where the target sentence is the source translated word by word through a
// fixed dictionary and then reversed (t_j = dict[s_{n+1-j}]): a toy language
// whose word order differs from the source. The model sees the whole line
// and is trained to predict the next token, but the loss counts only the
// positions that predict target words and EOS (ignore_index elsewhere).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/random.hpp"

namespace hg::examples {

constexpr int64_t kIgnore = -100;

struct Example {
  std::vector<int32_t> source;  // word ids in the source language
  std::vector<int32_t> target;  // their translation, in target order
};

struct Batch {
  std::vector<double> inputs;   // (B, T) token ids
  std::vector<double> targets;  // (B, T) next-token ids or kIgnore
  int64_t batch = 0, seq = 0;
};

class TranslationTask {
 public:
  static constexpr int32_t kPad = 0, kBos = 1, kSep = 2, kEos = 3, kFirstWord = 4;

  TranslationTask(int32_t words, int32_t min_len, int32_t max_len, uint64_t dictionary_seed = 1234)
      : words_(words), min_len_(min_len), max_len_(max_len), dictionary_(static_cast<size_t>(words)) {
    std::iota(dictionary_.begin(), dictionary_.end(), 0);
    Generator g(dictionary_seed);  // a fixed "language", the same for every run
    for (size_t i = dictionary_.size(); i > 1; --i) std::swap(dictionary_[i - 1], dictionary_[g.next_u64() % i]);
  }

  int64_t vocab_size() const { return kFirstWord + 2 * static_cast<int64_t>(words_); }
  int64_t seq_len() const { return 2 * static_cast<int64_t>(max_len_) + 2; }  // inputs: a full line minus one
  std::string describe() const {
    return std::to_string(words_) + " words, sentences of " + std::to_string(min_len_) + ".." +
           std::to_string(max_len_) + " words, target = dictionary(source) reversed";
  }

  Example sample(Generator& g) const {
    Example e;
    const int32_t n = min_len_ + static_cast<int32_t>(g.next_u64() % static_cast<uint64_t>(max_len_ - min_len_ + 1));
    for (int32_t i = 0; i < n; ++i)
      e.source.push_back(static_cast<int32_t>(g.next_u64() % static_cast<uint64_t>(words_)));
    for (int32_t i = n - 1; i >= 0; --i) e.target.push_back(dictionary_[static_cast<size_t>(e.source[i])]);
    return e;
  }

  // Held-out sentences: never produced by train_sample().
  std::vector<Example> make_held_out(int count, Generator& g) {
    std::vector<Example> out;
    while (static_cast<int>(out.size()) < count) {
      Example e = sample(g);
      if (held_out_keys_.insert(e.source).second) out.push_back(e);
    }
    return out;
  }
  Example train_sample(Generator& g) const {
    for (;;) {
      Example e = sample(g);
      if (!held_out_keys_.count(e.source)) return e;
    }
  }

  // Token ids of the prompt (BOS source SEP) and of the full line.
  std::vector<int32_t> prompt(const Example& e) const {
    std::vector<int32_t> line{kBos};
    for (int32_t w : e.source) line.push_back(source_token(w));
    line.push_back(kSep);
    return line;
  }
  std::vector<int32_t> answer(const Example& e) const {  // target tokens then EOS
    std::vector<int32_t> a;
    for (int32_t w : e.target) a.push_back(target_token(w));
    a.push_back(kEos);
    return a;
  }

  // Right-padded batch; the causal mask keeps padding invisible to real tokens.
  Batch make_batch(const std::vector<Example>& examples) const {
    Batch b;
    b.batch = static_cast<int64_t>(examples.size());
    b.seq = seq_len();
    b.inputs.assign(static_cast<size_t>(b.batch * b.seq), kPad);
    b.targets.assign(static_cast<size_t>(b.batch * b.seq), static_cast<double>(kIgnore));
    for (size_t i = 0; i < examples.size(); ++i) {
      std::vector<int32_t> line = prompt(examples[i]);
      const size_t answer_from = line.size();  // index of the first target token in the line
      for (int32_t t : answer(examples[i])) line.push_back(t);
      for (size_t p = 0; p + 1 < line.size(); ++p) {
        b.inputs[i * b.seq + p] = line[p];
        if (p + 1 >= answer_from) b.targets[i * b.seq + p] = line[p + 1];
      }
    }
    return b;
  }

  std::string render(const std::vector<int32_t>& tokens) const {
    std::string s;
    for (int32_t t : tokens) {
      if (!s.empty()) s += ' ';
      if (t == kBos) s += "<s>";
      else if (t == kSep) s += "|";
      else if (t == kEos) s += "</s>";
      else if (t == kPad) s += "_";
      else if (t < kFirstWord + words_) s += "a" + std::to_string(t - kFirstWord);
      else s += "B" + std::to_string(t - kFirstWord - words_);
    }
    return s;
  }

  int32_t source_token(int32_t w) const { return kFirstWord + w; }
  int32_t target_token(int32_t w) const { return kFirstWord + words_ + w; }

 private:
  int32_t words_, min_len_, max_len_;
  std::vector<int32_t> dictionary_;
  std::set<std::vector<int32_t>> held_out_keys_;
};

}  // namespace hg::examples

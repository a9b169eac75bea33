#include "examples/translation/decoding.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/indexing.hpp"
#include "models/decoder_lm.hpp"

namespace hg::translation {

namespace {

void log_softmax_inplace(std::vector<double>& row) {
  const double m = *std::max_element(row.begin(), row.end());
  double s = 0;
  for (double v : row) s += std::exp(v - m);
  const double lse = m + std::log(s);
  for (double& v : row) v -= lse;
}

int32_t argmax(const std::vector<double>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

NextTokenScorer model_scorer(DecoderLM& model, Device device) {
  return [&model, device](const std::vector<Tokens>& lines) {
    const int64_t b = static_cast<int64_t>(lines.size());
    size_t t = 0;
    for (const Tokens& l : lines) t = std::max(t, l.size());
    std::vector<double> ids(static_cast<size_t>(b) * t, 0.0), last_rows;
    for (int64_t i = 0; i < b; ++i) {
      std::copy(lines[i].begin(), lines[i].end(), ids.begin() + i * t);
      last_rows.push_back(static_cast<double>(i * static_cast<int64_t>(t) + static_cast<int64_t>(lines[i].size()) - 1));
    }
    model.eval();
    const Tensor logits = model.forward(Tensor::from_vector(ids, {b, int64_t(t)}, DType::F32, device));
    model.train();
    const int64_t v = logits.size(-1);
    // Only each row's last position comes back to the host (bf16 logits are
    // widened first: gather_rows takes f32/f64 tables).
    const Tensor rows =
        logits.dtype() == DType::BF16 ? logits.reshape({-1, v}).to(DType::F32) : logits.reshape({-1, v});
    const std::vector<double> last =
        gather_rows(rows, Tensor::from_vector(last_rows, {b}, DType::F32, device)).to_vector();
    std::vector<std::vector<double>> out;
    for (int64_t i = 0; i < b; ++i) {
      out.emplace_back(last.begin() + i * v, last.begin() + (i + 1) * v);
      log_softmax_inplace(out.back());
    }
    return out;
  };
}

std::vector<Tokens> greedy_decode(const NextTokenScorer& score, const std::vector<Tokens>& prompts, int64_t max_line,
                                  int32_t eos) {
  std::vector<Tokens> lines = prompts, out(prompts.size());
  std::vector<size_t> active;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (static_cast<int64_t>(prompts[i].size()) < max_line) active.push_back(i);
  while (!active.empty()) {
    std::vector<Tokens> batch;
    for (size_t i : active) batch.push_back(lines[i]);
    const auto logp = score(batch);
    std::vector<size_t> still;
    for (size_t k = 0; k < active.size(); ++k) {
      const size_t i = active[k];
      const int32_t next = argmax(logp[k]);
      if (next == eos) continue;
      lines[i].push_back(next);
      out[i].push_back(next);
      if (static_cast<int64_t>(lines[i].size()) < max_line) still.push_back(i);
    }
    active = std::move(still);
  }
  return out;
}

namespace {
struct Hypothesis {
  Tokens generated;
  double logp = 0;
};

struct Candidate {
  size_t parent;
  int32_t token;
  double logp;
};
}  // namespace

std::vector<Tokens> beam_decode(const NextTokenScorer& score, const std::vector<Tokens>& prompts, int beam,
                                int64_t max_line, int32_t eos) {
  HG_CHECK(beam >= 1, "beam_decode", "beam ", beam, ": must be >= 1");
  const size_t n = prompts.size();
  std::vector<std::vector<Hypothesis>> alive(n), finished(n);
  for (size_t s = 0; s < n; ++s)
    if (static_cast<int64_t>(prompts[s].size()) < max_line) alive[s].push_back({});
  for (;;) {
    std::vector<Tokens> batch;
    std::vector<std::pair<size_t, size_t>> row_of;  // (sentence, hypothesis)
    for (size_t s = 0; s < n; ++s)
      for (size_t h = 0; h < alive[s].size(); ++h) {
        Tokens line = prompts[s];
        line.insert(line.end(), alive[s][h].generated.begin(), alive[s][h].generated.end());
        batch.push_back(std::move(line));
        row_of.emplace_back(s, h);
      }
    if (batch.empty()) break;
    const auto logp = score(batch);
    size_t row = 0;
    for (size_t s = 0; s < n; ++s) {
      if (alive[s].empty()) continue;
      std::vector<Candidate> cands;
      for (size_t h = 0; h < alive[s].size(); ++h, ++row) {
        const std::vector<double>& lp = logp[row];
        // Only the best `beam` tokens of each hypothesis can survive.
        std::vector<int32_t> ids(lp.size());
        std::iota(ids.begin(), ids.end(), 0);
        const size_t k = std::min<size_t>(static_cast<size_t>(beam), ids.size());
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                          [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
        for (size_t j = 0; j < k; ++j) cands.push_back({h, ids[j], alive[s][h].logp + lp[ids[j]]});
      }
      std::stable_sort(cands.begin(), cands.end(),
                       [](const Candidate& a, const Candidate& b) { return a.logp > b.logp; });
      std::vector<Hypothesis> next;
      for (size_t rank = 0; rank < cands.size() && static_cast<int>(next.size()) < beam; ++rank) {
        const Candidate& c = cands[rank];
        Hypothesis hyp{alive[s][c.parent].generated, c.logp};
        if (c.token == eos) {
          if (static_cast<int>(rank) < beam) finished[s].push_back(std::move(hyp));
          continue;
        }
        hyp.generated.push_back(c.token);
        if (static_cast<int64_t>(prompts[s].size() + hyp.generated.size()) >= max_line)
          finished[s].push_back(std::move(hyp));  // the line is full: it ends here
        else next.push_back(std::move(hyp));
      }
      alive[s] = static_cast<int>(finished[s].size()) >= beam ? std::vector<Hypothesis>{} : std::move(next);
    }
  }
  std::vector<Tokens> out(n);
  for (size_t s = 0; s < n; ++s) {
    double best = -INFINITY;
    for (const Hypothesis& h : finished[s]) {
      const double normalized = h.logp / static_cast<double>(h.generated.size() + 1);
      if (normalized > best) {
        best = normalized;
        out[s] = h.generated;
      }
    }
  }
  return out;
}

}  // namespace hg::translation

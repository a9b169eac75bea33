#include "examples/translation/bleu.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.hpp"

namespace hg::translation {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

using Counts = std::map<std::vector<std::string>, long>;

Counts ngrams(const std::vector<std::string>& tokens, size_t n) {
  Counts c;
  for (size_t i = 0; i + n <= tokens.size(); ++i)
    ++c[std::vector<std::string>(tokens.begin() + i, tokens.begin() + i + n)];
  return c;
}

}  // namespace

std::vector<std::string> tokenize_13a(const std::string& line) {
  // The same substitutions, in the same order, as sacrebleu's Tokenizer13a.
  static const std::regex punctuation(R"(([\{-\~\[-\` -\&\(-\+\:-\@\/]))");
  static const std::regex period_comma_after_non_digit(R"(([^0-9])([\.,]))");
  static const std::regex period_comma_before_non_digit(R"(([\.,])([^0-9]))");
  static const std::regex dash_after_digit(R"(([0-9])(-))");
  std::string s = line;
  replace_all(s, "<skipped>", "");
  replace_all(s, "-\n", "");
  replace_all(s, "\n", " ");
  if (s.find('&') != std::string::npos) {
    replace_all(s, "&quot;", "\"");
    replace_all(s, "&amp;", "&");
    replace_all(s, "&lt;", "<");
    replace_all(s, "&gt;", ">");
  }
  s = std::regex_replace(" " + s + " ", punctuation, " $1 ");
  s = std::regex_replace(s, period_comma_after_non_digit, "$1 $2 ");
  s = std::regex_replace(s, period_comma_before_non_digit, " $1 $2");
  s = std::regex_replace(s, dash_after_digit, "$1 $2 ");
  std::istringstream in(s);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  return tokens;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references) {
  HG_CHECK(hypotheses.size() == references.size(), "corpus_bleu", hypotheses.size(), " hypotheses but ",
           references.size(), " references: need one reference per hypothesis");
  std::array<long, 4> matches{}, totals{};
  BleuScore score;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const std::vector<std::string> hyp = tokenize_13a(hypotheses[i]), ref = tokenize_13a(references[i]);
    score.hyp_len += static_cast<long>(hyp.size());
    score.ref_len += static_cast<long>(ref.size());
    for (size_t n = 1; n <= 4; ++n) {
      const Counts h = ngrams(hyp, n), r = ngrams(ref, n);
      for (const auto& [gram, count] : h) {
        const auto it = r.find(gram);
        matches[n - 1] += std::min(count, it == r.end() ? 0L : it->second);  // clipped
      }
      totals[n - 1] += hyp.size() >= n ? static_cast<long>(hyp.size() - n + 1) : 0;
    }
  }
  double log_sum = 0;
  bool zero = false;
  for (int n = 0; n < 4; ++n) {
    score.precision[n] = totals[n] > 0 ? 100.0 * matches[n] / totals[n] : 0.0;
    if (matches[n] == 0) zero = true;
    else log_sum += std::log(static_cast<double>(matches[n]) / totals[n]);
  }
  const double c = static_cast<double>(score.hyp_len), r = static_cast<double>(score.ref_len);
  score.brevity_penalty = c == 0 ? 0.0 : c >= r ? 1.0 : std::exp(1.0 - r / c);
  score.bleu = zero ? 0.0 : 100.0 * score.brevity_penalty * std::exp(log_sum / 4);
  return score;
}

}  // namespace hg::translation

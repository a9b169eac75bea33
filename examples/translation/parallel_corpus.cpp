#include "examples/translation/parallel_corpus.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/random.hpp"

namespace hg::translation {

namespace {
constexpr size_t kNotesKept = 5;

// Empty when the line is a valid pair, else why not.
std::string check_line(const std::string& line, size_t tab) {
  if (tab == std::string::npos) return "no tab";
  if (line.find('\t', tab + 1) != std::string::npos) return "more than one tab";
  if (line.find_first_not_of(" \t\r") >= tab) return "empty source";
  if (line.find_first_not_of(" \t\r", tab + 1) == std::string::npos) return "empty target";
  return "";
}
}  // namespace

ParallelCorpus parse_parallel_tsv(const std::string& text, const std::string& name) {
  ParallelCorpus corpus;
  std::istringstream in(text);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;  // blank lines (a trailing one, say) are not pairs
    const size_t tab = line.find('\t');
    const std::string why = check_line(line, tab);
    if (!why.empty()) {
      ++corpus.malformed;
      if (corpus.malformed_notes.size() < kNotesKept)
        corpus.malformed_notes.push_back(name + " line " + std::to_string(line_no) + ": " + why);
      continue;
    }
    corpus.pairs.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  HG_CHECK(!corpus.pairs.empty(), "translate", name, ": no valid source<TAB>target pair in ", line_no, " lines",
           corpus.malformed ? " (" + std::to_string(corpus.malformed) + " malformed)" : std::string());
  return corpus;
}

ParallelCorpus read_parallel_tsv(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  HG_CHECK(static_cast<bool>(f), "translate", "cannot open '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_parallel_tsv(ss.str(), path);
}

CorpusSplits split_corpus(std::vector<SentencePair> pairs, int64_t valid, int64_t test, uint64_t seed) {
  const int64_t n = static_cast<int64_t>(pairs.size());
  HG_CHECK(n >= 3, "translate", "a corpus of ", n,
           " pairs cannot be split into train, valid and test: need at least 3");
  valid = std::clamp<int64_t>(valid, 1, std::max<int64_t>(1, n / 10));
  test = std::clamp<int64_t>(test, 1, std::max<int64_t>(1, n / 10));
  Generator g(seed);
  for (size_t i = pairs.size(); i > 1; --i) std::swap(pairs[i - 1], pairs[g.next_u64() % i]);
  CorpusSplits s;
  s.valid.assign(pairs.begin(), pairs.begin() + valid);
  s.test.assign(pairs.begin() + valid, pairs.begin() + valid + test);
  s.train.assign(pairs.begin() + valid + test, pairs.end());
  return s;
}

}  // namespace hg::translation

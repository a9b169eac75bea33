#pragma once
// Parallel text: one `source<TAB>target` pair per line (UTF-8, '\n' or
// "\r\n" line ends). A line without a tab, with an empty side, or with a
// second tab is malformed: counted, skipped and reported by line number.
#include <cstdint>
#include <string>
#include <vector>

namespace hg::translation {

struct SentencePair {
  std::string source, target;
};

struct ParallelCorpus {
  std::vector<SentencePair> pairs;
  int64_t malformed = 0;                     // lines skipped
  std::vector<std::string> malformed_notes;  // the first few: "line 12: no tab"
};

// Parses text already in memory; `name` appears in messages.
ParallelCorpus parse_parallel_tsv(const std::string& text, const std::string& name);

// Reads a file. Throws hg::Error when it cannot be read or holds no valid
// pair ("FILE: no valid source<TAB>target pair in N lines").
ParallelCorpus read_parallel_tsv(const std::string& path);

struct CorpusSplits {
  std::vector<SentencePair> train, valid, test;
};

// A fixed-seed shuffle, then `valid` and `test` pairs held out (each at most
// a tenth of the corpus, at least one pair each; train keeps the rest and must
// not be empty).
CorpusSplits split_corpus(std::vector<SentencePair> pairs, int64_t valid, int64_t test, uint64_t seed);

}  // namespace hg::translation

#include "examples/common/gemm_flags.hpp"

#include "core/error.hpp"
#include "core/gemm_algorithms.hpp"
#include "examples/common/cli.hpp"

namespace hg::cli {

void add_gemm_flags(CLI::App& app, GemmFlags& flags) {
  app.add_option("--gemm-algorithms", flags.algorithms,
                 "CUDA GEMMs: heuristic (cuBLASLt's first recommendation, the same in every run) or measured (the "
                 "heuristic's candidates timed once per shape at start-up, the fastest kept)")
      ->check(CLI::IsMember({"heuristic", "measured"}))
      ->capture_default_str();
  app.add_option("--gemm-algorithm-file", flags.file,
                 "with --gemm-algorithms measured: keep the choices in this JSON file; shapes it holds for this GPU "
                 "and cuBLASLt are taken from it untimed, so runs sharing the file use the same algorithms");
}

void apply_gemm_flags(const GemmFlags& flags) {
  set_gemm_algorithms(parse_gemm_algorithms(flags.algorithms));
  if (flags.file.empty()) return;
  if (gemm_algorithms() != GemmAlgorithms::Measured)
    usage_error("--gemm-algorithm-file", "keeps measured choices: needs --gemm-algorithms measured");
  try {
    set_gemm_algorithm_file(flags.file);
  } catch (const Error& e) {
    usage_error("--gemm-algorithm-file", flags.file, ": ", e.what());
  }
}

}  // namespace hg::cli

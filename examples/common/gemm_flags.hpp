#pragma once
// The GEMM algorithm flags train and bench_train share: --gemm-algorithms
// heuristic|measured and --gemm-algorithm-file PATH (docs/gemm.md,
// "Algorithm choice").
#include <string>

#include <CLI/CLI.hpp>

namespace hg::cli {

struct GemmFlags {
  std::string algorithms = "heuristic";
  std::string file;  // measured choices kept across runs; empty: none
};

void add_gemm_flags(CLI::App& app, GemmFlags& flags);

// Sets the mode (hg::set_gemm_algorithms) and, when given, the algorithm
// file; a file without --gemm-algorithms measured, or one refused (not such
// a file, not writable), is a UsageError naming the path and the fault.
void apply_gemm_flags(const GemmFlags& flags);

}  // namespace hg::cli

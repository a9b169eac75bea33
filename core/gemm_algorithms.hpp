#pragma once
// How the CUDA backend picks the cuBLASLt algorithm of each GEMM shape
// (cuda/gemm_lt.cu; docs/gemm.md, "Algorithm choice").
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hg {

enum class GemmAlgorithms {
  // cuBLASLt's first recommendation: the same algorithm in every process,
  // so a run is bitwise reproducible from one process to the next.
  Heuristic,
  // The heuristic's candidates (up to 8) each timed on the call's own
  // operands the first time a shape runs outside a CUDA graph capture; the
  // fastest is kept for the life of the process. Which one wins depends on
  // a timing, so two processes may round differently (each is still
  // deterministic). A shape first seen inside a capture keeps the heuristic's.
  Measured,
};

// Applies to GEMM shapes planned after the call (plans are cached per mode).
void set_gemm_algorithms(GemmAlgorithms mode);
GemmAlgorithms gemm_algorithms();
const char* gemm_algorithms_name(GemmAlgorithms mode);
// "heuristic" or "measured"; anything else is an hg::Error naming both.
GemmAlgorithms parse_gemm_algorithms(std::string_view name);

class GemmAlgorithmFile;

// Measured choices kept in a JSON file (core/gemm_algorithm_file.hpp): a
// shape whose entry there matches this GPU, this cuBLASLt and the heuristic's
// candidates takes the saved one untimed; a shape measured anew is added to
// the file at once. "" drops the file. Every shape is planned again after a
// call. An hg::Error names a file that cannot be read, parsed or written.
void set_gemm_algorithm_file(const std::string& path);
std::shared_ptr<GemmAlgorithmFile> gemm_algorithm_file();  // nullptr: none
// Counts set_gemm_algorithm_file calls: part of the backend's plan key.
int64_t gemm_algorithm_file_generation();

// One shape's measurement under GemmAlgorithms::Measured.
struct GemmAlgorithmChoice {
  std::string gemm;        // dtypes, M x N x K, transposes, epilogue
  std::string algorithm;   // the kept one's cuBLASLt configuration (id, tile, stages, split-K, ...)
  int candidates = 0;      // algorithms timed
  int chosen = 0;          // index among the heuristic's candidates (0: its first)
  double first_us = 0.0;   // median time of the heuristic's first
  double chosen_us = 0.0;  // and of the one kept
  bool from_file = false;  // taken from the algorithm file untimed (the times are the file's)
};

// Called by the backend once per measured shape; read by programs that
// report the choice (bench_train).
void record_gemm_algorithm_choice(GemmAlgorithmChoice choice);
std::vector<GemmAlgorithmChoice> gemm_algorithm_choices();

}  // namespace hg

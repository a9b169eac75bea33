#include "core/gemm_algorithms.hpp"

#include <atomic>
#include <mutex>

#include "core/error.hpp"
#include "core/gemm_algorithm_file.hpp"

namespace hg {
namespace {
std::atomic<GemmAlgorithms> g_mode{GemmAlgorithms::Heuristic};
std::mutex g_choices_mutex;
std::vector<GemmAlgorithmChoice> g_choices;
std::mutex g_file_mutex;
std::shared_ptr<GemmAlgorithmFile> g_file;
std::atomic<int64_t> g_file_generation{0};
}  // namespace

void set_gemm_algorithms(GemmAlgorithms mode) { g_mode.store(mode); }
GemmAlgorithms gemm_algorithms() { return g_mode.load(); }

const char* gemm_algorithms_name(GemmAlgorithms mode) {
  return mode == GemmAlgorithms::Measured ? "measured" : "heuristic";
}

GemmAlgorithms parse_gemm_algorithms(std::string_view name) {
  if (name == "heuristic") return GemmAlgorithms::Heuristic;
  if (name == "measured") return GemmAlgorithms::Measured;
  fail("gemm algorithms", "unknown choice '", std::string(name), "'; allowed: heuristic, measured");
}

void set_gemm_algorithm_file(const std::string& path) {
  std::shared_ptr<GemmAlgorithmFile> file = path.empty() ? nullptr : std::make_shared<GemmAlgorithmFile>(path);
  std::lock_guard<std::mutex> lock(g_file_mutex);
  g_file = std::move(file);
  g_file_generation.fetch_add(1);
}

std::shared_ptr<GemmAlgorithmFile> gemm_algorithm_file() {
  std::lock_guard<std::mutex> lock(g_file_mutex);
  return g_file;
}

int64_t gemm_algorithm_file_generation() { return g_file_generation.load(); }

void record_gemm_algorithm_choice(GemmAlgorithmChoice choice) {
  std::lock_guard<std::mutex> lock(g_choices_mutex);
  g_choices.push_back(std::move(choice));
}

std::vector<GemmAlgorithmChoice> gemm_algorithm_choices() {
  std::lock_guard<std::mutex> lock(g_choices_mutex);
  return g_choices;
}

}  // namespace hg

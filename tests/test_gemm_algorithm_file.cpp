// The file of measured GEMM algorithm choices (core/gemm_algorithm_file.hpp):
// what it keeps, what it refuses, and that a refused file is left as it was.
// The CUDA side (a shape taken from the file untimed) is in test_gemm.cpp.
#include <filesystem>
#include <string>

#include "core/error.hpp"
#include "core/gemm_algorithm_file.hpp"
#include "core/gemm_algorithms.hpp"
#include "tests/catch.hpp"
#include "tests/test_files.hpp"

using namespace hg;
using hg::test::make_temp_dir;
using hg::test::read_bytes;
using hg::test::write_bytes;

namespace {

SavedGemmAlgorithm entry(const std::string& device, const std::string& gemm, int candidate) {
  return {device, 130100, gemm, candidate, 8, "id 66, tile 18", 41.5, 38.25};
}

// The message of the hg::Error that `fn` throws ("" when none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kHeader = R"({"format": "handgrad GEMM algorithms", "version": 1, "entries": )";

}  // namespace

TEST_CASE("GemmAlgorithmFile: a new file is written at once; entries survive a reload, one per key",
          "[gemm_algorithm_file]") {
  const auto dir = make_temp_dir("gemm_file");
  const std::string path = (dir / "gemms.json").string();
  {
    GemmAlgorithmFile file(path);
    CHECK(std::filesystem::exists(path));  // written before any GEMM: an unwritable path fails early
    CHECK(file.size() == 0);
    file.save(entry("NVIDIA H200", "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", 3));
    file.save(entry("NVIDIA H200", "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", 5));  // replaces
    file.save(entry("NVIDIA H100 80GB HBM3", "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", 1));
    CHECK(file.size() == 2);
  }
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  GemmAlgorithmFile again(path);
  CHECK(again.size() == 2);
  SavedGemmAlgorithm got;
  REQUIRE(again.find("NVIDIA H200", 130100, "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", got));
  CHECK(got.candidate == 5);
  CHECK(got.candidates == 8);
  CHECK(got.algorithm == "id 66, tile 18");
  CHECK(got.first_us == 41.5);
  CHECK(got.chosen_us == 38.25);
  REQUIRE(again.find("NVIDIA H100 80GB HBM3", 130100, "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", got));
  CHECK(got.candidate == 1);
  // Another cuBLASLt version or shape is not a match.
  CHECK_FALSE(again.find("NVIDIA H200", 130200, "bf16 8192x768x768 a b -> bf16, none, aligned 16/16/16", got));
  CHECK_FALSE(again.find("NVIDIA H200", 130100, "bf16 8192x768x768 a b -> bf16, none, aligned 8/16/16", got));
  std::filesystem::remove_all(dir);
}

TEST_CASE("GemmAlgorithmFile: a bad file is refused with its path and the fault, and left as it was",
          "[gemm_algorithm_file]") {
  const auto dir = make_temp_dir("gemm_file_bad");
  const std::string path = (dir / "gemms.json").string();
  const std::string one_entry =
      R"([{"device": "d", "cublaslt": 1, "gemm": "g", "candidate": 0, "candidates": 2, "algorithm": "a",)"
      R"( "first_us": 1, "chosen_us": 1}]})";
  const struct {
    std::string text, fault;
  } cases[] = {
      {"{ not json", "is not JSON"},
      {R"({"entries": []})", "is not a GEMM algorithm file"},
      {R"({"format": "handgrad GEMM algorithms", "version": 2, "entries": []})", "unsupported \"version\" 2"},
      {R"({"format": "handgrad GEMM algorithms", "version": 1})", "\"entries\" must be an array"},
      {std::string(kHeader) + "[3]}", "entry 0 is not an object"},
      {std::string(kHeader) + R"([{"device": "d"}]})", "entry 0 needs \"cublaslt\" as an integer"},
      {std::string(kHeader) + R"([{"device": 7}]})", "entry 0 needs \"device\" as a string"},
      {std::string(kHeader) +
           R"([{"device": "d", "cublaslt": 1, "gemm": "g", "candidate": 2, "candidates": 2, "algorithm": "a",)"
           R"( "first_us": 1, "chosen_us": 1}]})",
       "candidate 2 of 2"},
      // Values of the wrong type or past what the field holds: refused, never wrapped.
      {R"({"format": 1, "version": 1, "entries": []})", "is not a GEMM algorithm file"},
      {R"({"format": "handgrad GEMM algorithms", "version": 4294967297, "entries": []})",
       "unsupported \"version\" 4294967297"},
      {std::string(kHeader) +
           R"([{"device": "d", "cublaslt": 1, "gemm": "g", "candidate": 4294967296, "candidates": 2,)"
           R"( "algorithm": "a", "first_us": 1, "chosen_us": 1}]})",
       "entry 0 needs \"candidate\" as an integer in [-2^31, 2^31)"},
      {std::string(kHeader) +
           R"([{"device": "d", "cublaslt": 18446744073709551615, "gemm": "g", "candidate": 0, "candidates": 2,)"
           R"( "algorithm": "a", "first_us": 1, "chosen_us": 1}]})",
       "entry 0 needs \"cublaslt\" as an integer in [-2^63, 2^63)"},
      {std::string(kHeader) +
           R"([{"device": "d", "cublaslt": 1, "gemm": "g", "candidate": 0, "candidates": 2, "algorithm": "a",)"
           R"( "first_us": 1e400, "chosen_us": 1}]})",
       "is not JSON"},  // a number past double's range: refused by the parser, never read as inf
  };
  for (const auto& c : cases) {
    INFO(c.text);
    write_bytes(path, c.text);
    const std::string message = error_of([&] { GemmAlgorithmFile file(path); });
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find(c.fault) != std::string::npos);
    CHECK(read_bytes(path) == c.text);  // nothing already written is lost
  }
  // A good file of one entry reads.
  write_bytes(path, std::string(kHeader) + one_entry);
  CHECK(GemmAlgorithmFile(path).size() == 1);
  // A folder that does not exist cannot be written: refused when the file is set.
  const std::string nowhere = (dir / "missing" / "gemms.json").string();
  const std::string message = error_of([&] { GemmAlgorithmFile file(nowhere); });
  CHECK(message.find("cannot write") != std::string::npos);
  CHECK(message.find(nowhere) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("set_gemm_algorithm_file: set, replaced and dropped; each call plans the shapes again",
          "[gemm_algorithm_file]") {
  const auto dir = make_temp_dir("gemm_file_set");
  const std::string path = (dir / "gemms.json").string();
  const int64_t generation = gemm_algorithm_file_generation();
  set_gemm_algorithm_file(path);
  REQUIRE(gemm_algorithm_file() != nullptr);
  CHECK(gemm_algorithm_file()->path() == path);
  CHECK(gemm_algorithm_file_generation() == generation + 1);
  // A refused file leaves the one in use.
  write_bytes(dir / "bad.json", "[]");
  CHECK_THROWS_AS(set_gemm_algorithm_file((dir / "bad.json").string()), Error);
  CHECK(gemm_algorithm_file()->path() == path);
  set_gemm_algorithm_file("");
  CHECK(gemm_algorithm_file() == nullptr);
  CHECK(gemm_algorithm_file_generation() == generation + 2);
  std::filesystem::remove_all(dir);
}

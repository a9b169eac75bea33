#pragma once
// File utilities shared by the tests that write .npy files and checkpoints.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/module.hpp"

namespace hg::test {

// A fresh, empty folder under the system temp dir, unique per process and tag.
inline std::filesystem::path make_temp_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / ("hg_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

#ifdef HG_SOURCE_DIR
// The files of tests/corpus/<folder> (fuzz seeds and findings), sorted.
inline std::vector<std::filesystem::path> corpus_files(const std::string& folder) {
  std::vector<std::filesystem::path> files;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(HG_SOURCE_DIR) / "tests" / "corpus" / folder))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}
#endif

// Every parameter value of a module, to check that a refused load touched nothing.
inline std::vector<std::vector<double>> parameter_snapshot(Module& m) {
  std::vector<std::vector<double>> out;
  for (Parameter* p : m.parameters()) out.push_back(p->value.to_vector());
  return out;
}

}  // namespace hg::test

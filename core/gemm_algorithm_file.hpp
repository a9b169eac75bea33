#pragma once
// Measured GEMM algorithm choices kept in a JSON file, so that later
// processes take the same algorithms without timing them again (and so
// round the same way): docs/gemm.md, "Algorithm choice". An entry belongs to
// one GPU model and one cuBLASLt version; entries of others stay in the file
// untouched.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hg {

struct SavedGemmAlgorithm {
  std::string device;     // the GPU's name, as cudaGetDeviceProperties gives it
  int64_t library = 0;    // cublasLtGetVersion()
  std::string gemm;       // the shape as GemmAlgorithmChoice::gemm describes it
  int candidate = 0;      // index of the kept one among the heuristic's candidates
  int candidates = 0;     // how many the heuristic offered
  std::string algorithm;  // the kept one's configuration, checked again when the entry is used
  double first_us = 0.0;  // median times when it was measured
  double chosen_us = 0.0;
};

class GemmAlgorithmFile {
 public:
  // Reads `path` when it exists (an hg::Error names the file and what is
  // wrong with it when it cannot be read or is not such a file), then writes
  // it back, so that a path that cannot be written fails here, before any
  // GEMM runs.
  explicit GemmAlgorithmFile(std::string path);

  const std::string& path() const { return path_; }
  // The entry of (device, library, gemm), if the file has one.
  bool find(const std::string& device, int64_t library, const std::string& gemm, SavedGemmAlgorithm& out) const;
  // Adds the entry (replacing one of the same device, library and gemm) and
  // rewrites the file through a temporary beside it and a rename, so that an
  // interrupted write leaves the previous file whole.
  void save(const SavedGemmAlgorithm& entry);
  size_t size() const;
  std::vector<SavedGemmAlgorithm> entries() const;

 private:
  void write() const;
  std::string path_;
  mutable std::mutex mutex_;
  std::vector<SavedGemmAlgorithm> entries_;
};

}  // namespace hg

// libFuzzer target for the GEMM algorithm file (hg::GemmAlgorithmFile, the
// reader behind --gemm-algorithm-file). Any file must load or be refused
// with hg::Error and left byte for byte as it was; a file that loads is
// rewritten in the program's own form, which must load again to the same
// entries (the file a run leaves behind is always readable by the next).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/gemm_algorithm_file.hpp"
#include "tests/test_files.hpp"

namespace {

bool same(const std::vector<hg::SavedGemmAlgorithm>& a, const std::vector<hg::SavedGemmAlgorithm>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].device != b[i].device || a[i].library != b[i].library || a[i].gemm != b[i].gemm ||
        a[i].candidate != b[i].candidate || a[i].candidates != b[i].candidates || a[i].algorithm != b[i].algorithm ||
        a[i].first_us != b[i].first_us || a[i].chosen_us != b[i].chosen_us)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (hg::test::make_temp_dir("fuzz_gemm_algorithms") / "gemms.json").string();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  hg::test::write_bytes(path, bytes);
  std::vector<hg::SavedGemmAlgorithm> entries;
  try {
    entries = hg::GemmAlgorithmFile(path).entries();
  } catch (const hg::Error&) {
    if (hg::test::read_bytes(path) != bytes) std::abort();  // a refused file is left as it was
    return 0;
  }
  if (!same(hg::GemmAlgorithmFile(path).entries(), entries)) std::abort();  // the rewrite reads back
  return 0;
}

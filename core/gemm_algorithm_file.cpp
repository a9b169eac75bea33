#include "core/gemm_algorithm_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_integer.hpp"

namespace hg {
namespace {

using json = nlohmann::json;
constexpr const char* kOp = "gemm algorithm file";
constexpr const char* kFormat = "handgrad GEMM algorithms";
constexpr int kVersion = 1;

// entry[key] as T; anything else names the file, the entry and the key.
template <class T>
T field(const json& entry, const char* key, const std::string& path, size_t index) {
  const auto it = entry.find(key);
  bool ok = it != entry.end();
  if (ok) {
    if constexpr (std::is_same_v<T, std::string>) ok = it->is_string();
    else if constexpr (std::is_floating_point_v<T>) ok = it->is_number();
    else ok = json_integer_fits<T>(*it);
  }
  if (!ok) {
    std::string expected = std::is_same_v<T, std::string> ? "a string" : "a number";
    if constexpr (std::is_integral_v<T>) expected = std::string("an integer in ") + json_integer_range<T>();
    fail(kOp, path, ": entry ", index, " needs \"", key, "\" as ", expected);
  }
  return it->get<T>();
}

std::vector<SavedGemmAlgorithm> parse(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(kOp, path, " is not JSON (", e.what(), "); expected the file --gemm-algorithm-file writes");
  }
  // (json::value would throw its own error for a "format" that is not a string.)
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    fail(kOp, path, " is not a GEMM algorithm file: expected an object with \"format\": \"", kFormat, "\"");
  if (!j.contains("version") || j["version"] != kVersion)
    fail(kOp, path, ": unsupported \"version\" ", j.value("version", json()).dump(), "; this build reads ", kVersion);
  if (!j.contains("entries") || !j["entries"].is_array()) fail(kOp, path, ": \"entries\" must be an array");
  std::vector<SavedGemmAlgorithm> entries;
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const json& e = j["entries"][i];
    if (!e.is_object()) fail(kOp, path, ": entry ", i, " is not an object");
    SavedGemmAlgorithm s{field<std::string>(e, "device", path, i), field<int64_t>(e, "cublaslt", path, i),
                         field<std::string>(e, "gemm", path, i),   field<int>(e, "candidate", path, i),
                         field<int>(e, "candidates", path, i),     field<std::string>(e, "algorithm", path, i),
                         field<double>(e, "first_us", path, i),    field<double>(e, "chosen_us", path, i)};
    if (s.candidates < 1 || s.candidate < 0 || s.candidate >= s.candidates)
      fail(kOp, path, ": entry ", i, " has candidate ", s.candidate, " of ", s.candidates,
           "; expected 0 <= candidate < candidates");
    entries.push_back(std::move(s));
  }
  return entries;
}

bool same_key(const SavedGemmAlgorithm& a, const std::string& device, int64_t library, const std::string& gemm) {
  return a.device == device && a.library == library && a.gemm == gemm;
}

}  // namespace

GemmAlgorithmFile::GemmAlgorithmFile(std::string path) : path_(std::move(path)) {
  HG_CHECK(!path_.empty(), kOp, "an empty path");
  std::error_code ec;
  if (std::filesystem::exists(path_, ec)) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) fail(kOp, "cannot read ", path_, ": ", std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    entries_ = parse(text.str(), path_);
  }
  write();
}

bool GemmAlgorithmFile::find(const std::string& device, int64_t library, const std::string& gemm,
                             SavedGemmAlgorithm& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const SavedGemmAlgorithm& e : entries_)
    if (same_key(e, device, library, gemm)) {
      out = e;
      return true;
    }
  return false;
}

void GemmAlgorithmFile::save(const SavedGemmAlgorithm& entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool replaced = false;
  for (SavedGemmAlgorithm& e : entries_)
    if (same_key(e, entry.device, entry.library, entry.gemm)) {
      e = entry;
      replaced = true;
    }
  if (!replaced) entries_.push_back(entry);
  write();
}

size_t GemmAlgorithmFile::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::vector<SavedGemmAlgorithm> GemmAlgorithmFile::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

void GemmAlgorithmFile::write() const {
  json entries = json::array();
  for (const SavedGemmAlgorithm& e : entries_)
    entries.push_back({{"device", e.device},
                       {"cublaslt", e.library},
                       {"gemm", e.gemm},
                       {"candidate", e.candidate},
                       {"candidates", e.candidates},
                       {"algorithm", e.algorithm},
                       {"first_us", e.first_us},
                       {"chosen_us", e.chosen_us}});
  const json j = {{"format", kFormat}, {"version", kVersion}, {"entries", entries}};
  const std::string temporary = path_ + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) fail(kOp, "cannot write ", temporary, ": ", std::strerror(errno));
    out << j.dump(1) << '\n';
    out.close();
    if (!out) fail(kOp, "writing ", temporary, " failed: ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path_, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(temporary, ec);
    fail(kOp, "cannot replace ", path_, ": ", why);
  }
}

}  // namespace hg

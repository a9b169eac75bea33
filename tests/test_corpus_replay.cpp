// Replays every file under tests/corpus/{npy,checkpoint,gemm_algorithms} (hand-made seeds and
// any crasher the fuzzers found, see scripts/fuzz.sh) through the same parse
// functions the fuzz targets drive. Each input must parse or throw hg::Error;
// a parse must hold no more bytes than the input (bounded allocation) and
// round-trip. Under the ASan build (scripts/test.sh) this also proves the
// inputs cause no memory error.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/checkpoint.hpp"
#include "core/error.hpp"
#include "core/gemm_algorithm_file.hpp"
#include "core/npy.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

namespace fs = std::filesystem;
using hg::Tensor;

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Outcome of one parse: true parsed, false refused with hg::Error (anything else fails the test).
bool replay_npy(const std::string& bytes) {
  Tensor t;
  try {
    t = hg::parse_npy(bytes, "<corpus>");
  } catch (const hg::Error& e) {
    REQUIRE(std::string(e.what()).find("load_npy") != std::string::npos);
    return false;
  }
  REQUIRE(t.nbytes() <= bytes.size());
  const Tensor again = hg::parse_npy(hg::serialize_npy(t));
  REQUIRE(again.shape() == t.shape());
  REQUIRE(again.dtype() == t.dtype());
  REQUIRE((t.nbytes() == 0 || std::memcmp(again.raw_data(), t.raw_data(), t.nbytes()) == 0));
  return true;
}

bool replay_checkpoint(const std::string& bytes) {
  std::vector<hg::CheckpointRecord> records;
  try {
    records = hg::parse_checkpoint(bytes, "<corpus>");
  } catch (const hg::Error& e) {
    REQUIRE(std::string(e.what()).find("Module::load") != std::string::npos);
    return false;
  }
  size_t total = 0;
  for (const auto& r : records) total += r.value.nbytes();
  REQUIRE(total <= bytes.size());
  REQUIRE(hg::serialize_checkpoint(records) == bytes);
  return true;
}

// The fuzz target also tries each input with a valid checksum appended.
std::string sealed(const std::string& body) {
  std::string out = body;
  const uint64_t sum = hg::checkpoint_checksum(body.data(), body.size());
  for (int i = 0; i < 8; ++i) out += static_cast<char>((sum >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

TEST_CASE("npy corpus: every file parses or is refused with hg::Error") {
  const auto files = hg::test::corpus_files("npy");
  REQUIRE(files.size() >= 15);  // the seeds are there: the test cannot pass on an empty folder
  int parsed = 0;
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    INFO(name);
    const bool ok = replay_npy(hg::test::read_bytes(p));
    parsed += ok;
    // Hand-made seeds state their expected outcome in their name.
    if (starts_with(name, "seed_valid_")) REQUIRE(ok);
    else if (starts_with(name, "seed_")) REQUIRE_FALSE(ok);
  }
  REQUIRE(parsed >= 4);
}

TEST_CASE("checkpoint corpus: every file parses or is refused with hg::Error, as is and re-sealed") {
  const auto files = hg::test::corpus_files("checkpoint");
  REQUIRE(files.size() >= 15);
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    INFO(name);
    const std::string bytes = hg::test::read_bytes(p);
    const bool ok = replay_checkpoint(bytes);
    replay_checkpoint(sealed(bytes));
    if (starts_with(name, "seed_valid_")) REQUIRE(ok);
    else if (starts_with(name, "seed_")) REQUIRE_FALSE(ok);
  }
}

TEST_CASE("checkpoint parse refuses hostile records behind a valid checksum with a precise message") {
  // Seeds that pass the checksum gate must be stopped by the specific check they target.
  const std::vector<std::pair<const char*, const char*>> expected = {
      {"seed_1tb_shape.ckpt", "truncated while reading tensor data"},
      {"seed_1tb_nbytes_small_shape.ckpt", "stores 1099511627776 bytes but shape (2, 2) f32 needs 16"},
      {"seed_negative_dims.ckpt", "negative dimension in shape (-2, -2)"},
      {"seed_overflow_dims.ckpt", "is too large"},
      {"seed_nbytes_mismatch.ckpt", "stores 16 bytes but shape (3) f32 needs 12"},
      {"seed_huge_name_len.ckpt", "truncated while reading name"},
      {"seed_huge_count.ckpt", "truncated while reading name length"},
      {"seed_huge_rank.ckpt", "has rank 1000"},
      {"seed_bad_dtype.ckpt", "bad dtype code 9"},
      {"seed_duplicate_name.ckpt", "'w' appears twice"},
      {"seed_trailing_bytes.ckpt", "4 unexpected bytes"},
      {"seed_bad_version.ckpt", "unsupported checkpoint version 7"},
      {"seed_bad_checksum.ckpt", "checksum mismatch"},
      {"seed_bad_magic.ckpt", "not a handgrad checkpoint"},
  };
  for (const auto& [file, text] : expected) {
    INFO(file);
    const std::string bytes = hg::test::read_bytes(fs::path(HG_SOURCE_DIR) / "tests" / "corpus" / "checkpoint" / file);
    try {
      hg::parse_checkpoint(bytes, file);
      FAIL("parsed a hostile checkpoint");
    } catch (const hg::Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      REQUIRE(msg.find(text) != std::string::npos);
      REQUIRE(msg.find(file) != std::string::npos);
    }
  }
}

// The GEMM algorithm file is read from a path: each input is copied to one,
// loaded, and must either load (and the file it is rewritten as load to the
// same entries) or be refused naming the path, with the file left as it was.
TEST_CASE("gemm_algorithms corpus: every file loads and reads back, or is refused and left as it was") {
  const auto files = hg::test::corpus_files("gemm_algorithms");
  REQUIRE(files.size() >= 10);
  const auto dir = hg::test::make_temp_dir("corpus_gemm_algorithms");
  const std::string path = (dir / "gemms.json").string();
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    INFO(name);
    const std::string bytes = hg::test::read_bytes(p);
    hg::test::write_bytes(path, bytes);
    std::vector<hg::SavedGemmAlgorithm> entries;
    bool ok = true;
    try {
      entries = hg::GemmAlgorithmFile(path).entries();
    } catch (const hg::Error& e) {
      ok = false;
      REQUIRE(std::string(e.what()).find(path) != std::string::npos);
      REQUIRE(hg::test::read_bytes(path) == bytes);
    }
    if (ok) {
      const auto again = hg::GemmAlgorithmFile(path).entries();
      REQUIRE(again.size() == entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        REQUIRE(again[i].gemm == entries[i].gemm);
        REQUIRE(again[i].candidate == entries[i].candidate);
        REQUIRE(again[i].first_us == entries[i].first_us);
      }
    }
    if (starts_with(name, "seed_valid_")) REQUIRE(ok);
    else if (starts_with(name, "seed_")) REQUIRE_FALSE(ok);
  }
  fs::remove_all(dir);
}

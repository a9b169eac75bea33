// Checkpoints under failure: interrupted writes (a truncated temporary file at
// every offset, a writer process killed with SIGKILL mid-save) never damage the
// previous checkpoint, and corrupted files -- including corruption that keeps
// a valid checksum -- are refused with a clear hg::Error while parameters stay
// untouched. tests/test_module.cpp covers the round trip and plain flips,
// truncations, wrong shape/dtype and missing/extra sets; this file adds the rest.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/checkpoint.hpp"
#include "core/module.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using hg::DType;
using hg::Module;
using hg::Parameter;
using hg::Tensor;
namespace fs = std::filesystem;

namespace {

// Two parameters of configurable size, so a save can be made slow enough to kill mid-write.
struct Pair : Module {
  Parameter weight, bias;
  Pair(int64_t rows, int64_t cols, hg::Generator& g, DType dtype = DType::F32) {
    register_parameter("weight", weight, Tensor::randn({rows, cols}, g, dtype));
    register_parameter("bias", bias, Tensor::randn({cols}, g, dtype));
  }
};

struct Nested : Module {
  Pair inner;
  Parameter scale;
  explicit Nested(hg::Generator& g) : inner(3, 4, g) {
    register_module("inner", inner);
    register_parameter("scale", scale, Tensor::randn({2}, g));
  }
};

std::string error_of(Module& m, const std::string& path) {
  try {
    m.load(path);
  } catch (const hg::Error& e) {
    return e.what();
  }
  return "";
}

std::string reseal(std::string bytes) {
  bytes.resize(bytes.size() - 8);
  const uint64_t sum = hg::checkpoint_checksum(bytes.data(), bytes.size());
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((sum >> (8 * i)) & 0xff);
  return bytes;
}

}  // namespace

TEST_CASE("a save interrupted at any byte leaves the previous checkpoint intact and loadable") {
  const fs::path dir = hg::test::make_temp_dir("ckpt_rel_trunc");
  const std::string path = (dir / "model.ckpt").string();
  hg::Generator g(11);
  Nested old_model(g);
  old_model.save(path);
  const std::string old_bytes = hg::test::read_bytes(path);
  const auto old_values = hg::test::parameter_snapshot(old_model);

  hg::Generator g2(12);
  Nested new_model(g2);
  std::vector<hg::CheckpointRecord> records;
  for (const auto& [name, p] : new_model.named_parameters()) records.push_back({name, p->value});
  const std::string new_bytes = hg::serialize_checkpoint(records);

  // A crash before the rename leaves some prefix of the new file in "<path>.tmp".
  for (size_t n = 0; n <= new_bytes.size(); ++n) {
    INFO("temporary file cut at " << n << " of " << new_bytes.size() << " bytes");
    hg::test::write_bytes(path + ".tmp", new_bytes.substr(0, n));
    REQUIRE(hg::test::read_bytes(path) == old_bytes);
    hg::Generator g3(13 + n);
    Nested reader(g3);
    reader.load(path);
    REQUIRE(hg::test::parameter_snapshot(reader) == old_values);
    // Loading the torn temporary itself is refused (only the complete file is a checkpoint).
    if (n < new_bytes.size()) REQUIRE_THROWS_AS(reader.load(path + ".tmp"), hg::Error);
  }
  // The next complete save replaces both the stale temporary and the checkpoint.
  new_model.save(path);
  REQUIRE_FALSE(fs::exists(path + ".tmp"));
  REQUIRE(hg::test::read_bytes(path) == new_bytes);
  fs::remove_all(dir);
}

TEST_CASE("a writer killed with SIGKILL mid-save leaves a complete checkpoint") {
  const fs::path dir = hg::test::make_temp_dir("ckpt_rel_kill");
  const std::string path = (dir / "model.ckpt").string();
  // ~4 MB of parameters: each save spends milliseconds in write()/fsync(), so kills land inside it.
  hg::Generator g(21);
  Pair model(1024, 1024, g);
  model.weight.value.fill_(-1.0);
  model.bias.value.fill_(-1.0);
  model.save(path);

  int killed_mid_write = 0;
  const int trials = 12;
  for (int trial = 0; trial < trials; ++trial) {
    fs::remove(path + ".tmp");  // a torn temporary from the previous trial
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The writer: save version k (every value equal to k) over and over until killed.
      // It must never return into Catch2 (that would run the rest of the suite twice).
      try {
        for (int k = 0;; ++k) {
          model.weight.value.fill_(k);
          model.bias.value.fill_(k);
          model.save(path);
        }
      } catch (...) {
      }
      ::_exit(1);
    }
    // Wait until the writer has the temporary file open, then kill it a little later
    // (0 to 27.5 ms): early kills land inside write()/fsync(), later ones anywhere in the loop.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(path + ".tmp") && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    const bool tmp_before = fs::exists(path + ".tmp");
    std::this_thread::sleep_for(std::chrono::microseconds(2500 * trial));
    REQUIRE(::kill(child, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    killed_mid_write += (tmp_before && fs::exists(path + ".tmp")) ? 1 : 0;

    // Whatever moment the kill hit, the checkpoint is one complete version: all values equal.
    hg::Generator g2(22);
    Pair reader(1024, 1024, g2);
    REQUIRE_NOTHROW(reader.load(path));
    const double v = reader.bias.value.at({0});
    const auto w = reader.weight.value.to_vector();
    const auto b = reader.bias.value.to_vector();
    REQUIRE(std::all_of(w.begin(), w.end(), [&](double x) { return x == v; }));
    REQUIRE(std::all_of(b.begin(), b.end(), [&](double x) { return x == v; }));
  }
  INFO("kills that left a partial .tmp behind: " << killed_mid_write << " of " << trials);
  REQUIRE(killed_mid_write >= 1);  // at least one kill really interrupted a write
  fs::remove_all(dir);
}

TEST_CASE("corruption behind a valid checksum: refused, or accepted only as the exact data it encodes") {
  // An attacker (or a bug) that rewrites the checksum defeats FNV; every structural
  // field must still be validated. Flip each byte, reseal, and load.
  const fs::path dir = hg::test::make_temp_dir("ckpt_rel_reseal");
  const std::string path = (dir / "model.ckpt").string();
  hg::Generator g(31);
  Nested source(g);
  source.save(path);
  const std::string good = hg::test::read_bytes(path);
  // Where tensor data lives in the file: a flip there changes one value, nothing else.
  std::vector<std::pair<size_t, size_t>> data_ranges;
  {
    size_t pos = 8 + 4 + 4;
    for (const auto& [name, p] : source.named_parameters()) {
      pos += 4 + name.size() + 4 + 4 + 8 * p->value.ndim() + 8;
      data_ranges.emplace_back(pos, pos + p->value.nbytes());
      pos += p->value.nbytes();
    }
    REQUIRE(pos + 8 == good.size());
  }
  auto in_data = [&](size_t i) {
    for (auto [lo, hi] : data_ranges)
      if (i >= lo && i < hi) return true;
    return false;
  };

  hg::Generator g2(32);
  Nested target(g2);
  const auto untouched = hg::test::parameter_snapshot(target);
  int refused = 0, accepted = 0;
  for (size_t i = 0; i + 8 < good.size(); ++i) {
    for (unsigned char mask : {0x01, 0x80, 0xff}) {
      INFO("byte " << i << " xor " << int(mask));
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      hg::test::write_bytes(path, reseal(bad));
      const std::string err = error_of(target, path);
      if (!err.empty()) {
        REQUIRE_FALSE(in_data(i));
        REQUIRE(err.find("Module::load") != std::string::npos);
        REQUIRE(err.find(path) != std::string::npos);
        REQUIRE(hg::test::parameter_snapshot(target) == untouched);
        ++refused;
      } else {
        REQUIRE(in_data(i));  // a header flip must never be accepted
        // The loaded parameters are exactly what the file now says.
        std::vector<hg::CheckpointRecord> records = hg::parse_checkpoint(reseal(bad));
        for (const auto& r : records)
          for (const auto& [name, p] : target.named_parameters())
            if (name == r.name)  // bytes, not values: a flipped exponent may make a NaN
              REQUIRE(std::memcmp(p->value.raw_data(), r.value.raw_data(), r.value.nbytes()) == 0);
        // Restore for the next round.
        for (size_t k = 0; k < untouched.size(); ++k) {
          Parameter* p = target.parameters()[k];
          p->value.copy_(Tensor::from_vector(untouched[k], p->value.shape(), p->value.dtype()));
        }
        ++accepted;
      }
    }
  }
  REQUIRE(refused > 0);
  REQUIRE(accepted > 0);
  fs::remove_all(dir);
}

TEST_CASE("refusals name the file, the tensor and the mismatch, and change nothing") {
  const fs::path dir = hg::test::make_temp_dir("ckpt_rel_msg");
  const std::string path = (dir / "model.ckpt").string();
  hg::Generator g(41);
  Nested target(g);
  const auto untouched = hg::test::parameter_snapshot(target);
  auto expect_refusal = [&](const std::vector<std::string>& needles) {
    const std::string err = error_of(target, path);
    INFO(err);
    REQUIRE_FALSE(err.empty());
    REQUIRE(err.find(path) != std::string::npos);
    for (const auto& n : needles) REQUIRE(err.find(n) != std::string::npos);
    REQUIRE(hg::test::parameter_snapshot(target) == untouched);
  };
  auto save_records = [&](const std::vector<std::pair<std::string, Tensor>>& recs) {
    std::vector<hg::CheckpointRecord> records;
    for (const auto& [n, t] : recs) records.push_back({n, t});
    hg::test::write_bytes(path, hg::serialize_checkpoint(records));
  };
  const Tensor w = Tensor::zeros({3, 4}), b = Tensor::zeros({4}), s = Tensor::zeros({2});

  SECTION("missing tensor is named") {
    save_records({{"scale", s}, {"inner.weight", w}});
    expect_refusal({"'inner.bias' missing", "file has 2 tensors, module has 3 parameters"});
  }
  SECTION("extra tensor is named") {
    save_records({{"scale", s}, {"inner.weight", w}, {"inner.bias", b}, {"inner.extra", b}});
    expect_refusal({"'inner.extra' in the file is not a parameter"});
  }
  SECTION("renamed tensor") {
    save_records({{"scale", s}, {"inner.weight", w}, {"inner.bias_", b}});
    expect_refusal({"'inner.bias_' in the file is not a parameter"});
  }
  SECTION("transposed shape") {
    save_records({{"scale", s}, {"inner.weight", Tensor::zeros({4, 3})}, {"inner.bias", b}});
    expect_refusal({"'inner.weight' has shape (4, 3) in the file but (3, 4) in the module"});
  }
  SECTION("same numel, different rank") {
    save_records({{"scale", s}, {"inner.weight", Tensor::zeros({12})}, {"inner.bias", b}});
    expect_refusal({"(12)", "(3, 4)"});
  }
  SECTION("dtype") {
    save_records({{"scale", s.to(DType::F64)}, {"inner.weight", w}, {"inner.bias", b}});
    expect_refusal({"'scale' is f64 in the file but f32 in the module"});
  }
  SECTION("truncated at every length") {
    save_records({{"scale", s}, {"inner.weight", w}, {"inner.bias", b}});
    const std::string good = hg::test::read_bytes(path);
    for (size_t n = 0; n < good.size(); ++n) {
      INFO("cut at " << n);
      hg::test::write_bytes(path, good.substr(0, n));
      expect_refusal({"Module::load"});
    }
  }
  SECTION("empty file and a directory") {
    hg::test::write_bytes(path, "");
    expect_refusal({"not a handgrad checkpoint"});
    fs::remove(path);
    fs::create_directories(path);
    REQUIRE_THROWS_AS(target.load(path), hg::Error);
    REQUIRE(hg::test::parameter_snapshot(target) == untouched);
  }
  fs::remove_all(dir);
}

TEST_CASE("save into a missing directory fails cleanly and leaves no file") {
  hg::Generator g(51);
  Nested m(g);
  const std::string path = "/nonexistent_hg_dir/model.ckpt";
  REQUIRE_THROWS_AS(m.save(path), hg::Error);
  REQUIRE_FALSE(fs::exists(path));
}

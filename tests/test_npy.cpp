// .npy I/O: round trips and hostile files (every bad file must be an hg::Error naming it).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/npy.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using hg::DType;
using hg::Tensor;
namespace fs = std::filesystem;

namespace {

// A .npy file with an arbitrary header dict (padded like NumPy) and payload.
std::string make_npy(const std::string& dict, const std::string& payload, int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + payload;
}

std::string floats(int n) { return std::string(static_cast<size_t>(n) * 4, '\0'); }

std::string load_error(const fs::path& p) {
  try {
    hg::load_npy(p.string());
  } catch (const hg::Error& e) {
    return e.what();
  }
  return "<no hg::Error thrown>";
}

}  // namespace

TEST_CASE("npy round trip for f32 and f64, all ranks including 0-d") {
  const fs::path dir = hg::test::make_temp_dir("npy_1");
  hg::Generator g(11);
  const std::vector<hg::Shape> shapes = {{}, {1}, {7}, {3, 5}, {2, 3, 4}, {0, 3}, {2, 1, 1, 3}};
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const auto& shape : shapes) {
      const Tensor t = Tensor::randn(shape, g, dtype);
      const fs::path p = dir / "t.npy";
      hg::save_npy(p.string(), t);
      const Tensor back = hg::load_npy(p.string());
      REQUIRE(back.dtype() == dtype);
      REQUIRE(back.shape() == shape);
      REQUIRE(back.to_vector() == t.to_vector());  // bit-exact
      // The header is padded so the data starts on a 64-byte boundary, as NumPy writes it.
      const std::string bytes = hg::serialize_npy(t);
      REQUIRE((bytes.size() - t.nbytes()) % 64 == 0);
      REQUIRE(hg::parse_npy(bytes).to_vector() == t.to_vector());
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("npy reads headers the way NumPy writes them, v1 and v2") {
  // NumPy spells a 1-tuple "(3,)"; keys may come in any order; v2 uses a 4-byte length.
  std::string payload(12, '\0');
  const float vals[3] = {1.5f, -2.0f, 0.25f};
  std::memcpy(&payload[0], vals, 12);
  const Tensor a = hg::parse_npy(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", payload));
  REQUIRE(a.to_vector() == std::vector<double>{1.5, -2.0, 0.25});
  const Tensor b = hg::parse_npy(make_npy("{'shape': (1, 3), 'fortran_order': False, 'descr': '<f4'}", payload, 2));
  REQUIRE(b.shape() == hg::Shape{1, 3});
  const Tensor c =
      hg::parse_npy(make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", std::string(8, '\0')));
  REQUIRE(c.ndim() == 0);
  REQUIRE(c.item() == 0.0);
}

TEST_CASE("npy rejects malformed and hostile files with hg::Error naming the file") {
  const fs::path dir = hg::test::make_temp_dir("npy_2");
  const fs::path p = dir / "bad.npy";
  const std::string good = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", floats(6));
  REQUIRE_NOTHROW(hg::parse_npy(good));

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty file", ""},
      {"truncated data", good.substr(0, good.size() - 1)},
      {"truncated header", good.substr(0, 40)},
      {"truncated magic", good.substr(0, 5)},
      {"bad magic", "\x93NUMPZ" + good.substr(6)},
      {"trailing data", good + "xx"},
      {"bad version", good.substr(0, 6) + '\x03' + good.substr(7)},
      {"int32", make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", floats(6))},
      {"big endian", make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", floats(6))},
      {"fortran order", make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", floats(6))},
      {"absurd shape (1 TB)",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (262144, 1048576), }", floats(6))},
      {"overflowing product",
       make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", floats(6))},
      {"dim overflows int64",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", floats(6))},
      {"negative dim", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -3), }", floats(6))},
      {"shape too small for data", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", floats(6))},
      {"missing shape", make_npy("{'descr': '<f4', 'fortran_order': False, }", floats(6))},
      {"unknown key", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", floats(6))},
      {"duplicate key", make_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", floats(6))},
      {"unterminated string", make_npy("{'descr: <f4, 'fortran_order': False, 'shape': (6,)}", floats(6))},
      {"unclosed tuple", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6, }", floats(6))},
      {"not a dict", make_npy("descr '<f4'", floats(6))},
      {"garbage in tuple", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", floats(6))},
      {"header length past end", good.substr(0, 8) + std::string("\xff\xff", 2) + good.substr(10)},
  };
  for (const auto& [name, bytes] : cases) {
    INFO(name);
    hg::test::write_bytes(p, bytes);
    const std::string msg = load_error(p);
    CAPTURE(msg);
    REQUIRE(msg.find("load_npy") != std::string::npos);
    REQUIRE(msg.find(p.string()) != std::string::npos);
  }
  REQUIRE(load_error(dir / "does_not_exist.npy").find("does_not_exist.npy") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("npy refuses to save dtypes it cannot describe") {
  REQUIRE_THROWS_AS(hg::serialize_npy(Tensor::zeros({2}).to(DType::BF16)), hg::Error);
  REQUIRE_THROWS_AS(hg::serialize_npy(Tensor()), hg::Error);
  REQUIRE_THROWS_AS(hg::save_npy("/nonexistent_dir_hg/x.npy", Tensor::zeros({2})), hg::Error);
}

TEST_CASE("npy: every truncation of a valid file is an error, never a crash") {
  const std::string good = hg::serialize_npy(Tensor::arange(10, DType::F64).reshape({2, 5}));
  for (size_t n = 0; n < good.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    REQUIRE_THROWS_AS(hg::parse_npy(good.substr(0, n)), hg::Error);
  }
}

#include "core/npy.hpp"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace hg {

namespace {

// .npy layout: "\x93NUMPY", major, minor, header length (u16 for v1, u32 for v2),
// an ASCII Python dict literal padded with spaces and ending in '\n', then raw data.
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// Hand-written parser for the one dict literal .npy headers contain. Every
// read is bounds-checked, so a malformed header can only produce hg::Error.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      expect(':');
      if (key == "descr" && !seen_descr) {
        descr = parse_string();
        seen_descr = true;
      } else if (key == "fortran_order" && !seen_fortran) {
        fortran = parse_bool();
        seen_fortran = true;
      } else if (key == "shape" && !seen_shape) {
        shape = parse_shape();
        seen_shape = true;
      } else {
        error("unexpected or repeated key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') break;
      error("expected ',' or '}'");
    }
    expect('}');
    skip_space();
    if (pos_ != s_.size()) error("trailing characters after the dict");
    if (!seen_descr || !seen_fortran || !seen_shape) error("missing 'descr', 'fortran_order' or 'shape'");
  }

 private:
  [[noreturn]] void error(const std::string& why) const {
    fail("load_npy", what_, ": malformed header at character ", pos_, ": ", why);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string::npos) error("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    skip_space();
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    error("expected True or False");
  }
  int64_t parse_dim() {
    skip_space();
    if (!std::isdigit(static_cast<unsigned char>(peek()))) error("expected a non-negative integer dimension");
    int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int digit = s_[pos_++] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) error("dimension overflows int64");
      v = v * 10 + digit;
    }
    return v;
  }
  // "()", "(5,)", "(2, 3)", "(2, 3,)"; a 1-tuple needs its comma in Python, but we accept "(5)" too.
  Shape parse_shape() {
    Shape shape;
    expect('(');
    skip_space();
    while (peek() != ')') {
      shape.push_back(parse_dim());
      if (shape.size() > 32) error("more than 32 dimensions");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        error("expected ',' or ')' in shape");
      }
    }
    ++pos_;
    return shape;
  }

  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
};

uint32_t read_le(const std::string& b, size_t at, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    fail("load_npy", what, ": not a .npy file (bad magic or too short, ", bytes.size(), " bytes)");
  const int major = static_cast<unsigned char>(bytes[6]);
  if (major != 1 && major != 2) fail("load_npy", what, ": unsupported .npy version ", major, ".", int(bytes[7]));
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) fail("load_npy", what, ": truncated before the header length");
  const size_t header_len = read_le(bytes, kMagicLen + 2, len_bytes);
  if (header_len > bytes.size() - prefix)
    fail("load_npy", what, ": header claims ", header_len, " bytes but the file holds ", bytes.size() - prefix);
  const std::string header = bytes.substr(prefix, header_len);

  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(header, what).parse(descr, fortran, shape);

  DType dtype;
  if (descr == "<f4") dtype = DType::F32;
  else if (descr == "<f8") dtype = DType::F64;
  else fail("load_npy", what, ": unsupported dtype '", descr, "' (only '<f4' and '<f8')");
  if (fortran) fail("load_npy", what, ": fortran_order True is not supported (C order only)");

  // Bound the element count by the bytes actually present before allocating anything.
  const size_t available = bytes.size() - prefix - header_len;
  const size_t esize = dtype_size(dtype);
  const size_t capacity = available / esize;  // elements the file can hold
  // Even a zero-element shape such as (2^62, 2^62, 0) must have a representable
  // product of its other dims, or Tensor::empty would refuse it without naming the file.
  int64_t nonzero_product = 1;
  for (int64_t d : shape) {
    if (d == 0) continue;
    if (nonzero_product > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(esize) / d)
      fail("load_npy", what, ": shape ", shape, " has too many elements");
    nonzero_product *= d;
  }
  bool has_zero_dim = false;
  for (int64_t d : shape) has_zero_dim = has_zero_dim || d == 0;
  size_t numel = has_zero_dim ? 0 : 1;
  for (int64_t d : shape) {
    if (has_zero_dim) break;
    if (numel > capacity / static_cast<size_t>(d))
      fail("load_npy", what, ": shape ", shape, " needs more data than the file's ", available, " bytes");
    numel *= static_cast<size_t>(d);
  }
  if (numel > available / esize || numel * esize != available)
    fail("load_npy", what, ": shape ", shape, " ", descr, " needs ", numel, " elements but the file has ", available,
         " data bytes");

  Tensor t = Tensor::empty(shape, dtype);
  // Data is little-endian; handgrad only targets little-endian hosts (x86-64, aarch64).
  if (available > 0) std::memcpy(t.raw_data(), bytes.data() + prefix + header_len, available);
  return t;
}

std::string serialize_npy(const Tensor& t) {
  t.check_defined("save_npy");
  if (t.dtype() != DType::F32 && t.dtype() != DType::F64)
    fail("save_npy", "only f32 and f64 can be saved, got ", dtype_name(t.dtype()), " tensor ", t.shape());
  // Python's tuple spelling: "()", "(5,)", "(2, 3)".
  std::string shape_text = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) shape_text += (i ? ", " : "") + std::to_string(t.shape()[i]);
  shape_text += t.shape().size() == 1 ? ",)" : ")";
  std::string dict = std::string("{'descr': '") + (t.dtype() == DType::F32 ? "<f4" : "<f8") +
                     "', 'fortran_order': False, 'shape': " + shape_text;
  dict += ", }";
  // v1 when the header length fits in 16 bits; total prefix + header is padded to 64 bytes.
  const bool v1 = dict.size() + 1 + 10 + 64 <= 65535;
  const size_t prefix = v1 ? 10 : 12;
  const size_t padded = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(padded - prefix - dict.size() - 1, ' ');
  dict += '\n';

  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  const size_t len = dict.size();
  for (size_t i = 0; i < (v1 ? 2u : 4u); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += dict;
  const Tensor host = t.to(Device::CPU);
  out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  return out;
}

void save_npy(const std::string& path, const Tensor& t) {
  const std::string bytes = serialize_npy(t);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("save_npy", "cannot open '", path, "' for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) fail("save_npy", "failed writing '", path, "'");
}

Tensor load_npy(const std::string& path) {
  // A directory opens as a stream whose size reads as ~2^63: check before allocating.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail("load_npy", "'", path, "' does not exist or is not a regular file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail("load_npy", "cannot open '", path, "'");
  const std::streamoff size = f.tellg();
  if (size < 0) fail("load_npy", "cannot determine the size of '", path, "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(&bytes[0], size);
  if (f.gcount() != size) fail("load_npy", "short read of '", path, "'");
  return parse_npy(bytes, path);
}

}  // namespace hg

#include "core/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace hg {

// File: magic "HGCKPT01" | u32 version | u32 count | count entries | u64 checksum.
// Entry: u32 name_len | name | u32 dtype | u32 ndim | i64 dims[ndim] | u64 nbytes | data.
// The checksum is FNV-1a 64 over every byte before it. Integers are little-endian.

namespace {

constexpr char kMagic[8] = {'H', 'G', 'C', 'K', 'P', 'T', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxRank = 32;
constexpr const char* kOp = "Module::load";

template <class T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}

// Bounds-checked little-endian reader over bytes [0, end).
class Reader {
 public:
  Reader(const std::string& bytes, size_t end, const std::string& what) : b_(bytes), end_(end), what_(what) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  const char* take(size_t n, const char* field) {
    need(n, field);
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t pos() const { return pos_; }
  void seek(size_t p) { pos_ = p; }

 private:
  void need(size_t n, const char* field) const {
    if (n > end_ - pos_) fail(kOp, what_, ": truncated while reading ", field);
  }
  const std::string& b_;
  size_t end_;
  const std::string& what_;
  size_t pos_ = 0;
};

// Element count of `shape` as stored bytes, or a clear error: dims must be
// non-negative and the byte count must not overflow.
uint64_t expected_nbytes(const Shape& shape, DType dtype, const std::string& name, const std::string& what) {
  uint64_t n = 1;
  const uint64_t limit = std::numeric_limits<int64_t>::max() / dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) fail(kOp, what, ": '", name, "' has a negative dimension in shape ", shape);
    if (d != 0 && n > limit / static_cast<uint64_t>(d))
      fail(kOp, what, ": '", name, "' shape ", shape, " is too large");
    n *= static_cast<uint64_t>(d);
  }
  return n * dtype_size(dtype);
}

}  // namespace

uint64_t checkpoint_checksum(const char* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string serialize_checkpoint(const std::vector<CheckpointRecord>& records) {
  std::string out(kMagic, sizeof kMagic);
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(records.size()));
  for (const CheckpointRecord& r : records) {
    r.value.check_defined("Module::save");
    const Tensor host = r.value.to(Device::CPU);
    put<uint32_t>(out, static_cast<uint32_t>(r.name.size()));
    out += r.name;
    put<uint32_t>(out, static_cast<uint32_t>(host.dtype()));
    put<uint32_t>(out, static_cast<uint32_t>(host.ndim()));
    for (int64_t d : host.shape()) put<int64_t>(out, d);
    put<uint64_t>(out, host.nbytes());
    out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  put<uint64_t>(out, checkpoint_checksum(out.data(), out.size()));
  return out;
}

std::vector<CheckpointRecord> parse_checkpoint(const std::string& bytes, const std::string& what) {
  const size_t min_size = sizeof kMagic + 4 + 4 + 8;
  if (bytes.size() < min_size || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    fail(kOp, what, ": not a handgrad checkpoint (bad magic or too short)");
  // The checksum covers everything before the last 8 bytes; a flipped bit anywhere fails here.
  const size_t body = bytes.size() - 8;
  Reader trailer(bytes, bytes.size(), what);
  trailer.seek(body);
  if (trailer.get<uint64_t>("checksum") != checkpoint_checksum(bytes.data(), body))
    fail(kOp, what, ": checksum mismatch (file corrupted or truncated)");

  Reader r(bytes, body, what);
  r.take(sizeof kMagic, "magic");
  const uint32_t version = r.get<uint32_t>("version");
  if (version != kVersion) fail(kOp, what, ": unsupported checkpoint version ", version);
  const uint32_t count = r.get<uint32_t>("entry count");

  // No reserve(count): count is untrusted; each entry consumes at least 20 bytes or throws.
  std::vector<CheckpointRecord> records;
  std::set<std::string> names;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t name_len = r.get<uint32_t>("name length");
    std::string name(r.take(name_len, "name"), name_len);
    const uint32_t dtype_code = r.get<uint32_t>("dtype");
    if (dtype_code > static_cast<uint32_t>(DType::F16))
      fail(kOp, what, ": '", name, "' has bad dtype code ", dtype_code);
    const DType dtype = static_cast<DType>(dtype_code);
    const uint32_t ndim = r.get<uint32_t>("rank");
    if (ndim > kMaxRank) fail(kOp, what, ": '", name, "' has rank ", ndim, " (at most ", kMaxRank, ")");
    Shape shape;
    for (uint32_t d = 0; d < ndim; ++d) shape.push_back(r.get<int64_t>("dims"));
    const uint64_t nbytes = r.get<uint64_t>("byte count");
    if (nbytes != expected_nbytes(shape, dtype, name, what))
      fail(kOp, what, ": '", name, "' stores ", nbytes, " bytes but shape ", shape, " ", dtype_name(dtype), " needs ",
           expected_nbytes(shape, dtype, name, what));
    const char* data = r.take(nbytes, "tensor data");  // bounded by the file size before any allocation
    if (!names.insert(name).second) fail(kOp, what, ": tensor '", name, "' appears twice");
    Tensor t = Tensor::empty(shape, dtype);
    if (nbytes > 0) std::memcpy(t.raw_data(), data, nbytes);
    records.push_back({std::move(name), std::move(t)});
  }
  if (r.pos() != body) fail(kOp, what, ": ", body - r.pos(), " unexpected bytes after the last tensor");
  return records;
}

// ---- files ----

void write_file_durably(const std::string& path, const std::string& bytes, const char* op) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(op, "cannot open '", tmp, "': ", std::strerror(errno));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fail(op, "write to '", tmp, "' failed: ", std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a crash could leave the new name pointing at unwritten data.
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(op, "fsync of '", tmp, "' failed: ", std::strerror(err));
  }
  if (::close(fd) != 0) fail(op, "close of '", tmp, "' failed: ", std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(op, "rename '", tmp, "' -> '", path, "' failed: ", std::strerror(errno));
}

std::string read_whole_file(const std::string& path, const char* op) {
  // A directory opens as a stream whose size reads as ~2^63: check before allocating.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(op, "'", path, "' does not exist or is not a regular file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail(op, "cannot open '", path, "'");
  const std::streamoff size = f.tellg();
  if (size < 0) fail(op, "cannot determine the size of '", path, "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(&bytes[0], size);
  if (f.gcount() != size) fail(op, "short read of '", path, "'");
  return bytes;
}

void write_checkpoint_file(const std::string& path, const std::vector<CheckpointRecord>& records, const char* op) {
  write_file_durably(path, serialize_checkpoint(records), op);
}

std::map<std::string, Tensor> read_checkpoint_file(const std::string& path, const char* op) {
  std::map<std::string, Tensor> entries;
  for (CheckpointRecord& r : parse_checkpoint(read_whole_file(path, op), path))
    entries.emplace(std::move(r.name), std::move(r.value));
  return entries;
}

}  // namespace hg

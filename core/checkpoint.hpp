#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace hg {

// The checkpoint file format behind Module::save / Module::load, on byte
// buffers so that the loader, its fuzz target and the corpus replay test all
// run the same code. Layout and safety argument: docs/checkpoint_and_npy.md.
struct CheckpointRecord {
  std::string name;  // dotted parameter name
  Tensor value;      // CPU tensor
};

// Encodes the records (any device; copied to the host) with the trailing checksum.
std::string serialize_checkpoint(const std::vector<CheckpointRecord>& records);

// Decodes and fully validates a checkpoint: magic, version, checksum, every
// length against the bytes present, dtype codes, non-negative dims whose
// element count matches the stored byte count, unique names, no trailing
// bytes. Anything else throws hg::Error ("Module::load: <what>: ..."). The
// tensors returned never hold more bytes than `bytes` itself.
std::vector<CheckpointRecord> parse_checkpoint(const std::string& bytes, const std::string& what = "<buffer>");

// The checkpoint files of Module::save/load and Optimizer::save_state/
// load_state. Writing goes to path + ".tmp", fsyncs it, then renames it over
// `path`: a crash at any point leaves the old file or the new one, never half
// of one. Reading takes the whole of a regular file (a directory or a missing
// path is an error) through parse_checkpoint and returns its tensors by name
// (names are unique). `op` names the caller in the hg::Error a failure throws.
void write_checkpoint_file(const std::string& path, const std::vector<CheckpointRecord>& records, const char* op);
std::map<std::string, Tensor> read_checkpoint_file(const std::string& path, const char* op);

// The two halves of the above on raw bytes, for the files stored beside a
// checkpoint: written to path + ".tmp", fsynced, renamed over `path`; read
// whole from a regular file. Failures throw hg::Error naming `op` and the file.
void write_file_durably(const std::string& path, const std::string& bytes, const char* op);
std::string read_whole_file(const std::string& path, const char* op);

// FNV-1a 64 over n bytes: the checksum stored in the last 8 bytes of a file.
uint64_t checkpoint_checksum(const char* data, size_t n);

}  // namespace hg

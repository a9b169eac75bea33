#include "examples/common/run_record.hpp"

#include <type_traits>
#include <utility>
#include <vector>

#include <fstream>

#include "core/checkpoint.hpp"
#include "core/error.hpp"
#include "core/json_integer.hpp"
#include "core/logging.hpp"
#include "examples/common/flag_json.hpp"

namespace hg::cli {

namespace {

constexpr const char* kOp = "run record";
constexpr const char* kFormat = "handgrad-run";
constexpr int kVersion = 1;

// The tokenizer each task may use.
bool tokenizer_fits(const std::string& task, const std::string& tokenizer) {
  if (task == "data") return tokenizer == "bytes" || tokenizer == "bpe";
  return (task == "synthetic" || task == "translate") && tokenizer == task;
}

// Reads key `key` of object `j` (called `where` in messages) as T, or throws
// naming the file, the key and what it holds instead.
template <class T>
T get(const nlohmann::json& j, const std::string& where, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end()) fail(kOp, path, ": missing key '", where, key, "'");
  constexpr bool text = std::is_same<T, std::string>::value, whole = std::is_integral<T>::value;
  bool ok = it->is_number();
  if constexpr (text) ok = it->is_string();
  else if constexpr (whole) ok = json_integer_fits<T>(*it);
  if (!ok) {
    std::string expected = text ? "a string" : "a number";
    if constexpr (whole) expected = std::string("a whole number in ") + json_integer_range<T>();
    fail(kOp, path, ": key '", where, key, "' is ", it->dump(), ", not ", expected);
  }
  return it->get<T>();
}

}  // namespace

std::string run_record_path(const std::string& checkpoint) { return checkpoint + ".json"; }

void save_run_record(const std::string& checkpoint, const RunRecord& r) {
  HG_CHECK(tokenizer_fits(r.task, r.tokenizer), kOp, "task '", r.task, "' with tokenizer '", r.tokenizer,
           "' (allowed: synthetic/synthetic, data/bytes, data/bpe, translate/translate)");
  const DecoderLMConfig& m = r.model;
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["task"] = r.task;
  j["tokenizer"] = r.tokenizer;
  j["model"] = {{"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len}, {"d_model", m.d_model},
                {"n_heads", m.n_heads},       {"n_layers", m.n_layers},       {"ffn_hidden", m.ffn_hidden},
                {"ln_eps", m.ln_eps},         {"dropout", m.dropout}};
  j["flags"] = r.flags.is_null() ? nlohmann::json::object() : r.flags;
  write_file_durably(run_record_path(checkpoint), j.dump(2) + "\n", kOp);
}

RunRecord load_run_record(const std::string& checkpoint) {
  const std::string path = run_record_path(checkpoint);
  const std::string text = read_whole_file(path, kOp);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(kOp, path, ": not JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(kOp, path, ": not a handgrad run record (a JSON ", j.type_name(), ", not an object)");
  const auto format = j.find("format");
  if (format == j.end() || *format != kFormat)
    fail(kOp, path, ": not a handgrad run record (\"format\" is ", format == j.end() ? "missing" : format->dump(),
         ", expected \"", kFormat, "\")");
  const int version = get<int>(j, "", "version", path);
  if (version != kVersion) fail(kOp, path, ": version ", version, "; this handgrad reads version ", kVersion);

  RunRecord r;
  r.task = get<std::string>(j, "", "task", path);
  r.tokenizer = get<std::string>(j, "", "tokenizer", path);
  if (!tokenizer_fits(r.task, r.tokenizer))
    fail(kOp, path, ": task \"", r.task, "\" with tokenizer \"", r.tokenizer,
         "\" (allowed: synthetic/synthetic, data/bytes, data/bpe, translate/translate)");
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object()) fail(kOp, path, ": missing key 'model' (an object)");
  DecoderLMConfig& m = r.model;
  const std::vector<std::pair<const char*, int64_t*>> sizes{
      {"vocab_size", &m.vocab_size}, {"max_seq_len", &m.max_seq_len}, {"d_model", &m.d_model},
      {"n_heads", &m.n_heads},       {"n_layers", &m.n_layers},       {"ffn_hidden", &m.ffn_hidden}};
  for (const auto& [key, field] : sizes) {
    *field = get<int64_t>(*model, "model.", key, path);
    const int64_t lowest = std::string(key) == "ffn_hidden" ? 0 : 1;  // ffn_hidden 0: 4 * d_model
    if (*field < lowest) fail(kOp, path, ": model.", key, " is ", *field, "; must be at least ", lowest);
  }
  if (m.d_model % m.n_heads != 0)
    fail(kOp, path, ": model.n_heads ", m.n_heads, " does not divide model.d_model ", m.d_model);
  m.ln_eps = get<double>(*model, "model.", "ln_eps", path);
  if (!(m.ln_eps > 0 && m.ln_eps < 1)) fail(kOp, path, ": model.ln_eps is ", m.ln_eps, "; must be in (0, 1)");
  m.dropout = get<double>(*model, "model.", "dropout", path);
  if (!(m.dropout >= 0 && m.dropout < 1)) fail(kOp, path, ": model.dropout is ", m.dropout, "; must be in [0, 1)");
  const auto flags = j.find("flags");
  if (flags == j.end() || !flags->is_object()) fail(kOp, path, ": missing key 'flags' (an object)");
  r.flags = *flags;
  return r;
}

std::optional<RunRecord> take_run_record(CLI::App& app, const std::string& checkpoint,
                                         const std::set<std::string>& per_invocation,
                                         const std::set<std::string>& changeable) {
  const std::string path = run_record_path(checkpoint);
  if (!std::ifstream(path)) {
    spdlog::warn("{} does not exist (the checkpoint was written by an older train): the configuration comes from "
                 "the flags",
                 path);
    return std::nullopt;
  }
  RunRecord r = load_run_record(checkpoint);
  take_recorded_flags(app, r.flags, per_invocation, changeable, path);
  return r;
}

void check_run_record(const RunRecord& recorded, const RunRecord& rebuilt, const std::string& checkpoint) {
  const auto text = [](const RunRecord& r) {
    const DecoderLMConfig& m = r.model;
    return fmt::format("task {}, tokenizer {}, model vocab {} seq {} d_model {} heads {} layers {} ffn {} ln_eps {:g} "
                       "dropout {:g}",
                       r.task, r.tokenizer, m.vocab_size, m.max_seq_len, m.d_model, m.n_heads, m.n_layers, m.ffn_hidden,
                       m.ln_eps, m.dropout);
  };
  if (text(recorded) != text(rebuilt))
    fail(kOp, run_record_path(checkpoint), ": records ", text(recorded), ", but its flags give ", text(rebuilt),
         " (the file was edited or damaged)");
}

}  // namespace hg::cli

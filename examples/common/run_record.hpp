#pragma once
// The resolved configuration of a train run, stored beside its checkpoint as
// CHECKPOINT.json, so that a resumed run, `train --eval-only` and the
// programs that load the model (generate) rebuild the model, its data and
// its tokenizer from the checkpoint alone. JSON, written atomically
// (temporary file, fsync, rename), readable by any tool:
//
//   {"format": "handgrad-run", "version": 1,
//    "task": "data", "tokenizer": "bpe",
//    "model": {"vocab_size": 2048, "max_seq_len": 128, "d_model": 128, "n_heads": 4,
//              "n_layers": 4, "ffn_hidden": 0, "ln_eps": 1e-05, "dropout": 0.0},
//    "flags": {"d-model": 128, "data": "/tmp/pystdlib.txt", "steps": 1000, ...}}
#include <optional>
#include <set>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "models/decoder_lm.hpp"

namespace hg::cli {

struct RunRecord {
  nlohmann::json flags;   // every long flag name (without --) -> its resolved value
  std::string task;       // "synthetic" | "data" | "translate"
  std::string tokenizer;  // "bytes" | "bpe" (task data), "synthetic", "translate"
  DecoderLMConfig model;  // the shape fields: vocab_size, max_seq_len, d_model, n_heads, n_layers,
                          // ffn_hidden, ln_eps, dropout (the others keep their defaults)
};

std::string run_record_path(const std::string& checkpoint);  // checkpoint + ".json"
void save_run_record(const std::string& checkpoint, const RunRecord& r);
// Throws hg::Error naming the file when it is missing, not JSON, of another
// format or version, or lacks a key or holds a value out of range.
RunRecord load_run_record(const std::string& checkpoint);

// A resumed or evaluated run: the record beside `checkpoint` taken back into
// `app`'s flags (flag_json.hpp's take_recorded_flags: a flag given against it
// is a UsageError naming both values). None, with a warning, for a checkpoint
// written before records existed.
std::optional<RunRecord> take_run_record(CLI::App& app, const std::string& checkpoint,
                                         const std::set<std::string>& per_invocation,
                                         const std::set<std::string>& changeable);
// hg::Error naming the record when its task, tokenizer or model differ from
// `rebuilt` (what its flags gave): the file was edited or damaged.
void check_run_record(const RunRecord& recorded, const RunRecord& rebuilt, const std::string& checkpoint);

}  // namespace hg::cli

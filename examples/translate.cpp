// translate: translates lines from stdin with a model trained by
// `train --task translate --checkpoint CK`; one translation per input line.
//
//   echo "Open file" | translate --checkpoint ck            greedy decoding
//   translate --checkpoint ck --beam 5 < sources.txt         beam search
//
// Reads CK (the weights) and CK.vocab (the subword vocabulary and the model's
// shape, docs/translation.md). Exit codes as every program (examples/common/cli.hpp).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/kernel_mode.hpp"
#include "examples/common/cli.hpp"
#include "examples/translation/decoding.hpp"
#include "examples/translation/parallel_task.hpp"
#include "examples/translation/translation_checkpoint.hpp"
#include "models/decoder_lm.hpp"

using namespace hg;

namespace {

struct Options {
  std::string checkpoint, device = "auto";
  int beam = 1;
  bool unfused = false;
  cli::CommonFlags common;
};

int run(const Options& o) {
  if (!translation::SubwordTokenizer::available())
    throw cli::UsageError("translate: this build has no SentencePiece (apt-get install libsentencepiece-dev, then "
                          "reconfigure)");
  const Device dev = cli::resolve_device(o.device);
  set_kernel_mode(o.unfused ? KernelMode::Unfused : KernelMode::Fused);
  const translation::TranslationModelInfo info = translation::load_translation_info(o.checkpoint);
  const translation::SubwordTokenizer tokenizer = translation::SubwordTokenizer::from_bytes(info.tokenizer_bytes);
  DecoderLM model(info.config);
  model.load(o.checkpoint);
  model.to(dev);
  // stdout carries the translations only: the status line goes to stderr.
  if (!o.common.quiet)
    std::fprintf(stderr, "translate: %s (%lld parameters, %lld subword pieces), %s\n", o.checkpoint.c_str(),
                 static_cast<long long>(model.num_parameters()), static_cast<long long>(tokenizer.vocab_size()),
                 o.beam <= 1 ? "greedy" : ("beam " + std::to_string(o.beam)).c_str());
  std::vector<std::string> lines;
  for (std::string line; std::getline(std::cin, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  std::vector<size_t> truncated;
  const auto out = translation::translate_sentences(translation::model_scorer(model, dev), tokenizer, lines, o.beam,
                                                    info.config.max_seq_len, &truncated);
  for (size_t i : truncated)
    spdlog::warn("line {}: longer than the model's context of {} pieces; only its first {} pieces were translated",
                 i + 1, info.config.max_seq_len, info.config.max_seq_len / 2);
  for (const std::string& t : out) std::printf("%s\n", t.c_str());
  std::fflush(stdout);
  return cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"translate: translates stdin, line by line, with a train --task translate checkpoint", "translate"};
  app.add_option("--checkpoint", o.checkpoint, "the model (CK) written by train --task translate; CK.vocab next to it")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--beam", o.beam, "beam width (1: greedy)")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--device", o.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  auto* fused = app.add_flag("--fused", "fused kernels (default)");
  app.add_flag("--unfused", o.unfused, "kernels composed from primitive passes")->excludes(fused);
  cli::add_common_flags(app, o.common);
  return cli::run_program(app, o.common, argc, argv, [&] { return run(o); });
}

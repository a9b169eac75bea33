#pragma once
// The GEMMs of a training step, as gemm_lab runs them: every Linear form
// (forward, input gradient, weight gradient) with the epilogue the library
// uses (models/linear.cpp, models/feedforward.cpp, ops/classifier.cpp), each
// beside the plain GEMM of the same shape that it is measured against.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace gemm_lab {

// Backend::gemm's epilogues as cuda/gemm_lt.cu maps them onto cuBLASLt.
enum class Epi {
  None,        // CUBLASLT_EPILOGUE_DEFAULT
  Bias,        // BIAS: out = product + bias[n]
  BiasGelu,    // GELU_AUX_BIAS: aux = product + bias[n], out = gelu(aux)
  DGeluBGrad,  // DGELU_BGRAD: out = product * gelu'(aux), vec[n] = sum_m out
  DGelu,       // DGELU: the same without the bias gradient (a yardstick: its cost alone)
  BGradB,      // BGRADB (Backend's BiasGradA): vec[m] = sum_k op(a)[m, k]
};

inline const char* epi_name(Epi e) {
  switch (e) {
    case Epi::None: return "plain";
    case Epi::Bias: return "bias";
    case Epi::BiasGelu: return "gelu_aux_bias";
    case Epi::DGeluBGrad: return "dgelu_bgrad";
    case Epi::DGelu: return "dgelu";
    case Epi::BGradB: return "bgradb";
  }
  return "?";
}

enum class Pass { Forward, Dgrad, Wgrad };

inline const char* pass_name(Pass p) { return p == Pass::Forward ? "fwd" : p == Pass::Dgrad ? "dgrad" : "wgrad"; }

// One GEMM in Backend::gemm's row-major terms: out (M x N) = op(a) op(b).
struct Case {
  std::string model;  // e.g. "gpt2s B8"
  std::string layer;  // qkv, proj, fc1, fc2, head
  Pass pass;
  Epi epi;
  int64_t m, n, k;
  bool ta, tb;      // GemmArgs::transpose_a / transpose_b
  bool f32_out;     // weight gradient: fp32 dW, accumulated (beta 1)
  double per_step;  // calls per training step (0: the plain yardstick of an epilogue form)

  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
  bool accumulate() const { return f32_out; }
  // The geometry and epilogue: cases equal under it are measured once.
  std::string key() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + (ta ? "T" : "N") + (tb ? "T" : "N") +
           (f32_out ? "f" : "h") + epi_name(epi);
  }
};

// The epilogues one Linear runs in the fused bf16 step.
struct LinearEpis {
  Epi forward, dgrad, wgrad;
};

// A Linear (in -> out features) on `rows` rows, run `count` times a step:
// each pass with its epilogue, preceded by the plain GEMM of that shape when
// the pass has one (and DGELU_BGRAD by DGELU alone, which tells the fused
// bias gradient's cost from the GELU derivative's).
//   forward y = x W^T:          a = x (rows, in), b = W (out, in) transposed
//   dgrad   dx = dy W:          a = dy (rows, out), b = W (out, in)
//   wgrad   dW += dy^T x (f32): a = dy (rows, out) transposed, b = x (rows, in)
inline void add_linear(std::vector<Case>& cases, const std::string& model, const std::string& layer, int64_t rows,
                       int64_t in, int64_t out, LinearEpis epis, double count) {
  auto add = [&](Pass p, Epi e, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool f32) {
    if (e != Epi::None) cases.push_back({model, layer, p, Epi::None, m, n, k, ta, tb, f32, 0.0});
    if (e == Epi::DGeluBGrad) cases.push_back({model, layer, p, Epi::DGelu, m, n, k, ta, tb, f32, 0.0});
    cases.push_back({model, layer, p, e, m, n, k, ta, tb, f32, count});
  };
  add(Pass::Forward, epis.forward, rows, out, in, false, true, false);
  add(Pass::Dgrad, epis.dgrad, rows, in, out, false, false, false);
  add(Pass::Wgrad, epis.wgrad, out, in, rows, true, false, true);
}

// ops/classifier.cpp's default_classifier_chunk_rows for bf16 logits on CUDA:
// a 256 MiB chunk of logits, rounded down to a multiple of 128 rows.
inline int64_t classifier_chunk_rows(int64_t vocab) {
  int64_t rows = std::max<int64_t>(1, (int64_t(256) << 20) / (vocab * 2));
  if (rows >= 128) rows -= rows % 128;
  return rows;
}

struct Model {
  std::string name;
  int64_t d, hidden, layers, vocab, rows;
};

// One transformer layer's four Linears times `layers`, and the chunked head.
// fc1's weight gradient is plain: its bias gradient comes from fc2's
// DGELU_BGRAD (models/feedforward.cpp). The head's chunks are all timed at the
// full chunk size; a shorter last chunk counts as its fraction of one.
inline void add_model(std::vector<Case>& cases, const Model& md) {
  const double l = double(md.layers);
  const LinearEpis biased{Epi::Bias, Epi::None, Epi::BGradB};
  add_linear(cases, md.name, "qkv", md.rows, md.d, 3 * md.d, biased, l);
  add_linear(cases, md.name, "proj", md.rows, md.d, md.d, biased, l);
  add_linear(cases, md.name, "fc1", md.rows, md.d, md.hidden, {Epi::BiasGelu, Epi::None, Epi::None}, l);
  add_linear(cases, md.name, "fc2", md.rows, md.hidden, md.d, {Epi::Bias, Epi::DGeluBGrad, Epi::BGradB}, l);
  const int64_t chunk = std::min(md.rows, classifier_chunk_rows(md.vocab));
  add_linear(cases, md.name, "head", chunk, md.d, md.vocab, biased, double(md.rows) / double(chunk));
  // The head with its bias as one more column (ones beside h, the bias
  // beside W, padded to 8): the forward's K and the weight gradient's N grow
  // by 8 and no epilogue runs. Not in the step.
  cases.push_back({md.name, "head+1", Pass::Forward, Epi::None, chunk, md.vocab, md.d + 8, false, true, false, 0.0});
  cases.push_back({md.name, "head+1", Pass::Wgrad, Epi::None, md.vocab, md.d + 8, chunk, true, false, true, 0.0});
}

// GPT-2 small (d 768, 12 layers, vocab 50304 padded, T 1024) at B 8 and 32,
// and bench_train's model (d 512, 6 layers, vocab 256, B 32, T 256).
inline std::vector<Model> models(bool gpt2s, bool bench, bool quick) {
  std::vector<Model> out;
  if (gpt2s) {
    out.push_back({"gpt2s B8", 768, 3072, 12, 50304, 8 * 1024});
    if (!quick) out.push_back({"gpt2s B32", 768, 3072, 12, 50304, 32 * 1024});
  }
  if (bench) out.push_back({"bench", 512, 2048, 6, 256, 32 * 256});
  return out;
}

}  // namespace gemm_lab

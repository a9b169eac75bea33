#pragma once
// bench_train --floor: a lower bound for the fused training step of the
// configured DecoderLM, built from its parts measured alone. (a) Every GEMM
// of the step through Backend::gemm (cuBLASLt) with plain epilogues: each
// Linear's forward, dgrad and wgrad, and the head's three per classifier
// chunk. (b) Attention forward + backward at the step's shape, times the
// layers. (c) The bytes every other op must move (per op below), at the best
// device copy rate (bench/copy_rates.hpp). The parts are timed one by one
// (CUDA events, warm-up, median); their sum is what a step could take if
// every GEMM ran as alone, the attention as alone and every other op at copy
// speed. The GEMM list is checked against the model FLOPs count.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_model.hpp"

namespace hg::bench {

// What the floor needs to know about the step.
struct FloorShape {
  ModelSize size;
  int64_t ffn = 0;         // FFN hidden width
  int64_t chunk_rows = 0;  // classifier rows per chunk
  int64_t act_bytes = 2;   // bytes of an activation element (2: bf16, 4: fp32)
  int64_t rows() const { return size.batch * size.seq; }
};

// out (m, n) = op(a) (m, k) op(b) (k, n); wgrads accumulate into f32.
struct FloorGemm {
  std::string name;
  int64_t m, n, k;
  bool transpose_a, transpose_b, wgrad;
  int64_t per_step;
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(per_step); }
};

// Each Linear of a layer: forward x W^T, dgrad dy W, wgrad dy^T x; the head
// per chunk of rows: logits h W^T, dW += g^T h, dh = g W (one entry for the
// full chunks, one for a shorter last chunk).
inline std::vector<FloorGemm> floor_gemms(const FloorShape& f) {
  const int64_t N = f.rows(), d = f.size.d_model, L = f.size.layers, V = f.size.vocab;
  std::vector<FloorGemm> out;
  const auto linear = [&](const std::string& name, int64_t in, int64_t o, int64_t rows, int64_t count) {
    out.push_back({name + " forward", rows, o, in, false, true, false, count});
    out.push_back({name + " dgrad", rows, in, o, false, false, false, count});
    out.push_back({name + " wgrad", o, in, rows, true, false, true, count});
  };
  linear("qkv", d, 3 * d, N, L);
  linear("attn proj", d, d, N, L);
  linear("fc1", d, f.ffn, N, L);
  linear("fc2", f.ffn, d, N, L);
  const int64_t full = N / f.chunk_rows, last = N % f.chunk_rows;
  const auto head = [&](int64_t rows, int64_t count, const std::string& what) {
    if (count == 0) return;
    out.push_back({"head logits" + what, rows, V, d, false, true, false, count});
    out.push_back({"head dW" + what, V, d, rows, true, false, true, count});
    out.push_back({"head dh" + what, rows, d, V, false, false, false, count});
  };
  head(f.chunk_rows, full, "");
  head(last, last > 0 ? 1 : 0, " (last chunk)");
  return out;
}

// Parameters of the model, and those of them with bf16 compute copies
// (every Linear's weight and bias; embeddings and LayerNorms stay f32).
struct FloorParams {
  int64_t all, linear;
};

inline FloorParams floor_params(const FloorShape& f) {
  const int64_t d = f.size.d_model, F = f.ffn, L = f.size.layers, V = f.size.vocab, T = f.size.seq;
  const int64_t linear = L * ((3 * d * d + 3 * d) + (d * d + d) + (d * F + F) + (F * d + d)) + (V * d + V);
  const int64_t norms = (2 * L + 1) * 2 * d;
  return {linear + norms + V * d + T * d, linear};
}

// One memory-bound op kind of the step: the bytes it must move per step
// (each tensor read or written once), and how they were counted.
struct FloorBytes {
  std::string op;
  double bytes;
  std::string count;
};

inline std::vector<FloorBytes> floor_bytes(const FloorShape& f, bool bf16_copies) {
  const double N = double(f.rows()), d = double(f.size.d_model), F = double(f.ffn), L = double(f.size.layers);
  const double V = double(f.size.vocab), T = double(f.size.seq), E = double(f.act_bytes);
  const FloorParams p = floor_params(f);
  const double P = double(p.all), Pc = bf16_copies ? double(p.linear) : 0.0;
  const double stats = 8 * N;  // mean and rstd, f32 per row
  return {
      // Every residual add runs in a LayerNorm (docs/residual_layernorm.md, "In the model").
      {"layernorm fwd", 2 * N * d * E + stats, "ln1 of layer 0: read x, write y and row stats"},
      {"layernorm bwd", 3 * N * d * E + stats, "ln_f: read dy, x, stats; write dx"},
      {"residual+ln fwd", 2 * L * (4 * N * d * E + stats),
       "ln2 x L, ln1 of layers 1.. and ln_f: read x, r; write h = x + r, y, stats"},
      {"residual+ln bwd", 2 * L * (4 * N * d * E + stats), "ln2, ln1 x L: read dy of y, dy of h, h, stats; write dh"},
      {"gelu aux", L * 2 * N * F * E, "fc1 epilogue writes pre, fc2 dgrad epilogue reads it"},
      {"bias grads", L * N * (3 * d + d + F + d) * E, "column sums over dy of qkv, proj, fc1 (pre), fc2"},
      {"embedding", N * d * (4 + E) + 4 * T * d + N * d * E + 8 * N * d + 8 * T * d,
       "fwd: f32 rows of wte, wpe, write h; bwd: read dh, add into wte and wpe grads"},
      {"classifier rows", 2 * N * V * E, "read the logits once, write g over them"},
      {"head bias grad", N * V * E, "column sums of g"},
      {"optimizer", P * 36 + Pc * 2,
       "zero grads (4 B), clip norm reads grads (4), AdamW reads p, g, m, v, writes p, m, v (28); bf16 copies "
       "of Linear params (2)"},
  };
}

}  // namespace hg::bench

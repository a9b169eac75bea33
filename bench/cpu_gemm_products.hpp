#pragma once
// The Linear GEMMs of one bench_train --cpu-model step (qkv, proj, fc1, fc2),
// shared by bench_cpu_gemm and bench_cpu_gemm_tiles; bench/torch_cpu_gemm.py
// lists the same products for PyTorch.
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "core/matmul_shape.hpp"
#include "core/random.hpp"

namespace hg::bench {

struct CpuGemmProduct {
  std::string name;
  int64_t m, n, k;
  bool ta, tb;

  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  MatmulShape shape() const {
    MatmulShape s;
    s.m = m, s.n = n, s.k = k;
    return s;
  }
  void print_name() const {
    std::printf("%-10s %5lldx%5lldx%5lld", name.c_str(), (long long)m, (long long)n, (long long)k);
  }
};

struct CpuGemmStep {
  int64_t d_model, tokens;
  std::vector<CpuGemmProduct> products;
};

// Forward y = x W^T, input gradient dx = dy W, weight gradient dW = dy^T x of
// each Linear(in, out) over the step's tokens: "small" (d128, 512 tokens) or
// "medium" (d256, 2048 tokens).
inline CpuGemmStep cpu_gemm_step(const std::string& model) {
  CpuGemmStep s{model == "small" ? 128 : 256, model == "small" ? 512 : 2048, {}};
  const int64_t d = s.d_model, t = s.tokens;
  for (const auto& [layer, in, out] : {std::tuple<const char*, int64_t, int64_t>{"qkv", d, 3 * d},
                                       {"proj", d, d},
                                       {"fc1", d, 4 * d},
                                       {"fc2", 4 * d, d}}) {
    s.products.push_back({std::string(layer) + " fwd", t, out, in, false, true});
    s.products.push_back({std::string(layer) + " dx", t, in, out, false, false});
    s.products.push_back({std::string(layer) + " dW", out, in, t, true, false});
  }
  return s;
}

// op(A), op(B) of N(0, 1) values in their stored layouts, and room for C.
struct CpuGemmOperands {
  std::vector<float> a, b, c;
};
inline CpuGemmOperands random_operands(const CpuGemmProduct& p, Generator& g) {
  CpuGemmOperands o{std::vector<float>(static_cast<size_t>(p.m * p.k)),
                    std::vector<float>(static_cast<size_t>(p.k * p.n)),
                    std::vector<float>(static_cast<size_t>(p.m * p.n))};
  for (float& x : o.a) x = static_cast<float>(g.normal());
  for (float& x : o.b) x = static_cast<float>(g.normal());
  return o;
}

}  // namespace hg::bench

// Uses the installed library: a LayerNorm forward on the CPU, checked
// against its definition, and an hg::Error for a bad shape.
#include <cmath>
#include <cstdio>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/layernorm.hpp"

int main() {
  hg::Generator gen(0);
  const hg::Tensor x = hg::Tensor::randn({3, 8}, gen, hg::DType::F64);
  const hg::Tensor gamma = hg::Tensor::ones({8}, hg::DType::F64);
  const hg::Tensor beta = hg::Tensor::zeros({8}, hg::DType::F64);
  const std::vector<double> y = hg::layernorm_forward(x, gamma, beta, 1e-5, nullptr).to_vector();
  double worst = 0;
  for (int r = 0; r < 3; ++r) {  // each row of y: mean 0, variance var / (var + eps) ~ 1
    double mean = 0, sq = 0;
    for (int c = 0; c < 8; ++c) mean += y[r * 8 + c] / 8;
    for (int c = 0; c < 8; ++c) sq += (y[r * 8 + c] - mean) * (y[r * 8 + c] - mean) / 8;
    worst = std::fmax(worst, std::fmax(std::fabs(mean), std::fabs(sq - 1)));
  }
  bool threw = false;
  try {
    hg::layernorm_forward(x, hg::Tensor::ones({5}, hg::DType::F64), beta, 1e-5, nullptr);
  } catch (const hg::Error& e) {
    threw = true;
  }
  std::printf("consumer: layernorm rows mean/var error %.2e, bad shape %s\n", worst, threw ? "refused" : "ACCEPTED");
  return worst < 1e-3 && threw ? 0 : 1;
}

// LayerNorm backwards that add dgamma / dbeta into given gradients
// (layernorm_backward_accumulate, residual_layernorm_backward_accumulate, and
// the CUDA kernels' gpu::ParamGradWrite::Accumulate) against the composition
// they replace: the backward into temporaries, then grad + dgamma
// elementwise. Bitwise, from zero and from nonzero random gradients (large
// enough that the add rounds), on every path: the CPU and unfused
// compositions, and on CUDA every backward configuration family the
// dispatcher can take for f32 and bf16 rows: each width class's table entries
// and fallbacks, the scalar rows (D not a multiple of 16 bytes), the cluster
// rows (16384 < D <= 8 x 16384), the chunked rows past them, and the
// residual backward's resident and one-block-per-row kernels, with and
// without dh_in. The DecoderLM case checks a whole training step's
// LayerNorm gradients.
#include <functional>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/kernel_mode.hpp"
#include "models/decoder_lm.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/layernorm.hpp"
#include "ops/residual_layernorm.hpp"
#include "tests/test_util.hpp"
#ifdef HG_WITH_CUDA
#include "cuda/layernorm_kernels.hpp"
#include "cuda/residual_layernorm_kernels.hpp"
#endif

using namespace hg;
using hg::test::contains;
using hg::test::same_bytes;
using hg::test::thrown_message;

namespace {

constexpr double kEps = 1e-5;

// The composition the accumulating backwards replace: grad + d, elementwise
// on grad's device, into a copy of grad.
Tensor added(const Tensor& grad, const Tensor& d) {
  Tensor out = grad.clone();
  backend_for(out.device()).zip(BinaryOp::Add, out, d, out);
  return out;
}

// Gradients to start from: zeros, or random values of magnitude ~30 (so
// grad + dgamma rounds, and a kernel that dropped either term would show).
Tensor start_grad(int64_t D, bool zero, uint64_t seed, DType dtype, Device device) {
  if (zero) return Tensor::zeros({D}, dtype, device);
  Generator gen(seed);
  return Tensor::randn({D}, gen, dtype, device, 0.0, 30.0);
}

// One LayerNorm's inputs and saved statistics: x (rows, D) in `dtype`,
// gamma (D,) in its math dtype, dy and dh_in like x.
struct Case {
  Tensor x, gamma, beta, dy, dh_in;
  LayerNormSaved saved;
};

Case make_case(const Shape& shape, DType dtype, Device device, uint64_t seed) {
  Generator gen(seed);
  const DType math = dtype == DType::F64 ? DType::F64 : DType::F32;
  const int64_t D = shape.back();
  Case c;
  c.x = Tensor::randn(shape, gen, math, device, 0.5, 2.0).to(dtype);
  c.gamma = Tensor::randn({D}, gen, math, device, 1.0, 0.5);
  c.beta = Tensor::randn({D}, gen, math, device);
  c.dy = Tensor::randn(shape, gen, math, device).to(dtype);
  c.dh_in = Tensor::randn(shape, gen, math, device).to(dtype);
  layernorm_forward(c.x, c.gamma, c.beta, kEps, &c.saved);
  return c;
}

// The op level, one path (device, dtype and the current kernel mode):
// layernorm_backward_accumulate against layernorm_backward + the adds, and
// the residual pair the same way, dh_in given and not.
void check_ops(const Shape& shape, DType dtype, Device device) {
  const int64_t D = shape.back();
  const Case c = make_case(shape, dtype, device, 7 + D);
  for (const bool zero : {true, false}) {
    INFO((zero ? "zero" : "random") << " starting grads");
    const Tensor g0 = start_grad(D, zero, 11, c.gamma.dtype(), device);
    const Tensor b0 = start_grad(D, zero, 12, c.gamma.dtype(), device);

    const LayerNormGrads want = layernorm_backward(c.dy, c.x, c.gamma, c.saved);
    const LayerNormParamGrads into{g0.clone(), b0.clone()};
    const Tensor dx = layernorm_backward_accumulate(c.dy, c.x, c.gamma, c.saved, into);
    CHECK(same_bytes(dx, want.dx));
    CHECK(same_bytes(into.gamma, added(g0, want.dgamma)));
    CHECK(same_bytes(into.beta, added(b0, want.dbeta)));

    for (const bool with_dh_in : {false, true}) {
      INFO("residual, dh_in " << (with_dh_in ? "given" : "none"));
      const Tensor dh_in = with_dh_in ? c.dh_in : Tensor();
      const LayerNormGrads rwant = residual_layernorm_backward(c.dy, dh_in, c.x, c.gamma, c.saved);
      const LayerNormParamGrads rinto{g0.clone(), b0.clone()};
      const Tensor dh = residual_layernorm_backward_accumulate(c.dy, dh_in, c.x, c.gamma, c.saved, rinto);
      CHECK(same_bytes(dh, rwant.dx));
      CHECK(same_bytes(rinto.gamma, added(g0, rwant.dgamma)));
      CHECK(same_bytes(rinto.beta, added(b0, rwant.dbeta)));
    }
  }
}

// A small DecoderLM's training step: the LayerNorm gradients a backward
// leaves when they start from random values are bitwise those values plus
// the gradients a backward from zero leaves (the separate elementwise add the
// model made before). Both steps are bitwise repeatable (test_determinism).
void check_model_step(Device device, DType dtype, Precision precision) {
  DecoderLMConfig cfg;
  cfg.vocab_size = 13;
  cfg.max_seq_len = 8;
  cfg.d_model = 64;  // heads of 16: the bf16 attention kernels' widths
  cfg.n_heads = 4;
  cfg.n_layers = 2;
  cfg.seed = 5;
  cfg.dtype = dtype;
  cfg.precision = precision;
  Generator gen(3);
  Tensor ids = Tensor::empty({2, 7}, DType::F32), targets = Tensor::empty({2, 7}, DType::F32);
  for (Tensor* t : {&ids, &targets})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->data<float>()[i] = static_cast<float>(static_cast<int64_t>(gen.uniform() * 13) % 13);
  ids = ids.to(device), targets = targets.to(device);
  const auto step = [&](DecoderLM& model) {
    CrossEntropySaved saved;
    cross_entropy_forward(model.forward(ids), targets, -100, &saved);
    model.backward(cross_entropy_backward(saved));
  };
  const auto is_layernorm = [](const std::string& name) {
    const auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    return ends(".gamma") || ends(".beta");
  };

  DecoderLM from_zero(cfg), from_random(cfg);
  from_zero.to(device), from_random.to(device);
  from_zero.zero_grad(), from_random.zero_grad();
  std::vector<Tensor> starts;
  uint64_t seed = 40;
  for (auto& [name, p] : from_random.named_parameters())
    if (is_layernorm(name)) {
      starts.push_back(start_grad(p->grad.numel(), false, ++seed, p->grad.dtype(), device));
      p->grad.copy_(starts.back());
    }
  REQUIRE(starts.size() == size_t(2 * (2 * cfg.n_layers + 1)));  // ln1, ln2 per layer and ln_f; gamma and beta
  step(from_zero);
  step(from_random);

  const auto zero_params = from_zero.named_parameters();
  const auto random_params = from_random.named_parameters();
  REQUIRE(zero_params.size() == random_params.size());
  size_t k = 0;
  for (size_t i = 0; i < zero_params.size(); ++i) {
    if (!is_layernorm(zero_params[i].first)) continue;
    INFO(zero_params[i].first);
    CHECK(same_bytes(random_params[i].second->grad, added(starts[k++], zero_params[i].second->grad)));
  }
}

}  // namespace

TEST_CASE("layernorm accumulating backwards: CPU paths are bitwise the backward plus the adds",
          "[layernorm][accumulate]") {
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    for (DType dtype : {DType::F32, DType::F64})
      for (const Shape& shape : {Shape{1, 1}, Shape{2, 3}, Shape{2, 3, 100}, Shape{5, 1025}}) {
        INFO(kernel_mode_name(mode) << " " << dtype_name(dtype) << " x " << shape_str(shape));
        check_ops(shape, dtype, Device::CPU);
      }
  }
}

TEST_CASE("layernorm accumulating backwards: a DecoderLM step's LayerNorm grads, CPU", "[layernorm][accumulate]") {
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    for (DType dtype : {DType::F32, DType::F64}) {
      INFO(kernel_mode_name(mode) << " " << dtype_name(dtype));
      check_model_step(Device::CPU, dtype, Precision::FP32);
    }
  }
}

TEST_CASE("layernorm accumulating backwards check the gradients they add into", "[layernorm][accumulate][errors]") {
  const Case c = make_case({3, 5}, DType::F32, Device::CPU, 1);
  const Tensor good = Tensor::zeros({5});
  const auto plain = [&](const LayerNormParamGrads& into) {
    return thrown_message([&] { layernorm_backward_accumulate(c.dy, c.x, c.gamma, c.saved, into); });
  };
  const auto residual = [&](const LayerNormParamGrads& into) {
    return thrown_message([&] { residual_layernorm_backward_accumulate(c.dy, c.dh_in, c.x, c.gamma, c.saved, into); });
  };
  for (const auto& run : {std::function<std::string(const LayerNormParamGrads&)>(plain),
                          std::function<std::string(const LayerNormParamGrads&)>(residual)}) {
    const std::string shape = run({Tensor::zeros({4}), good});
    CHECK(contains(shape, "layernorm_backward_accumulate"));
    CHECK(contains(shape, "gamma grad is Tensor(4)"));
    CHECK(contains(shape, "(5)"));
    CHECK(contains(run({good, Tensor::zeros({5}, DType::F64)}), "beta grad"));
    CHECK(contains(run({Tensor(), good}), "gamma grad is undefined"));
  }
  // Nothing is added on a refusal.
  const Tensor g = Tensor::full({5}, 2.0);
  CHECK(!plain({g, Tensor::zeros({6})}).empty());
  CHECK(same_bytes(g, Tensor::full({5}, 2.0)));
}

#ifdef HG_WITH_CUDA

namespace {

// 16-byte rows of D <= 16384 run the table configuration asked for: every
// one compiled for (backward, dtype, D). Other rows run the one path their
// width and alignment take, whichever configuration is asked.
std::vector<gpu::LnKernel> backward_configurations(DType dtype, int64_t D) {
  std::vector<gpu::LnKernel> all = gpu::ln_compiled_kernels(gpu::LnPass::Backward, dtype, D);
  const bool aligned = D * static_cast<int64_t>(dtype_size(dtype)) % 16 == 0;
  if (!aligned || D > gpu::kLnResidentMaxD) all.resize(1);
  return all;
}

// The kernels called directly on (rows, D): each configuration's
// Accumulate against its Overwrite plus the add, dx unchanged; the residual
// kernels (both families, dh_in given and not) the same way.
void check_kernels(int64_t rows, int64_t D, DType dtype) {
  const Case c = make_case({rows, D}, dtype, Device::CUDA, 100 + D + rows);
  for (const bool zero : {true, false}) {
    INFO((zero ? "zero" : "random") << " starting grads");
    const Tensor g0 = start_grad(D, zero, 21 + D, DType::F32, Device::CUDA);
    const Tensor b0 = start_grad(D, zero, 22 + D, DType::F32, Device::CUDA);
    const auto fresh = [&] { return Tensor::empty({rows, D}, dtype, Device::CUDA); };
    const auto vec = [&] { return Tensor::empty({D}, DType::F32, Device::CUDA); };

    for (const gpu::LnKernel& k : backward_configurations(dtype, D)) {
      INFO("configuration " << gpu::ln_kernel_name(k));
      Tensor dx_want = fresh(), dg = vec(), db = vec();
      gpu::layernorm_backward_fused(c.dy, c.x, c.gamma, c.saved.mean, c.saved.rstd, dx_want, dg, db, k);
      Tensor dx = fresh(), g = g0.clone(), b = b0.clone();
      gpu::layernorm_backward_fused(c.dy, c.x, c.gamma, c.saved.mean, c.saved.rstd, dx, g, b, k,
                                    gpu::ParamGradWrite::Accumulate);
      CHECK(same_bytes(g, added(g0, dg)));
      CHECK(same_bytes(b, added(b0, db)));
      CHECK(same_bytes(dx, dx_want));
    }

    for (const auto family : {gpu::ResidualLnKernel::ResidentRows, gpu::ResidualLnKernel::OneBlockPerRow})
      for (const bool with_dh_in : {false, true}) {
        INFO("residual " << (family == gpu::ResidualLnKernel::ResidentRows ? "resident rows" : "one block per row")
                         << ", dh_in " << (with_dh_in ? "given" : "none"));
        const Tensor* dh_in = with_dh_in ? &c.dh_in : nullptr;
        Tensor dh_want = fresh(), dg = vec(), db = vec();
        gpu::residual_layernorm_backward_fused(c.dy, dh_in, c.x, c.gamma, c.saved.mean, c.saved.rstd, dh_want, dg, db,
                                               family);
        Tensor dh = fresh(), g = g0.clone(), b = b0.clone();
        gpu::residual_layernorm_backward_fused(c.dy, dh_in, c.x, c.gamma, c.saved.mean, c.saved.rstd, dh, g, b, family,
                                               gpu::ParamGradWrite::Accumulate);
        CHECK(same_bytes(g, added(g0, dg)));
        CHECK(same_bytes(b, added(b0, db)));
        CHECK(same_bytes(dh, dh_want));
      }
  }
}

}  // namespace

TEST_CASE("layernorm CUDA kernels accumulate dgamma / dbeta bitwise as the backward plus the adds",
          "[layernorm][accumulate][cuda]") {
  HG_REQUIRE_GPU();
  KernelModeScope fused(KernelMode::Fused);
  // Every width class (<= 256, 512, 1024, 2048, 3072, 4096, 8192, 16384),
  // 16-byte rows and not (D = 1, 3, 100 in bf16, 1025), the cluster rows
  // (16392, 40000, 40001) and the chunked rows (140000 > 8 x 16384).
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t D : {1, 3, 100, 256, 512, 768, 1025, 2048, 3072, 4104, 8192, 16384, 16392, 40000, 40001, 140000})
      for (int64_t rows : {1, 2, 300}) {
        if (D > 16384 && rows > 40) rows = 40;  // a few clusters' and chunks' worth: enough partial rows
        INFO(dtype_name(dtype) << " rows " << rows << " D " << D);
        check_kernels(rows, D, dtype);
      }
}

#endif

TEST_CASE("layernorm accumulating backwards: CUDA ops are bitwise the backward plus the adds",
          "[layernorm][accumulate][cuda]") {
  HG_REQUIRE_GPU();
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    for (DType dtype : {DType::F32, DType::BF16})
      for (const Shape& shape : {Shape{1, 1}, Shape{2, 3}, Shape{2, 3, 100}, Shape{5, 1025}, Shape{64, 768}}) {
        INFO(kernel_mode_name(mode) << " " << dtype_name(dtype) << " x " << shape_str(shape));
        check_ops(shape, dtype, Device::CUDA);
      }
  }
}

TEST_CASE("layernorm accumulating backwards: a DecoderLM step's LayerNorm grads, CUDA (f32, bf16)",
          "[layernorm][accumulate][cuda]") {
  HG_REQUIRE_GPU();
  for (KernelMode mode : {KernelMode::Fused, KernelMode::Unfused}) {
    KernelModeScope scope(mode);
    INFO(kernel_mode_name(mode));
    check_model_step(Device::CUDA, DType::F32, Precision::FP32);
    if (mode == KernelMode::Fused) check_model_step(Device::CUDA, DType::F32, Precision::BF16);
  }
}

// Backend::adamw_multi (one AdamW step over many tensors, with global-norm
// clipping computed on the device) against a per-tensor reference written
// here, and hg::AdamW built on it: many tensors of odd sizes (1, 3, 1000,
// chunk boundaries 8191 / 8192 / 8193), several steps, clipping on and off,
// non-finite gradients, BF16 compute copies, lr changes, validation.
//
// Bounds: the CPU runs the reference's arithmetic (double for f64
// parameters, float for f32) in the same order, so everything is compared
// bit for bit. On CUDA the update of each element
// is the per-tensor kernel's float arithmetic (gpu::adamw_step), so without
// clipping it must match that kernel bit for bit; with clipping the grads are
// multiplied by the float scale max_norm / norm first, checked against the
// per-tensor kernel fed with grads pre-scaled by the same float (bit for bit).
// The device norm is a double sum in a fixed order: within 1e-12 relative of
// the CPU double sum, and bitwise the same run to run.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/optim.hpp"
#include "tests/test_util.hpp"

#ifdef HG_WITH_CUDA
#include "cuda/optim_kernels.hpp"
#endif

using namespace hg;

namespace {

const std::vector<int64_t> kSizes = {1, 3, 1000, 8191, 8192, 8193, 17, 2 * 8192 + 5};

struct Group {
  std::vector<Tensor> p, g, m, v, copies;
  AdamWGroup view() const { return {p, g, m, v, copies}; }
};

// offset > 0: every tensor is a view starting `offset` elements into a larger
// buffer (the same values), so no tensor is 16-byte aligned.
Group make_group(DType dtype, Device device, uint64_t seed, bool with_copies, int64_t offset = 0) {
  Generator gen(seed);
  Group grp;
  const auto placed = [&](const Tensor& t) {
    if (offset == 0) return t;
    const int64_t n = t.numel();
    Tensor view = Tensor::zeros({n + offset}, t.dtype(), device).slice(offset, n + offset);
    view.copy_(t);
    return view;
  };
  for (int64_t n : kSizes) {
    grp.p.push_back(placed(Tensor::randn({n}, gen, dtype, device)));
    grp.g.push_back(placed(Tensor::randn({n}, gen, dtype, device, 0.0, 0.5)));
    grp.m.push_back(placed(Tensor::zeros({n}, dtype, device)));
    grp.v.push_back(placed(Tensor::zeros({n}, dtype, device)));
    grp.copies.push_back(with_copies && n != 3 ? placed(Tensor::zeros({n}, DType::BF16, device)) : Tensor());
  }
  return grp;
}

Tensor make_state(Device device, double lr) {
  Tensor s = Tensor::zeros({kAdamWStateSize}, DType::F64);
  s.data<double>()[kAdamWLr] = lr;
  return s.to(device);
}

// The per-tensor AdamW of hg::AdamW before the multi-tensor kernel (double math), on one
// CPU tensor, grads multiplied by `scale`: the CPU's arithmetic for f64
// parameters.
void reference_step_f64(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWConfig& o, double lr, double t,
                        double scale) {
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  double *ps = p.data<double>(), *ms = m.data<double>(), *vs = v.data<double>();
  const double* gs = g.data<double>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    double param = ps[i] * (1.0 - lr * o.weight_decay);
    const double grad = gs[i] * scale;
    const double m1 = o.beta1 * ms[i] + (1.0 - o.beta1) * grad;
    const double v1 = o.beta2 * vs[i] + (1.0 - o.beta2) * grad * grad;
    ms[i] = m1;
    vs[i] = v1;
    param -= lr * (m1 / bc1) / (std::sqrt(v1 / bc2) + o.eps);
    ps[i] = param;
  }
}

// The CPU's arithmetic for f32 parameters (core/optimizer_ops.cpp): float,
// PyTorch's form, step size lr / bc1 and 1 / sqrt(bc2) rounded from double.
void reference_step_f32(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWConfig& o, double lr, double t,
                        double scale) {
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  const float decay = static_cast<float>(1.0 - lr * o.weight_decay), b1 = static_cast<float>(o.beta1),
              b2 = static_cast<float>(o.beta2), c1 = static_cast<float>(1.0 - o.beta1),
              c2 = static_cast<float>(1.0 - o.beta2), eps = static_cast<float>(o.eps),
              step = static_cast<float>(lr / bc1), inv = static_cast<float>(1.0 / std::sqrt(bc2)),
              fscale = static_cast<float>(scale);
  float *ps = p.data<float>(), *ms = m.data<float>(), *vs = v.data<float>();
  const float* gs = g.data<float>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const float grad = gs[i] * fscale;
    const float m1 = b1 * ms[i] + c1 * grad;
    const float v1 = b2 * vs[i] + c2 * (grad * grad);
    ms[i] = m1;
    vs[i] = v1;
    ps[i] = ps[i] * decay - step * m1 / (std::sqrt(v1) * inv + eps);
  }
}

template <class T>
void reference_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWConfig& o, double lr, double t,
                    double scale) {
  if constexpr (std::is_same_v<T, float>) reference_step_f32(p, g, m, v, o, lr, t, scale);
  else reference_step_f64(p, g, m, v, o, lr, t, scale);
}

// The CPU backend's order (core/optimizer_ops.cpp): each tensor in pieces of
// 16384 elements; a piece summed in 8 interleaved double lanes (element i
// into lane i % 8, the tail past the last full 8 into lane 0), lanes added
// in order; the pieces' sums added in tensor and piece order.
double norm_of(const std::vector<Tensor>& gs) {
  constexpr size_t kPiece = 16384;
  double total = 0;
  for (const Tensor& g : gs) {
    const std::vector<double> x = g.to_vector();
    for (size_t b = 0; b < x.size(); b += kPiece) {
      const size_t n = std::min(x.size() - b, kPiece), full = n / 8 * 8;
      double lane[8] = {};
      for (size_t i = 0; i < n; ++i) lane[i < full ? i % 8 : 0] += x[b + i] * x[b + i];
      double piece = 0;
      for (double l : lane) piece += l;
      total += piece;
    }
  }
  return std::sqrt(total);
}

AdamWConfig config_with(double max_norm) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.max_grad_norm = max_norm;
  return c;
}

template <class T>
void check_cpu_against_reference(DType dtype, double max_norm) {
  Group multi = make_group(dtype, Device::CPU, 42, true), ref = make_group(dtype, Device::CPU, 42, false);
  const AdamWConfig cfg = config_with(max_norm);
  Tensor state = make_state(Device::CPU, 3e-3);
  for (int step = 1; step <= 3; ++step) {
    const double norm = norm_of(ref.g);
    const double scale = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
    for (size_t i = 0; i < kSizes.size(); ++i)
      reference_step<T>(ref.p[i], ref.g[i], ref.m[i], ref.v[i], cfg, 3e-3, step, scale);
    cpu_backend().adamw_multi(multi.view(), cfg, state);
    CHECK(state.data<double>()[kAdamWStep] == step);
    CHECK(state.data<double>()[kAdamWGradNorm] == norm);
    CHECK(state.data<double>()[kAdamWClipScale] == scale);
    CHECK(state.data<double>()[kAdamWSkipped] == 0);
  }
  for (size_t i = 0; i < kSizes.size(); ++i) {
    INFO("tensor " << i << " of " << kSizes[i] << " elements");
    CHECK(hg::test::same_bytes(multi.p[i], ref.p[i]));
    CHECK(hg::test::same_bytes(multi.m[i], ref.m[i]));
    CHECK(hg::test::same_bytes(multi.v[i], ref.v[i]));
    if (multi.copies[i].defined()) CHECK(hg::test::same_bytes(multi.copies[i], multi.p[i].to(DType::BF16)));
  }
}

}  // namespace

TEST_CASE("adamw_multi on the CPU is the per-tensor AdamW bit for bit, with and without clipping", "[optim]") {
  check_cpu_against_reference<float>(DType::F32, 0.0);
  check_cpu_against_reference<double>(DType::F64, 0.0);
  check_cpu_against_reference<float>(DType::F32, 1.0);   // the grads' norm is ~ 0.5 sqrt(35000) ~ 90: clipped
  check_cpu_against_reference<double>(DType::F64, 1e6);  // above the norm: scale 1
}

TEST_CASE("adamw_multi skips every update when the norm is not finite", "[optim]") {
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Group grp = make_group(DType::F32, Device::CPU, 3, false);
    const Group before = make_group(DType::F32, Device::CPU, 3, false);
    grp.g[4].set({100}, bad);
    Tensor state = make_state(Device::CPU, 1e-3);
    cpu_backend().adamw_multi(grp.view(), config_with(1.0), state);
    CHECK(state.data<double>()[kAdamWSkipped] == 1);
    CHECK_FALSE(std::isfinite(state.data<double>()[kAdamWGradNorm]));
    for (size_t i = 0; i < kSizes.size(); ++i) {
      CHECK(hg::test::same_bytes(grp.p[i], before.p[i]));
      CHECK(hg::test::same_bytes(grp.m[i], before.m[i]));
    }
  }
}

TEST_CASE("adamw_multi and sum_of_squares reject bad groups with clear messages", "[optim]") {
  Group grp = make_group(DType::F32, Device::CPU, 5, false);
  Tensor state = make_state(Device::CPU, 1e-3);
  AdamWGroup g = grp.view();
  g.m.pop_back();
  CHECK_THROWS_AS(cpu_backend().adamw_multi(g, config_with(0), state), Error);
  g = grp.view();
  g.v[2] = Tensor::zeros({7});
  CHECK_THROWS_AS(cpu_backend().adamw_multi(g, config_with(0), state), Error);
  g = grp.view();
  g.compute_copies[1] = Tensor::zeros({kSizes[1]}, DType::F32);
  CHECK_THROWS_AS(cpu_backend().adamw_multi(g, config_with(0), state), Error);
  Tensor bad_state = Tensor::zeros({3}, DType::F64);
  CHECK_THROWS_AS(cpu_backend().adamw_multi(grp.view(), config_with(0), bad_state), Error);
  CHECK_THROWS_AS(cpu_backend().adamw_multi(grp.view(), config_with(-1), state), Error);
  Tensor out_f32 = Tensor::zeros({1});
  CHECK_THROWS_AS(cpu_backend().sum_of_squares(grp.g, out_f32), Error);
  Tensor out = Tensor::zeros({1}, DType::F64);
  cpu_backend().sum_of_squares(grp.g, out);
  CHECK(std::abs(std::sqrt(out.item()) - norm_of(grp.g)) <= 1e-12 * norm_of(grp.g));
}

TEST_CASE("AdamW with max_grad_norm clips inside step and reports the norm", "[optim]") {
  Generator gen(8);
  Parameter a{Tensor::randn({5, 7}, gen), Tensor::randn({5, 7}, gen)};
  Parameter b{Tensor::randn({13}, gen), Tensor::randn({13}, gen)};
  Parameter a2{a.value.clone(), a.grad.clone()}, b2{b.value.clone(), b.grad.clone()};
  AdamWOptions o;
  o.lr = 1e-2;
  o.max_grad_norm = 0.5;
  AdamW fused({&a, &b}, o);
  fused.step();
  const double norm = fused.last_grad_norm();
  CHECK(std::abs(norm - norm_of({a.grad, b.grad})) <= 1e-12 * norm);
  CHECK_FALSE(fused.last_step_skipped());
  // Both from one read, the same values.
  const Optimizer::StepReport report = fused.last_step_report();
  CHECK(report.grad_norm == norm);
  CHECK_FALSE(report.skipped);
  // The same step by clip_grad_norm + an unclipped AdamW: same norm, same scale.
  AdamWOptions plain = o;
  plain.max_grad_norm = 0;
  AdamW separate({&a2, &b2}, plain);
  CHECK(clip_grad_norm({&a2, &b2}, 0.5) == norm);
  separate.step();
  // clip_grad_norm rounds g * scale to float before AdamW: within float rounding.
  CHECK(hg::test::max_abs_diff(a.value, a2.value) <= 1e-6);
  CHECK(hg::test::max_abs_diff(b.value, b2.value) <= 1e-6);
  // lr changes reach the device state.
  fused.set_lr(0.0);
  o.weight_decay = 0;
  const Tensor before = a.value.clone();
  fused.step();
  CHECK(hg::test::same_bytes(before, a.value));
  // A NaN gradient: the report says skipped with a NaN norm, as the two reads do.
  fused.set_lr(1e-2);
  b.grad.set({3}, std::numeric_limits<double>::quiet_NaN());
  const Tensor held = b.value.clone();
  fused.step();
  const Optimizer::StepReport skipped = fused.last_step_report();
  CHECK(skipped.skipped);
  CHECK(std::isnan(skipped.grad_norm));
  CHECK(fused.last_step_skipped());
  CHECK(std::isnan(fused.last_grad_norm()));
  CHECK(hg::test::same_bytes(held, b.value));
}

TEST_CASE("CUDA adamw_multi matches the per-tensor kernel bit for bit and is deterministic", "[optim][cuda]") {
  HG_REQUIRE_GPU();
#ifdef HG_WITH_CUDA
  // Offset 0 takes the kernels' 16-byte accesses, offset 1 their element-wise loops.
  for (const int64_t offset : {0, 1})
    for (const double max_norm : {0.0, 1.0}) {
      INFO("max_grad_norm " << max_norm << ", tensors " << offset << " elements into their buffers");
      Group multi = make_group(DType::F32, Device::CUDA, 77, true, offset),
            ref = make_group(DType::F32, Device::CUDA, 77, false);
      const AdamWConfig cfg = config_with(max_norm);
      Tensor state = make_state(Device::CUDA, 3e-3);
      for (int step = 1; step <= 3; ++step) {
        const double norm = norm_of(ref.g);
        const float scale = max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / norm) : 1.0f;
        for (size_t i = 0; i < kSizes.size(); ++i) {
          Tensor g = ref.g[i].clone();
          if (scale != 1.0f)
            cuda_backend().zip(BinaryOp::Mul, g, Tensor::full({1}, scale, DType::F32, Device::CUDA), g);
          gpu::adamw_step(ref.p[i].data<float>(), g.data<float>(), ref.m[i].data<float>(), ref.v[i].data<float>(),
                          kSizes[i], 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, static_cast<float>(1 - std::pow(0.9, step)),
                          static_cast<float>(1 - std::pow(0.95, step)));
        }
        cuda_backend().adamw_multi(multi.view(), cfg, state);
        const Tensor s = state.to(Device::CPU);
        CHECK(std::abs(s.data<double>()[kAdamWGradNorm] - norm) <= 1e-12 * norm);
        CHECK(static_cast<float>(s.data<double>()[kAdamWClipScale]) == scale);
      }
      for (size_t i = 0; i < kSizes.size(); ++i) {
        INFO("tensor " << i << " of " << kSizes[i] << " elements");
        CHECK(hg::test::same_bytes(multi.p[i], ref.p[i]));
        CHECK(hg::test::same_bytes(multi.m[i], ref.m[i]));
        CHECK(hg::test::same_bytes(multi.v[i], ref.v[i]));
        if (multi.copies[i].defined()) CHECK(hg::test::same_bytes(multi.copies[i], multi.p[i].to(DType::BF16)));
      }
    }
  // sum_of_squares: deterministic, and the double sum of the CPU within 1e-12.
  for (const int64_t offset : {0, 1}) {
    INFO("tensors " << offset << " elements into their buffers");
    Group grp = make_group(DType::F32, Device::CUDA, 9, false, offset);
    Tensor first = Tensor::zeros({1}, DType::F64, Device::CUDA), second = first.clone();
    cuda_backend().sum_of_squares(grp.g, first);
    cuda_backend().sum_of_squares(grp.g, second);
    CHECK(hg::test::same_bytes(first, second));
    const double want = std::pow(norm_of(grp.g), 2);
    CHECK(std::abs(first.item() - want) <= 1e-12 * want);
  }
  // A NaN gradient: nothing changes, the flag says so.
  Group nan_grp = make_group(DType::F32, Device::CUDA, 10, false);
  const Group before = make_group(DType::F32, Device::CUDA, 10, false);
  nan_grp.g[5].set({8192}, std::numeric_limits<double>::quiet_NaN());
  Tensor state = make_state(Device::CUDA, 1e-3);
  cuda_backend().adamw_multi(nan_grp.view(), config_with(1.0), state);
  CHECK(state.to(Device::CPU).data<double>()[kAdamWSkipped] == 1);
  for (size_t i = 0; i < kSizes.size(); ++i) CHECK(hg::test::same_bytes(nan_grp.p[i], before.p[i]));
#endif
}

// Optimizers against scalar arithmetic written out by hand, plus gradient clipping.
#include <cmath>

#include "core/optim.hpp"
#include "tests/test_util.hpp"

using hg::DType;
using hg::Device;
using hg::Parameter;
using hg::Tensor;

namespace {

Parameter make_param(const std::vector<double>& value, const std::vector<double>& grad, DType dtype = DType::F64) {
  const hg::Shape shape{static_cast<int64_t>(value.size())};
  return Parameter{Tensor::from_vector(value, shape, dtype), Tensor::from_vector(grad, shape, dtype)};
}

void set_grad(Parameter& p, const std::vector<double>& grad) {
  p.grad.copy_(Tensor::from_vector(grad, p.grad.shape(), DType::F64));
}

}  // namespace

TEST_CASE("SGD without momentum: p -= lr * g") {
  Parameter p = make_param({1.0, -2.0}, {0.5, 1.0});
  hg::SGD sgd({&p}, {/*lr=*/0.1, /*momentum=*/0.0, /*weight_decay=*/0.0});
  sgd.step();
  REQUIRE(std::abs(p.value.at({0}) - 0.95) < 1e-12);
  REQUIRE(std::abs(p.value.at({1}) - -2.1) < 1e-12);
  sgd.step();  // same grads again
  REQUIRE(std::abs(p.value.at({0}) - 0.90) < 1e-12);
  REQUIRE(std::abs(p.value.at({1}) - -2.2) < 1e-12);
  REQUIRE(sgd.steps() == 2);

  sgd.set_lr(1.0);  // set_lr takes effect on the next step
  sgd.step();
  REQUIRE(std::abs(p.value.at({0}) - 0.40) < 1e-12);
}

TEST_CASE("SGD with momentum and weight decay, three steps by hand") {
  Parameter p = make_param({1.0}, {0.5});
  hg::SGD sgd({&p}, {0.1, 0.9, 0.1});
  // step 1: g' = 0.5 + 0.1*1 = 0.6         v = 0.6                    p = 1 - 0.06 = 0.94
  // step 2: g' = 0.5 + 0.1*0.94 = 0.594    v = 0.9*0.6 + 0.594 = 1.134   p = 0.94 - 0.1134 = 0.8266
  // step 3: g' = 0.5 + 0.08266 = 0.58266   v = 0.9*1.134 + 0.58266 = 1.60326   p = 0.8266 - 0.160326 = 0.666274
  const double expected[3] = {0.94, 0.8266, 0.666274};
  for (double e : expected) {
    sgd.step();
    REQUIRE(std::abs(p.value.at({0}) - e) < 1e-12);
  }
  // The grad is an input only: the optimizer never writes it.
  REQUIRE(p.grad.at({0}) == 0.5);
}

TEST_CASE("AdamW: decoupled decay and bias correction, three steps by hand") {
  for (DType dtype : {DType::F64, DType::F32}) {
    INFO(hg::dtype_name(dtype));
    const double tol = dtype == DType::F64 ? 1e-12 : 2e-6;  // f32: a few ulps of values near 1
    Parameter p = make_param({1.0, -0.5}, {0.5, 0.0}, dtype);
    hg::AdamW adam({&p}, {/*lr=*/0.1, /*beta1=*/0.9, /*beta2=*/0.999, /*eps=*/1e-8, /*weight_decay=*/0.1});
    const double grads[3] = {0.5, -1.0, 0.25};
    double x = 1.0, m = 0.0, v = 0.0;
    double y = -0.5;  // second element: zero grad, so only weight decay moves it
    for (int t = 1; t <= 3; ++t) {
      set_grad(p, {grads[t - 1], 0.0});
      adam.step();
      // The update written out as scalars (Loshchilov & Hutter, Algorithm 2).
      x = x - 0.1 * 0.1 * x;
      m = 0.9 * m + 0.1 * grads[t - 1];
      v = 0.999 * v + 0.001 * grads[t - 1] * grads[t - 1];
      const double m_hat = m / (1.0 - std::pow(0.9, t));
      const double v_hat = v / (1.0 - std::pow(0.999, t));
      x = x - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
      y = y * (1.0 - 0.1 * 0.1);
      REQUIRE(std::abs(p.value.at({0}) - x) < tol);
      REQUIRE(std::abs(p.value.at({1}) - y) < tol);
    }
  }
}

TEST_CASE("AdamW first step is lr * sign(g) plus decay, whatever the gradient scale") {
  Parameter p = make_param({0.0, 0.0}, {1e-3, -1e3});
  hg::AdamW adam({&p}, {0.01, 0.9, 0.999, 1e-12, 0.0});
  adam.step();
  REQUIRE(std::abs(p.value.at({0}) - -0.01) < 1e-9);
  REQUIRE(std::abs(p.value.at({1}) - 0.01) < 1e-9);
}

TEST_CASE("optimizer input checks") {
  Parameter ok = make_param({1.0}, {1.0});
  Parameter bad{Tensor::zeros({2}, DType::F64), Tensor::zeros({3}, DType::F64)};
  REQUIRE_THROWS_AS(hg::SGD({&bad}, {}), hg::Error);
  REQUIRE_THROWS_AS(hg::AdamW({&bad}, {}), hg::Error);
  REQUIRE_THROWS_AS(hg::SGD({&ok}, {-0.1, 0.0, 0.0}), hg::Error);
  REQUIRE_THROWS_AS(hg::AdamW({&ok}, {0.1, 1.0, 0.999, 1e-8, 0.0}), hg::Error);
  REQUIRE_THROWS_AS(hg::AdamW({&ok}, {0.1, 0.9, 0.999, 0.0, 0.0}), hg::Error);
  hg::SGD sgd({&ok}, {});
  ok.grad = Tensor::zeros({1}, DType::F32);  // dtype no longer matches the value
  REQUIRE_THROWS_AS(sgd.step(), hg::Error);
}

TEST_CASE("Optimizer::zero_grad clears every grad") {
  Parameter a = make_param({1.0, 2.0}, {3.0, 4.0});
  Parameter b = make_param({5.0}, {6.0}, DType::F32);
  hg::SGD sgd({&a, &b}, {});
  sgd.zero_grad();
  REQUIRE(a.grad.to_vector() == std::vector<double>{0.0, 0.0});
  REQUIRE(b.grad.to_vector() == std::vector<double>{0.0});
}

TEST_CASE("clip_grad_norm scales all grads by one global factor") {
  Parameter a = make_param({0.0, 0.0}, {3.0, 4.0});
  Parameter b = make_param({0.0}, {12.0}, DType::F32);
  // Global norm sqrt(9 + 16 + 144) = 13.
  REQUIRE(std::abs(hg::clip_grad_norm({&a, &b}, 20.0) - 13.0) < 1e-12);
  REQUIRE(a.grad.to_vector() == std::vector<double>{3.0, 4.0});  // below the limit: untouched
  REQUIRE(std::abs(hg::clip_grad_norm({&a, &b}, 6.5) - 13.0) < 1e-12);
  REQUIRE(std::abs(a.grad.at({0}) - 1.5) < 1e-12);
  REQUIRE(std::abs(a.grad.at({1}) - 2.0) < 1e-12);
  REQUIRE(std::abs(b.grad.at({0}) - 6.0) < 1e-6);
  REQUIRE(std::abs(hg::clip_grad_norm({&a, &b}, 100.0) - 6.5) < 1e-6);

  REQUIRE_THROWS_AS(hg::clip_grad_norm({&a}, 0.0), hg::Error);
  // A non-finite norm is reported, and grads are left for the caller to inspect.
  a.grad.set({0}, NAN);
  REQUIRE(std::isnan(hg::clip_grad_norm({&a, &b}, 1.0)));
  REQUIRE(b.grad.at({0}) == 6.0);
}

TEST_CASE("CUDA optimizers and clipping match the CPU float32 path", "[cuda]") {
  HG_REQUIRE_GPU();
  hg::Generator g(21);
  const int64_t n = 4097;  // not a multiple of any block size
  const Tensor value = Tensor::randn({n}, g);
  std::vector<Tensor> grads;
  for (int i = 0; i < 3; ++i) grads.push_back(Tensor::randn({n}, g));

  auto run = [&](Device device, bool adam) {
    Parameter p{value.to(device).clone(), Tensor::zeros({n}, DType::F32, device)};
    hg::SGD sgd({&p}, {0.05, 0.9, 0.01});
    hg::AdamW adamw({&p}, {0.01, 0.9, 0.999, 1e-8, 0.1});
    for (const Tensor& gr : grads) {
      p.grad.copy_(gr);
      if (adam) adamw.step(); else sgd.step();
    }
    return p.value.to(Device::CPU);
  };
  for (bool adam : {false, true}) {
    INFO((adam ? "AdamW" : "SGD"));
    // Same f32 formulas; differences come only from FMA contraction and sqrt rounding.
    REQUIRE(hg::test::max_abs_diff(run(Device::CUDA, adam), run(Device::CPU, adam)) < 1e-5);
  }

  Parameter cpu{value.clone(), grads[0].clone()};
  Parameter gpu{value.to(Device::CUDA), grads[0].to(Device::CUDA)};
  const double norm_cpu = hg::clip_grad_norm({&cpu}, 1.0);
  const double norm_gpu = hg::clip_grad_norm({&gpu}, 1.0);
  REQUIRE(std::abs(norm_cpu - norm_gpu) < 1e-9 * norm_cpu);  // both accumulate in double
  REQUIRE(hg::test::max_abs_diff(cpu.grad, gpu.grad.to(Device::CPU)) < 1e-7);
}

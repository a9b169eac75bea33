// Optimizers against scalar arithmetic written out by hand, gradient clipping,
// and saving / restoring optimizer state.
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/optim.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using hg::Device;
using hg::DType;
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

// Step k's gradient for parameter j: any fixed, non-trivial sequence will do.
std::vector<double> grad_at(int k, int j, int64_t n) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = std::sin(1.0 + 0.7 * k + 1.3 * j + 0.37 * i);
  return g;
}

// Runs steps [from, to) of the fixed gradient sequence.
void run_steps(hg::Optimizer& opt, std::vector<Parameter*> params, int from, int to) {
  for (int k = from; k < to; ++k) {
    for (size_t j = 0; j < params.size(); ++j) set_grad(*params[j], grad_at(k, int(j), params[j]->value.numel()));
    opt.step();
  }
}

// A tiny f32 model: two parameters with fixed starting values.
struct TwoParams {
  Parameter a = make_param({1.0, -2.0, 0.5}, {0, 0, 0}, DType::F32);
  Parameter b = make_param({0.25, 4.0}, {0, 0}, DType::F32);
  std::vector<Parameter*> ptrs() { return {&a, &b}; }
};

std::vector<std::vector<double>> values(const std::vector<Parameter*>& params) {
  std::vector<std::vector<double>> out;
  for (Parameter* p : params) out.push_back(p->value.to_vector());
  return out;
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

TEST_CASE("AdamW keeps each moment of every parameter in one buffer", "[optim]") {
  TwoParams m;
  hg::AdamW opt(m.ptrs(), {});
  const auto state = opt.named_state();
  REQUIRE(state.size() == 4);  // m.0, v.0, m.1, v.1
  CHECK(state[0].second->shares_storage_with(*state[2].second));
  CHECK(state[1].second->shares_storage_with(*state[3].second));
  CHECK_FALSE(state[0].second->shares_storage_with(*state[1].second));
  for (const auto& [name, t] : state)
    for (double v : t->to_vector()) CHECK(v == 0.0);
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

// Interrupting a run, saving the optimizer (and parameters), and resuming in a
// fresh optimizer must give bitwise the trajectory of the uninterrupted run:
// the moments, the momentum and the bias-correction step count all survive.
TEST_CASE("optimizer state round-trips: a resumed run is bitwise the uninterrupted one", "[optim][checkpoint]") {
  const auto dir = hg::test::make_temp_dir("optim_state");
  const std::string path = (dir / "opt.state").string();
  for (const bool adam : {true, false}) {
    INFO((adam ? "AdamW" : "SGD momentum"));
    auto make = [&](std::vector<Parameter*> ps) -> std::unique_ptr<hg::Optimizer> {
      if (adam) return std::make_unique<hg::AdamW>(ps, hg::AdamWOptions{0.05, 0.9, 0.99, 1e-8, 0.01});
      return std::make_unique<hg::SGD>(ps, hg::SGDOptions{0.05, 0.9, 0.01});
    };
    // Three identical models: uninterrupted, saved-and-resumed, resumed without state.
    TwoParams straight_run, resumed_run, stateless_run;

    auto straight = make(straight_run.ptrs());
    run_steps(*straight, straight_run.ptrs(), 0, 7);

    auto first = make(resumed_run.ptrs());
    run_steps(*first, resumed_run.ptrs(), 0, 3);
    first->save_state(path);
    REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
    auto resumed = make(resumed_run.ptrs());
    REQUIRE(resumed->steps() == 0);
    resumed->load_state(path);
    REQUIRE(resumed->steps() == 3);
    run_steps(*resumed, resumed_run.ptrs(), 3, 7);
    CHECK(values(resumed_run.ptrs()) == values(straight_run.ptrs()));

    // Without the state the resumed run differs (so the check above can fail).
    auto head = make(stateless_run.ptrs());
    run_steps(*head, stateless_run.ptrs(), 0, 3);
    auto fresh = make(stateless_run.ptrs());
    run_steps(*fresh, stateless_run.ptrs(), 3, 7);
    CHECK(values(stateless_run.ptrs()) != values(straight_run.ptrs()));
  }
}

TEST_CASE("optimizer load_state refuses a file that does not match, changing nothing", "[optim][checkpoint][errors]") {
  const auto dir = hg::test::make_temp_dir("optim_state_bad");
  const std::string path = (dir / "opt.state").string();
  Parameter a = make_param({1.0, -2.0, 0.5}, {0.1, 0.2, 0.3}, DType::F32);
  hg::AdamW saved({&a}, {});
  saved.step();
  saved.save_state(path);

  auto refuses = [&](hg::Optimizer& opt, const std::string& part) {
    const int64_t steps = opt.steps();
    try {
      opt.load_state(path);
      FAIL("load_state accepted a mismatched file");
    } catch (const hg::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
    CHECK(opt.steps() == steps);
  };
  Parameter wide = make_param({1.0, 2.0, 3.0, 4.0}, {0, 0, 0, 0}, DType::F32);
  hg::AdamW wrong_shape({&wide}, {});
  refuses(wrong_shape, "shape");  // the message names the shapes: [3] in the file, [4] here
  Parameter two = make_param({1.0}, {0}, DType::F32);
  hg::AdamW wrong_count({&a, &two}, {});
  refuses(wrong_count, "state tensors");
  hg::SGD wrong_kind({&a}, {0.1, 0.9, 0.0});
  refuses(wrong_kind, "state tensors");

  // A flipped byte fails the checksum.
  std::string bytes = hg::test::read_bytes(path);
  bytes[bytes.size() / 2] ^= 0x40;
  hg::test::write_bytes(path, bytes);
  hg::AdamW same({&a}, {});
  refuses(same, "checksum");
  CHECK_THROWS_AS(same.load_state((dir / "missing").string()), hg::Error);
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
      if (adam) adamw.step();
      else sgd.step();
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

// Module tree: parameter names, grads, modes, dtype and device moves (values and
// grads packed in one buffer each), and checkpoints that refuse bad files.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/module.hpp"
#include "core/packed_tensors.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using hg::DType;
using hg::Module;
using hg::Parameter;
using hg::Tensor;
namespace fs = std::filesystem;

namespace {

struct Leaf : Module {
  Parameter weight, bias;
  Leaf(int64_t n, hg::Generator& g) {
    register_parameter("weight", weight, Tensor::randn({n, 2}, g));
    register_parameter("bias", bias, Tensor::randn({2}, g));
  }
};

struct Block : Module {
  Leaf inner;
  explicit Block(hg::Generator& g) : inner(2, g) { register_module("inner", inner); }
};

struct Net : Module {
  Leaf first, second;
  Block block;
  Parameter scale;
  Net(hg::Generator& g, int64_t first_rows = 3) : first(first_rows, g), second(4, g), block(g) {
    register_module("first", first);
    register_module("second", second);
    register_module("block", block);
    register_parameter("scale", scale, Tensor::randn({1}, g));
  }
};

}  // namespace

TEST_CASE("named_parameters walks the tree with dotted names") {
  hg::Generator g(1);
  Net net(g);
  std::vector<std::string> names;
  for (const auto& entry : net.named_parameters()) names.push_back(entry.first);
  REQUIRE(names == std::vector<std::string>{"scale", "first.weight", "first.bias", "second.weight", "second.bias",
                                            "block.inner.weight", "block.inner.bias"});
  REQUIRE(net.parameters().size() == 7);
  REQUIRE(net.parameters()[1] == &net.first.weight);
  REQUIRE(net.num_parameters() == 1 + 3 * 2 + 2 + 4 * 2 + 2 + 2 * 2 + 2);
  for (Parameter* p : net.parameters()) {
    REQUIRE(p->grad.shape() == p->value.shape());
    for (double v : p->grad.to_vector()) REQUIRE(v == 0.0);
  }
}

TEST_CASE("registering a name twice is an error") {
  struct Twice : Module {
    Parameter a, b;
    Twice() {
      register_parameter("w", a, Tensor::zeros({1}));
      register_parameter("w", b, Tensor::zeros({1}));
    }
  };
  REQUIRE_THROWS_AS(Twice(), hg::Error);
}

TEST_CASE("zero_grad, train/eval and dtype moves reach every module") {
  hg::Generator g(2);
  Net net(g);
  for (Parameter* p : net.parameters()) p->grad.fill_(3.0);
  net.zero_grad();
  for (Parameter* p : net.parameters())
    for (double v : p->grad.to_vector()) REQUIRE(v == 0.0);

  REQUIRE(net.block.inner.training());
  net.eval();
  REQUIRE_FALSE(net.training());
  REQUIRE_FALSE(net.first.training());
  REQUIRE_FALSE(net.block.inner.training());
  net.train();
  REQUIRE(net.block.inner.training());

  const auto before = hg::test::parameter_snapshot(net);
  net.to(DType::F64);
  for (Parameter* p : net.parameters()) {
    REQUIRE(p->value.dtype() == DType::F64);
    REQUIRE(p->grad.dtype() == DType::F64);
  }
  REQUIRE(hg::test::parameter_snapshot(net) == before);  // f32 -> f64 is exact
}

TEST_CASE("checkpoint save/load round trip") {
  const fs::path dir = hg::test::make_temp_dir("module_1");
  const std::string path = (dir / "net.ckpt").string();
  hg::Generator g(3);
  Net net(g);
  net.save(path);
  REQUIRE(fs::exists(path));
  REQUIRE_FALSE(fs::exists(path + ".tmp"));
  const auto saved = hg::test::parameter_snapshot(net);

  hg::Generator other(99);
  Net fresh(other);
  REQUIRE(hg::test::parameter_snapshot(fresh) != saved);
  fresh.load(path);
  REQUIRE(hg::test::parameter_snapshot(fresh) == saved);

  // f64 modules round-trip too.
  net.to(DType::F64);
  net.block.inner.bias.value.set({1}, 1.0 / 3.0);
  net.save(path);
  fresh.to(DType::F64);
  fresh.load(path);
  REQUIRE(fresh.block.inner.bias.value.at({1}) == 1.0 / 3.0);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint load refuses mismatched or damaged files and leaves parameters untouched") {
  const fs::path dir = hg::test::make_temp_dir("module_2");
  const std::string path = (dir / "net.ckpt").string();
  hg::Generator g(4);
  Net source(g);
  source.save(path);
  const std::string good = hg::test::read_bytes(path);

  hg::Generator g2(5);
  Net target(g2);
  const auto untouched = hg::test::parameter_snapshot(target);
  auto refuses = [&](const std::string& why) {
    INFO(why);
    REQUIRE_THROWS_AS(target.load(path), hg::Error);
    REQUIRE(hg::test::parameter_snapshot(target) == untouched);
  };

  SECTION("wrong shape") {
    hg::Generator g3(6);
    Net wider(g3, 5);  // first.weight is (5, 2) instead of (3, 2)
    wider.save(path);
    try {
      target.load(path);
      FAIL("load accepted a wrong shape");
    } catch (const hg::Error& e) {
      const std::string msg = e.what();
      REQUIRE(msg.find("first.weight") != std::string::npos);
      REQUIRE(msg.find("(5, 2)") != std::string::npos);
      REQUIRE(msg.find("(3, 2)") != std::string::npos);
    }
    REQUIRE(hg::test::parameter_snapshot(target) == untouched);
  }
  SECTION("missing tensor and extra tensors") {
    hg::Generator g3(7);
    Leaf leaf(3, g3);
    leaf.save(path);
    refuses("file holds only a Leaf");
    target.save(path);
    REQUIRE_THROWS_AS(leaf.load(path), hg::Error);
  }
  SECTION("wrong dtype") {
    source.to(DType::F64);
    source.save(path);
    refuses("f64 file into f32 module");
  }
  SECTION("every single flipped byte") {
    for (size_t i = 0; i < good.size(); ++i) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ 0x10);
      hg::test::write_bytes(path, bad);
      refuses("flipped byte " + std::to_string(i));
    }
  }
  SECTION("every truncation and trailing garbage") {
    for (size_t n = 0; n < good.size(); ++n) {
      hg::test::write_bytes(path, good.substr(0, n));
      refuses("truncated to " + std::to_string(n));
    }
    hg::test::write_bytes(path, good + "junk");
    refuses("trailing garbage");
  }
  SECTION("a missing file") {
    fs::remove(path);
    refuses("no file");
  }
  fs::remove_all(dir);
}

TEST_CASE("a leftover .tmp from a crashed save does not affect the checkpoint") {
  const fs::path dir = hg::test::make_temp_dir("module_3");
  const std::string path = (dir / "net.ckpt").string();
  hg::Generator g(8);
  Net net(g);
  net.save(path);
  const auto saved = hg::test::parameter_snapshot(net);
  hg::test::write_bytes(path + ".tmp", "half-written garbage from a crash");

  hg::Generator g2(9);
  Net other(g2);
  other.load(path);
  REQUIRE(hg::test::parameter_snapshot(other) == saved);

  // The next save replaces the stale .tmp and leaves no .tmp behind.
  other.first.bias.value.fill_(0.5);
  other.save(path);
  REQUIRE_FALSE(fs::exists(path + ".tmp"));
  net.load(path);
  REQUIRE(net.first.bias.value.to_vector() == std::vector<double>{0.5, 0.5});
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint carries the training step passed to save; load returns it, or -1 when none was stored") {
  const fs::path dir = hg::test::make_temp_dir("module_step");
  const std::string path = (dir / "net.ckpt").string();
  hg::Generator g(11);
  Net net(g);
  const auto saved = hg::test::parameter_snapshot(net);
  net.save(path, 1234);
  hg::Generator g2(12);
  Net other(g2);
  REQUIRE(other.load(path) == 1234);
  REQUIRE(hg::test::parameter_snapshot(other) == saved);  // the step record is not a parameter
  net.save(path);
  REQUIRE(other.load(path) == -1);
  net.save(path, 0);
  REQUIRE(other.load(path) == 0);
  fs::remove_all(dir);
}

namespace {

// Bytes from a to b, two views of one buffer.
int64_t bytes_apart(const Tensor& a, const Tensor& b) {
  return static_cast<const char*>(b.raw_data()) - static_cast<const char*>(a.raw_data());
}

}  // namespace

TEST_CASE("packed_zeros_like: one buffer per dtype, aligned views of the given shapes, zeros") {
  hg::Generator g(5);
  const std::vector<Tensor> like{Tensor::randn({3, 5}, g), Tensor(), Tensor::randn({7}, g, DType::F64),
                                 Tensor::randn({}, g), Tensor::randn({2, 65}, g)};
  const std::vector<Tensor> out = hg::packed_zeros_like(like, hg::Device::CPU);
  REQUIRE(out.size() == like.size());
  REQUIRE_FALSE(out[1].defined());
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}, size_t{4}}) {
    REQUIRE(out[i].shape() == like[i].shape());
    REQUIRE(out[i].dtype() == like[i].dtype());
    for (double v : out[i].to_vector()) REQUIRE(v == 0.0);
  }
  for (size_t i : {size_t{3}, size_t{4}}) {
    REQUIRE(out[i].shares_storage_with(out[0]));
    REQUIRE(bytes_apart(out[0], out[i]) % hg::kPackedAlignment == 0);
    REQUIRE(bytes_apart(out[0], out[i]) > 0);
  }
  REQUIRE_FALSE(out[2].shares_storage_with(out[0]));  // F64: a buffer of its own
  // Cast on request; the copies hold the values.
  const std::vector<Tensor> copies = hg::packed_copies(like, hg::Device::CPU, DType::F64);
  REQUIRE(copies[0].dtype() == DType::F64);
  REQUIRE(copies[4].shares_storage_with(copies[2]));
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}, size_t{4}}) REQUIRE(copies[i].to_vector() == like[i].to_vector());
}

TEST_CASE("Module::to a device the tree is on keeps its tensors; to CUDA packs values and grads") {
  hg::Generator g(3);
  Net net(g);
  for (Parameter* p : net.parameters()) p->grad.fill_(0.5);
  const Tensor first = net.first.weight.value;
  net.to(hg::Device::CPU);
  REQUIRE(net.first.weight.value.raw_data() == first.raw_data());
  if (!hg::test::cuda_paths_run("Module::to")) return;
  const auto before = hg::test::parameter_snapshot(net);
  net.to(hg::Device::CUDA);
  REQUIRE(hg::test::parameter_snapshot(net) == before);
  const std::vector<Parameter*> params = net.parameters();
  for (Parameter* p : params) {
    REQUIRE(p->value.is_cuda());
    REQUIRE(p->value.shares_storage_with(params.front()->value));
    REQUIRE(p->grad.shares_storage_with(params.front()->grad));
    REQUIRE_FALSE(p->grad.shares_storage_with(p->value));
    for (double v : p->grad.to_vector()) REQUIRE(v == 0.5);
  }
}

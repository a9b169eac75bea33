#include "dist/collectives.hpp"

#include <chrono>

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/nccl_comm.hpp"
#include "dist/watchdog.hpp"
#include "dist/world.hpp"

namespace hg::dist {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void scale_in_place(Tensor& x, double s) {
  if (s == 1.0) return;
  float* p = x.data<float>();
  const float f = static_cast<float>(s);
  for (int64_t i = 0; i < x.numel(); ++i) p[i] *= f;
}

// wire = bf16(s * x), the same float product as scale_in_place, rounded once.
void narrow_scaled(const Tensor& x, double s, const Tensor& wire) {
  const float* p = x.data<float>();
  bf16_t* w = wire.data<bf16_t>();
  const float f = static_cast<float>(s);
  for (int64_t i = 0; i < x.numel(); ++i) w[i] = float_to_bf16(f * p[i]);
}

}  // namespace

Collectives::Collectives(Device device) : device_(device) {
  const World& w = world();
  if (device != Device::CUDA || gpu::nccl::initialized()) return;
  HG_CHECK(gpu::nccl::built_with_nccl() || !w.distributed(), "dist::Collectives",
           "CUDA data parallelism needs NCCL, and this handgrad was built without it (nccl.h / libnccl not found at "
           "configure time); run one rank per job, or --device cpu");
  if (!gpu::nccl::built_with_nccl()) return;  // one process: nothing to reduce
  std::vector<uint8_t> id = w.rank == 0 ? gpu::nccl::make_unique_id() : std::vector<uint8_t>(gpu::nccl::kUniqueIdBytes);
  broadcast(id.data(), id.size(), 0, "broadcast of the NCCL unique id");
  Watch watch("NCCL communicator set-up (ncclCommInitRank)");
  gpu::nccl::init(id, w.rank, w.size);
}

void Collectives::check(const Tensor& x, const char* op) const {
  x.check_defined(op);
  x.check_dtype(DType::F32, op);
  x.check_device(device_, op);
}

void Collectives::check_wire(const Tensor& wire, const Tensor& x, const char* op) const {
  wire.check_defined(op);
  wire.check_dtype(DType::BF16, op);
  wire.check_device(device_, op);
  HG_CHECK(wire.numel() == x.numel(), op, "bf16 wire buffer of ", wire.numel(), " elements for ", x.numel());
}

void Collectives::scale_locally(const Tensor& in, Tensor& out, double premul, const Tensor& wire) {
  Backend& be = backend_for(device_);
  be.zip(BinaryOp::Mul, in, Tensor::full({1}, premul, DType::F32, device_), out);
  if (!wire.defined()) return;
  Tensor w = wire;
  be.cast(out, w);
  be.cast(w, out);
}

void Collectives::all_reduce_sum(Tensor& x, double premul, const Tensor& wire) {
  const char* op = "Collectives::all_reduce_sum";
  check(x, op);
  const bool bf16 = wire.defined();
  if (bf16) check_wire(wire, x, op);
  const size_t n = static_cast<size_t>(x.numel());
  if (device_ == Device::CUDA) {
    if (!gpu::nccl::initialized()) scale_locally(x, x, premul, wire);
    else if (bf16)
      gpu::nccl::all_reduce_sum_bf16(x.data<float>(), &wire.data<bf16_t>()->bits, n, static_cast<float>(premul));
    else gpu::nccl::all_reduce_sum(x.data<float>(), n, static_cast<float>(premul));
    return;
  }
  const auto t0 = Clock::now();
  if (bf16) {
    narrow_scaled(x, premul, wire);
    start_all_reduce_sum(wire.data<bf16_t>(), n);
    cpu_widen_.emplace_back(wire, x);
  } else {
    scale_in_place(x, premul);
    start_all_reduce_sum(x.data<float>(), n);
  }
  cpu_stats_.busy_ms += ms_since(t0);
  ++cpu_stats_.collectives;
}

void Collectives::reduce_scatter_sum(Tensor& in, Tensor& out, double premul, const Tensor& wire_in,
                                     const Tensor& wire_out) {
  const char* op = "Collectives::reduce_scatter_sum";
  check(in, op);
  check(out, op);
  const int64_t n = out.numel();
  HG_CHECK(in.numel() == n * world().size, op, "input of ", in.numel(), " elements is not world ", world().size,
           " x output ", n);
  const bool bf16 = wire_in.defined() || wire_out.defined();
  if (bf16) {
    check_wire(wire_in, in, op);
    check_wire(wire_out, out, op);
  }
  bf16_t* w_in = bf16 ? wire_in.data<bf16_t>() : nullptr;
  bf16_t* w_out = bf16 ? wire_out.data<bf16_t>() : nullptr;
  if (device_ == Device::CUDA) {
    if (!gpu::nccl::initialized()) scale_locally(in, out, premul, wire_out);  // one process: out = premul * in
    else if (bf16)
      gpu::nccl::reduce_scatter_sum_bf16(in.data<float>(), &w_in->bits, &w_out->bits, out.data<float>(),
                                         static_cast<size_t>(n), static_cast<float>(premul));
    else
      gpu::nccl::reduce_scatter_sum(in.data<float>(), out.data<float>(), static_cast<size_t>(n),
                                    static_cast<float>(premul));
    return;
  }
  const auto t0 = Clock::now();
  if (bf16) {
    narrow_scaled(in, premul, wire_in);
    start_reduce_scatter_sum(w_in, w_out, static_cast<size_t>(n));
    cpu_widen_.emplace_back(wire_out, out);
  } else {
    scale_in_place(in, premul);
    start_reduce_scatter_sum(in.data<float>(), out.data<float>(), static_cast<size_t>(n));
  }
  cpu_stats_.busy_ms += ms_since(t0);
  ++cpu_stats_.collectives;
}

uint64_t Collectives::all_gather(Tensor& buffer) {
  check(buffer, "Collectives::all_gather");
  const int64_t n = buffer.numel() / world().size;
  HG_CHECK(n * world().size == buffer.numel(), "Collectives::all_gather", buffer.numel(),
           " elements do not split into ", world().size, " equal parts");
  if (device_ == Device::CUDA) {
    if (!gpu::nccl::initialized()) return 0;  // one process without NCCL: nothing to gather
    return gpu::nccl::all_gather(buffer.data<float>(), static_cast<size_t>(n), world().rank);
  }
  const auto t0 = Clock::now();
  const uint64_t ticket = start_all_gather(buffer.data<float>(), static_cast<size_t>(n));
  cpu_stats_.busy_ms += ms_since(t0);
  ++cpu_stats_.collectives;
  return ticket;
}

void Collectives::progress() {
  if (device_ == Device::CUDA) return;
  const auto t0 = Clock::now();
  dist::progress();
  cpu_stats_.busy_ms += ms_since(t0);
}

void Collectives::wait(const char* what) {
  if (device_ == Device::CUDA) {
    if (gpu::nccl::initialized()) gpu::nccl::join();
    return;
  }
  const auto t0 = Clock::now();
  wait_all(what);
  for (auto& [wire, out] : cpu_widen_) {
    const bf16_t* w = wire.data<bf16_t>();
    float* o = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = bf16_to_float(w[i]);
  }
  cpu_widen_.clear();
  const double ms = ms_since(t0);
  cpu_stats_.busy_ms += ms;
  cpu_stats_.exposed_ms += ms;
}

void Collectives::wait_for(uint64_t ticket, const char* what) {
  if (device_ == Device::CUDA) {
    if (gpu::nccl::initialized()) gpu::nccl::wait_for(ticket);
    return;
  }
  const auto t0 = Clock::now();
  wait_one(ticket, what);
  const double ms = ms_since(t0);
  cpu_stats_.busy_ms += ms;
  cpu_stats_.exposed_ms += ms;
}

void Collectives::all_reduce_sum_f64(Tensor& x, const char* what) {
  x.check_defined(what);
  x.check_dtype(DType::F64, what);
  x.check_device(device_, what);
  if (device_ == Device::CUDA) {
    if (!gpu::nccl::initialized()) return;  // one process without NCCL
    gpu::nccl::all_reduce_sum(x.data<double>(), static_cast<size_t>(x.numel()));
    gpu::nccl::join();
    return;
  }
  dist::all_reduce_sum(x.data<double>(), static_cast<size_t>(x.numel()), what);
}

CommStats Collectives::take_stats() {
  CommStats s;
  if (device_ == Device::CUDA) {
    const gpu::nccl::CommTiming t = gpu::nccl::take_timing();
    s.busy_ms = t.busy_ms;
    s.exposed_ms = t.exposed_ms;
    s.collectives = t.collectives;
  } else {
    s = cpu_stats_;
    cpu_stats_ = CommStats{};
  }
  return s;
}

}  // namespace hg::dist

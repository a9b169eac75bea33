#pragma once
// bench_train --floor's measurements (CUDA builds; the parts and the byte
// counts: bench/step_floor.hpp). Every part is timed alone on the handgrad
// stream: CUDA events around `reps` calls, after warm-up, median of `iters`.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/copy_rates.hpp"
#include "bench/step_floor.hpp"
#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "ops/attention.hpp"

namespace hg::bench {

struct FloorTimedGemm {
  FloorGemm gemm;
  double ms;  // one call
};

struct FloorTimes {
  std::vector<FloorTimedGemm> gemms;
  double attention_fwd_ms = 0, attention_bwd_ms = 0;  // one layer
  std::vector<FloorBytes> bytes;
  std::string copy_name;
  double copy_gbps = 0;  // bytes read + written per second, the best copy
  // The classifier's row pass over one full chunk, per kernel that fits.
  std::vector<std::pair<std::string, double>> row_pass_ms;
  double rows_chunk_bytes = 0;  // the chunk's logits

  double gemm_ms() const {
    double ms = 0;
    for (const FloorTimedGemm& g : gemms) ms += g.ms * double(g.gemm.per_step);
    return ms;
  }
  double bytes_ms(double bytes) const { return bytes / (copy_gbps * 1e9) * 1e3; }
  double memory_ms() const {
    double ms = 0;
    for (const FloorBytes& b : bytes) ms += bytes_ms(b.bytes);
    return ms;
  }
};

// A CUDA tensor of `shape` filled with N(0, 1) values: a 1 Mi-element block
// drawn on the host, copied over the tensor (drawing 100M+ values on the host
// would take seconds; the GEMMs need values, not independent ones).
inline Tensor floor_random(const Shape& shape, DType dtype, Generator& gen) {
  Tensor t = Tensor::empty(shape, dtype, Device::CUDA);
  const int64_t n = t.numel(), block = std::min<int64_t>(n, int64_t(1) << 20);
  const Tensor src = Tensor::randn({block}, gen, dtype, Device::CUDA);
  Tensor flat = t.reshape({n});
  for (int64_t i = 0; i < n; i += block) {
    Tensor part = flat.slice(i, std::min(n, i + block));
    part.copy_(src.slice(0, part.numel()));
  }
  return t;
}

// Samples of about 2 ms, so launch gaps do not count.
inline int floor_reps(double expected_ms) { return int(std::clamp(std::ceil(2.0 / expected_ms), 1.0, 50.0)); }

inline double time_floor_gemm(const FloorGemm& g, DType act, int warmup, int iters, Generator& gen) {
  const Tensor a = floor_random(g.transpose_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, act, gen);
  const Tensor b = floor_random(g.transpose_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, act, gen);
  Tensor out = Tensor::zeros({g.m, g.n}, g.wgrad ? DType::F32 : act, Device::CUDA);
  GemmArgs args;
  args.transpose_a = g.transpose_a;
  args.transpose_b = g.transpose_b;
  args.accumulate = g.wgrad;
  Backend& be = cuda_backend();
  const double expected_ms = g.flops() / double(g.per_step) / 600e12 * 1e3;
  return time_rotating(Device::CUDA, 1, warmup, iters, floor_reps(expected_ms), [&](int) { be.gemm(a, b, out, args); })
      .median_ms;
}

// The row pass alone on one chunk of logits, with each kernel. Each call
// writes g over the previous call's output: the same work, other values.
inline void time_row_pass(const FloorShape& f, DType act, int warmup, int iters, Generator& gen, FloorTimes& r) {
  const int64_t rows = f.chunk_rows, V = f.size.vocab;
  Tensor logits = floor_random({rows, V}, act, gen);
  std::vector<double> t(static_cast<size_t>(rows));
  for (double& v : t) v = double(gen.next_u64() % uint64_t(V));
  const Tensor targets = Tensor::from_vector(t, {rows}, DType::F32, Device::CUDA);
  Tensor inv_count = Tensor::empty({1}, DType::F32, Device::CUDA);
  Tensor row_loss = Tensor::empty({rows}, DType::F32, Device::CUDA);
  gpu::cross_entropy_count_targets(targets, -100, inv_count);
  const auto time_kernel = [&](gpu::RowPassKernel kernel) {
    return time_rotating(
               Device::CUDA, 1, warmup, iters, 4,
               [&](int) { gpu::cross_entropy_lse_rows_grad(logits, targets, -100, inv_count, row_loss, kernel); })
        .median_ms;
  };
  r.rows_chunk_bytes = double(logits.nbytes());
  if (V <= gpu::cross_entropy_staged_max_vocab(act))
    r.row_pass_ms.push_back({"staged", time_kernel(gpu::RowPassKernel::Staged)});
  r.row_pass_ms.push_back({"strided", time_kernel(gpu::RowPassKernel::Strided)});
}

inline FloorTimes time_floor(const FloorShape& f, DType act, bool bf16_copies, int warmup, int iters) {
  FloorTimes r;
  Generator gen(11);
  for (const FloorGemm& g : floor_gemms(f)) {
    r.gemms.push_back({g, time_floor_gemm(g, act, warmup, iters, gen)});
    gpu::empty_cache();
  }

  // Causal self-attention on the packed QKV projection output, as the model runs it.
  const ModelSize& s = f.size;
  const Tensor qkv = floor_random({s.batch, s.seq, 3 * s.d_model}, act, gen);
  const Tensor dout = floor_random({s.batch, s.seq, s.d_model}, act, gen);
  AttentionOptions options;
  options.causal = true;
  AttentionSaved saved;
  attention_forward_packed(qkv, s.heads, options, &saved);
  r.attention_fwd_ms = time_rotating(Device::CUDA, 1, warmup, iters, 4, [&](int) {
                         AttentionSaved fresh;
                         attention_forward_packed(qkv, s.heads, options, &fresh);
                       }).median_ms;
  r.attention_bwd_ms =
      time_rotating(Device::CUDA, 1, warmup, iters, 4, [&](int) { attention_backward_packed(dout, saved); }).median_ms;
  saved = AttentionSaved();
  gpu::empty_cache();

  // The best copy of 256 MiB buffers (far beyond L2): the DRAM rate.
  const size_t copy_bytes = size_t(256) << 20;
  const Tensor src = Tensor::zeros({int64_t(copy_bytes / 4)}, DType::F32, Device::CUDA);
  Tensor dst = Tensor::empty({int64_t(copy_bytes / 4)}, DType::F32, Device::CUDA);
  const std::vector<CopyRate> rates = time_copies(
      1, warmup, iters, 1, copy_bytes, [&](int) { return src.raw_data(); }, [&](int) { return dst.raw_data(); });
  const CopyRate& best = best_copy(rates);
  r.copy_name = best.name;
  r.copy_gbps = gbps(2.0 * double(copy_bytes), best.timing.median_ms);
  r.bytes = floor_bytes(f, bf16_copies);
  time_row_pass(f, act, warmup, iters, gen, r);
  return r;
}

}  // namespace hg::bench

// The classifier row pass lab (bench/lab/classifier.md): the product's
// lse_rows_grad_staged (cuda/lse_rows_staged.cuh) beside the candidates of
// bench/lab/classifier_lab_kernels.cuh. Each is checked against float64 on
// fresh random hostile rows (bench/lab/classifier_lab_check.cuh) at several
// vocabularies and row alignments, twice (the two runs must agree bit for
// bit), then timed on rotating inputs; it prints microseconds a call, GB/s
// (every logit read and written: 2 rows V sizeof(T) bytes) and % of the
// best device copy of those bytes. Links only the CUDA runtime.
//
//   classifier_lab                                   check, then rows 2560 and 8192 at V 50304, bf16
//   classifier_lab --variants production,one_pass                   three passes against the one-pass stats
//   classifier_lab --variants production,bias_stage --rows 2560     the head's bias added in the row pass
//   classifier_lab --variants production,persistent2 --threads 1024 --rows 2560
//   classifier_lab --check-only --dtypes bf16,f32
//   classifier_lab --variants production --rows 2560 --before write,none,fma   fresh logits, reused g, after FMAs
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/lab/classifier_lab_check.cuh"
#include "bench/lab/classifier_lab_kernels.cuh"
#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"
#include "cuda/row_span.hpp"

namespace {

using bf16 = __nv_bfloat16;
using lab::kIgnoreIndex;

const std::vector<std::string> kVariants{"production", "bias_stage", "one_pass", "pieces_online", "persistent2"};

struct Options {
  std::vector<std::string> variants = kVariants, dtypes{"bf16"};
  std::vector<int64_t> rows{2560, 8192}, vocab{50304}, threads{512, 1024};
  std::vector<int64_t> check_vocab{50304, 50257, 32003, 1000};
  int64_t check_rows = 0;  // 0: 4 per SM + 3
  int grid = 0;            // persistent blocks; 0: one per SM
  int pieces = 4, samples = 30, warmup = 3;
  uint64_t seed = 0;  // 0: a fresh one
  bool check_only = false;
  // What runs right before each timed row pass (only the row pass is timed):
  // write (a kernel writes fresh logits into the set, as the chunk's forward
  // GEMM does in the step); none (calls queued back to back, each reading
  // the g that the last call on its set wrote: after two calls a row's
  // values are all equal but the target's, every term ties the max and no
  // exponential is taken, so this understates the row pass); fma (fresh
  // logits as with write, then about 300 us of FMAs at a GEMM's power draw).
  // The first one listed picks the fastest variant.
  std::vector<std::string> before{"write"};
};

void print_help() {
  std::printf(
      "classifier_lab: the classifier's row pass (max, log-sum-exp, loss, g over the logits) as production runs\n"
      "it and as the lab's candidates do, checked against float64 and timed.\n"
      "  --variants A,B,...   of production, bias_stage, one_pass, pieces_online, persistent2 (default all)\n"
      "  --rows N[,...]       timed rows (default 2560,8192)\n"
      "  --vocab N[,...]      timed vocabularies (default 50304)\n"
      "  --dtypes bf16,f32    logits dtype (default bf16)\n"
      "  --threads N[,...]    block size of the persistent variants: 512, 1024 (default both)\n"
      "  --grid N             persistent blocks (default: one per SM)\n"
      "  --pieces N           pieces of a row's copy in pieces_online, 2..8 (default 4)\n"
      "  --check-vocab N,...  checked vocabularies (default 50304,50257,32003,1000)\n"
      "  --check-rows N       rows of the large check (default 4 per SM + 3; a 9-row check runs too)\n"
      "  --samples N          timed samples of ~1 ms each, median reported (default 30)\n"
      "  --warmup N           untimed samples first (default 3)\n"
      "  --seed N             the check inputs' seed (default: fresh, printed)\n"
      "  --check-only         check, do not time\n"
      "  --before A,B,...     what runs right before each timed call, the call alone timed: write (a kernel writes\n"
      "                       fresh logits, as the step's forward GEMM), none (the last call's g: all ties, no\n"
      "                       exponentials), fma (write, then ~300 us of FMAs); the first picks the fastest (default "
      "write)\n"
      "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  lab::Flags f("classifier_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--variants")) o.variants = f.choices(kVariants);
    else if (f.is("--dtypes")) o.dtypes = f.choices({"bf16", "f32"});
    else if (f.is("--rows")) o.rows = f.numbers(1, 1 << 20);
    else if (f.is("--vocab")) o.vocab = f.numbers(1, 1 << 20);
    else if (f.is("--check-vocab")) o.check_vocab = f.numbers(1, 1 << 20);
    else if (f.is("--check-rows")) o.check_rows = f.number(1, 1 << 16);
    else if (f.is("--threads")) {
      o.threads = f.numbers(512, 1024);
      for (int64_t t : o.threads)
        if (t != 512 && t != 1024) f.fail("--threads: " + std::to_string(t) + " is not 512 or 1024");
    } else if (f.is("--grid")) o.grid = int(f.number(1, 1 << 20));
    else if (f.is("--pieces")) o.pieces = int(f.number(2, lab::kMaxPieces));
    else if (f.is("--samples")) o.samples = int(f.number(3, 100000));
    else if (f.is("--warmup")) o.warmup = int(f.number(0, 100000));
    else if (f.is("--seed")) o.seed = uint64_t(f.number(1, INT64_MAX));
    else if (f.is("--check-only")) o.check_only = true;
    else if (f.is("--before")) o.before = f.choices({"write", "none", "fma"});
    else f.unknown();
  }
  return o;
}

using lab::device_attribute;

// ---- candidates ---------------------------------------------------------------------

template <class T>
using RowKernel = void (*)(T*, const float*, int64_t, int64_t, const float*, float*);
template <class T>
using PiecesKernel = void (*)(T*, const float*, int64_t, int64_t, const float*, float*, int);
template <class T>
using BiasKernel = void (*)(T*, const T*, const float*, int64_t, int64_t, const float*, float*);
template <class T>
using LoopKernel = void (*)(T*, const float*, int64_t, int64_t, const float*, float*, int64_t, uint32_t);

// One call's device arguments.
template <class T>
struct Call {
  T* logits;
  const T* bias;  // V zeros at the rows' alignment: what bias_stage adds
  const float* targets;
  const float* inv_count;
  float* row_loss;
  int64_t rows, vocab;
};

// A variant at one block size: exactly one of its kernels is set.
template <class T>
struct Candidate {
  std::string name;
  int threads = 0;
  RowKernel<T> row = nullptr;        // production: a block per row
  PiecesKernel<T> pieces = nullptr;  // one_pass (1 piece), pieces_online: a block per row
  int n_pieces = 1;
  LoopKernel<T> loop = nullptr;    // persistent: `grid` blocks walk the rows
  BiasKernel<T> biased = nullptr;  // bias_stage: a block per row, the bias added
  std::string failure;             // the first failed check; a failed candidate is never the fastest

  const void* fn() const {
    return row      ? reinterpret_cast<const void*>(row)
           : biased ? reinterpret_cast<const void*>(biased)
           : pieces ? reinterpret_cast<const void*>(pieces)
                    : reinterpret_cast<const void*>(loop);
  }
  static uint32_t stage_bytes(int64_t vocab) { return uint32_t(hg::gpu::staged_row_bytes(vocab, sizeof(T))); }
  size_t smem(int64_t vocab) const { return size_t(loop ? 2 : 1) * stage_bytes(vocab); }
  // Whether its shared memory fits one block, with the kernel's own.
  bool fits(int64_t vocab) const {
    cudaFuncAttributes attr{};
    CHECK_CUDA(cudaFuncGetAttributes(&attr, fn()));
    return smem(vocab) + attr.sharedSizeBytes <= size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  }
  int blocks_per_sm(int64_t vocab) const {
    int n = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn(), threads, smem(vocab)));
    return n;
  }
  void launch(const Call<T>& a, int grid) const {
    const size_t bytes = smem(a.vocab);
    if (row) {
      row<<<unsigned(a.rows), threads, bytes>>>(a.logits, a.targets, a.vocab, kIgnoreIndex, a.inv_count, a.row_loss);
    } else if (biased) {
      biased<<<unsigned(a.rows), threads, bytes>>>(a.logits, a.bias, a.targets, a.vocab, kIgnoreIndex, a.inv_count,
                                                   a.row_loss);
    } else if (pieces) {
      pieces<<<unsigned(a.rows), threads, bytes>>>(a.logits, a.targets, a.vocab, kIgnoreIndex, a.inv_count, a.row_loss,
                                                   n_pieces);
    } else {
      loop<<<unsigned(std::min<int64_t>(grid, a.rows)), threads, bytes>>>(
          a.logits, a.targets, a.vocab, kIgnoreIndex, a.inv_count, a.row_loss, a.rows, stage_bytes(a.vocab));
    }
  }
};

template <class T>
LoopKernel<T> persistent_kernel(int threads) {
  return threads == 1024 ? lab::lse_rows_grad_persistent<T, 1024> : lab::lse_rows_grad_persistent<T, 512>;
}

template <class T>
std::vector<Candidate<T>> candidates(const Options& o) {
  std::vector<Candidate<T>> out;
  constexpr int kRowThreads = hg::gpu::kStagedThreads;
  for (const std::string& v : o.variants) {
    if (v == "production") out.push_back({v, kRowThreads, hg::gpu::lse_rows_grad_staged<T>});
    if (v == "bias_stage") {
      using lab::BiasOrder;
      const std::pair<const char*, BiasKernel<T>> forms[] = {
          {"/1", lab::lse_rows_grad_bias_stage<T, 1, BiasOrder::Same>},
          {"/4", lab::lse_rows_grad_bias_stage<T, 4, BiasOrder::Same>},
          {"/4 rotated", lab::lse_rows_grad_bias_stage<T, 4, BiasOrder::Rotated>},
          {"/4 no loads", lab::lse_rows_grad_bias_stage<T, 4, BiasOrder::None>}};
      for (const auto& [suffix, kernel] : forms) {
        Candidate<T> c{v + suffix, kRowThreads};
        c.biased = kernel;
        out.push_back(c);
      }
    }
    if (v == "one_pass") out.push_back({v, kRowThreads, nullptr, lab::lse_rows_grad_pieces<T>, 1});
    if (v == "pieces_online")
      out.push_back({v + "/" + std::to_string(o.pieces), kRowThreads, nullptr, lab::lse_rows_grad_pieces<T>, o.pieces});
    for (int64_t t : o.threads)
      if (v == "persistent2")
        out.push_back({v + "/" + std::to_string(t), int(t), nullptr, nullptr, 1, persistent_kernel<T>(int(t))});
  }
  for (const Candidate<T>& c : out) lab::allow_all_shared_memory(c.fn());  // as cross_entropy_lse.cu
  return out;
}

// ---- device buffers -----------------------------------------------------------------

template <class T>
struct DeviceRows {
  T* base = nullptr;  // shift + n elements
  T* logits = nullptr;
  T* bias = nullptr;  // shift + V zeros
  float *targets = nullptr, *inv_count = nullptr, *row_loss = nullptr;
  int64_t rows = 0, vocab = 0;

  DeviceRows(int64_t rows_, int64_t vocab_, int64_t shift) : rows(rows_), vocab(vocab_) {
    CHECK_CUDA(cudaMalloc(&base, size_t(shift + rows * vocab) * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&bias, size_t(shift + vocab) * sizeof(T)));
    CHECK_CUDA(cudaMemset(bias, 0, size_t(shift + vocab) * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&targets, size_t(rows) * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&inv_count, sizeof(float)));
    CHECK_CUDA(cudaMalloc(&row_loss, size_t(rows) * sizeof(float)));
    logits = base + shift;
  }
  ~DeviceRows() {
    for (void* p : {static_cast<void*>(base), static_cast<void*>(bias), static_cast<void*>(targets),
                    static_cast<void*>(inv_count), static_cast<void*>(row_loss)})
      CHECK_CUDA(cudaFree(p));
  }
  DeviceRows(const DeviceRows&) = delete;
  DeviceRows& operator=(const DeviceRows&) = delete;
  size_t bytes() const { return size_t(rows * vocab) * sizeof(T); }
  Call<T> call() const { return {logits, bias + (logits - base), targets, inv_count, row_loss, rows, vocab}; }
  void set_targets(const std::vector<float>& t, float inv) const {
    CHECK_CUDA(cudaMemcpy(targets, t.data(), t.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(inv_count, &inv, sizeof(float), cudaMemcpyHostToDevice));
  }
};

// ---- check --------------------------------------------------------------------------

// One run of c over fresh copies of `logits`: g and the row losses (NaN
// bytes first, so a row left unwritten fails).
template <class T>
void run_once(const Candidate<T>& c, const DeviceRows<T>& d, const std::vector<T>& logits, int grid, std::vector<T>& g,
              std::vector<float>& loss) {
  CHECK_CUDA(cudaMemcpy(d.logits, logits.data(), d.bytes(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d.row_loss, 0xff, size_t(d.rows) * sizeof(float)));
  c.launch(d.call(), grid);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  g.resize(logits.size());
  loss.resize(size_t(d.rows));
  CHECK_CUDA(cudaMemcpy(g.data(), d.logits, d.bytes(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(loss.data(), d.row_loss, loss.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

// Every candidate on `rows` hostile rows of `vocab`, stored `shift` elements
// past an allocation's start; a failure is kept in the candidate.
template <class T>
void check_shape(std::vector<Candidate<T>>& cands, int64_t rows, int64_t vocab, int64_t shift, int grid,
                 std::mt19937_64& rng) {
  const lab::Rows r = lab::make_rows<T>(rows, vocab, rng, true);
  const lab::Reference ref = lab::reference(r);
  std::vector<T> logits(r.x.size());
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = lab::from_float<T>(r.x[i]);
  DeviceRows<T> d(rows, vocab, shift);
  d.set_targets(r.targets, float(lab::inv_count(r)));
  std::printf("check %s %lld x %lld, rows %lld elements past 16-byte alignment at row 0\n",
              sizeof(T) == 2 ? "bf16" : "f32", (long long)rows, (long long)vocab, (long long)shift);
  for (Candidate<T>& c : cands) {
    std::printf("  %-24s", c.name.c_str());
    std::fflush(stdout);  // the name is out before a launch that may fail
    if (!c.fits(vocab)) {
      std::printf(" skipped: %zu bytes of shared memory do not fit a block\n", c.smem(vocab));
      continue;
    }
    std::vector<T> g1, g2;
    std::vector<float> loss1, loss2;
    run_once(c, d, logits, grid, g1, loss1);
    run_once(c, d, logits, grid, g2, loss2);
    lab::CheckResult res = lab::compare(r, ref, g1, loss1);
    const bool same = std::memcmp(g1.data(), g2.data(), d.bytes()) == 0 &&
                      std::memcmp(loss1.data(), loss2.data(), loss1.size() * sizeof(float)) == 0;
    if (!same && res.failure.empty()) res.failure = "two runs differ";
    std::printf(" g err/bound %.3f (row %lld), %.2f ulp of %s; loss err/bound %.3f (row %lld)%s%s\n", res.g_ratio,
                (long long)res.g_row, res.g_ulps, sizeof(T) == 2 ? "bf16" : "f32", res.loss_ratio,
                (long long)res.loss_row, res.failure.empty() ? "" : "  FAILED: ", res.failure.c_str());
    if (!res.failure.empty() && c.failure.empty())
      c.failure = res.failure + " at V " + std::to_string(vocab) + ", shift " + std::to_string(shift);
  }
}

// ---- timing -------------------------------------------------------------------------

// Timing logits: triangular on [-6, 6] from a hash of the index (set-wide).
template <class T>
__global__ void fill_logits(T* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u1 = float(h & 0xffffff) / 16777216.f, u2 = float((h >> 32) & 0xffffff) / 16777216.f;
    x[i] = hg::gpu::from_f<T>(6.f * (u1 + u2 - 1.f));
  }
}

// FMAs on every SM, the pipes full (4 blocks of 256 threads a SM, two
// chains a thread: 64 warp FMAs an iteration at 4 a cycle), 40000
// iterations about 320 us at 1980 MHz: a GEMM's power draw. `out` keeps
// the compiler from dropping them.
__global__ void fma_burn(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 1e-7f, d = 0.5f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    d = fmaf(d, b, c);
  }
  if (a + d == 12345.f) *out = a;
}

// Microseconds of the row pass alone when `before` runs right before each
// call (on the next input set): events around each call, the calls of a
// sample summed, the median sample.
template <class Before, class Fn>
double us_after(const Options& o, int sets, int calls, Before&& before, Fn&& fn) {
  std::vector<cudaEvent_t> ev(2 * size_t(calls));
  for (cudaEvent_t& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  std::vector<double> samples;
  int next = 0;
  for (int s = 0; s < o.warmup + o.samples; ++s) {
    for (int c = 0; c < calls; ++c) {
      const int set = next++ % sets;
      before(set);
      CHECK_CUDA(cudaEventRecord(ev[2 * size_t(c)]));
      fn(set);
      CHECK_CUDA(cudaEventRecord(ev[2 * size_t(c) + 1]));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    double ms = 0;
    for (int c = 0; c < calls; ++c) {
      float one = 0;
      CHECK_CUDA(cudaEventElapsedTime(&one, ev[2 * size_t(c)], ev[2 * size_t(c) + 1]));
      ms += one;
    }
    if (s >= o.warmup) samples.push_back(ms);
  }
  for (cudaEvent_t e : ev) CHECK_CUDA(cudaEventDestroy(e));
  std::sort(samples.begin(), samples.end());
  return 1e3 * samples[samples.size() / 2] / calls;
}

// Microseconds a call: the median sample of `calls` calls, each call on the
// next input set.
template <class Fn>
double us_per_call(const Options& o, int sets, int calls, Fn&& fn) {
  int next = 0;
  const double ms = lab::median_ms(o.warmup, o.samples, 1, [&](int) {
    for (int c = 0; c < calls; ++c) fn(next++ % sets);
  });
  return 1e3 * ms / calls;
}

template <class T>
void time_shape(const std::vector<Candidate<T>>& cands, const Options& o, int64_t rows, int64_t vocab, int grid,
                const cudaDeviceProp& prop) {
  const size_t bytes = size_t(rows * vocab) * sizeof(T);
  // Enough sets that a rotation reads 4 L2s from memory.
  const int sets = int(std::max<size_t>(2, (4 * size_t(prop.l2CacheSize) + bytes - 1) / bytes));
  std::vector<std::unique_ptr<DeviceRows<T>>> in;
  for (int s = 0; s < sets; ++s) in.push_back(std::make_unique<DeviceRows<T>>(rows, vocab, 0));
  T *pristine = nullptr, *copy_dst = nullptr;
  float* burn = nullptr;  // fma_burn's never-written output
  CHECK_CUDA(cudaMalloc(&burn, sizeof(float)));
  CHECK_CUDA(cudaMalloc(&pristine, bytes));
  CHECK_CUDA(cudaMalloc(&copy_dst, bytes));
  fill_logits<T><<<prop.multiProcessorCount * 8, 512>>>(pristine, rows * vocab, o.seed);
  CHECK_CUDA(cudaGetLastError());
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> cls(0, vocab - 1);
  std::vector<float> targets(static_cast<size_t>(rows));
  for (float& t : targets) t = float(cls(rng));
  for (const auto& d : in) d->set_targets(targets, 1.f / float(rows));
  // Every variant starts from the same logits. A call overwrites its set
  // with g, and the next call on that set reads g as logits: finite values
  // of another spread, the same bytes and the same work.
  const auto reset = [&] {
    for (const auto& d : in) CHECK_CUDA(cudaMemcpy(d->logits, pristine, bytes, cudaMemcpyDeviceToDevice));
  };
  const auto memcpy_call = [&](int s) {
    CHECK_CUDA(cudaMemcpyAsync(copy_dst, in[size_t(s)]->logits, bytes, cudaMemcpyDeviceToDevice));
  };
  const auto kernel_call = [&](int s) {
    lab::copy_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4*>(in[size_t(s)]->logits),
                                                            reinterpret_cast<uint4*>(copy_dst), int64_t(bytes / 16));
  };
  reset();
  const int calls = int(std::max(1L, std::lround(1e3 / us_per_call(o, sets, 1, memcpy_call))));  // ~1 ms a sample
  const double memcpy_us = us_per_call(o, sets, calls, memcpy_call);
  const double kernel_us = us_per_call(o, sets, calls, kernel_call);
  const auto gbs = [&](double us) { return 2.0 * double(bytes) / (us * 1e3); };
  const double copy_gbs = std::max(gbs(memcpy_us), gbs(kernel_us));
  std::printf("\ntime %s %lld x %lld: %.1f MB read and written, %d input sets, %d calls a sample\n",
              sizeof(T) == 2 ? "bf16" : "f32", (long long)rows, (long long)vocab, bytes * 1e-6, sets, calls);
  std::printf("  %-24s %9s %8s %7s %9s\n", "variant", "blocks/SM", "us/call", "GB/s", "% of copy");
  std::printf("  %-24s %9s %8.1f %7.0f %8.1f%%\n", "cudaMemcpyAsync D2D", "", memcpy_us, gbs(memcpy_us),
              100.0 * gbs(memcpy_us) / copy_gbs);
  std::printf("  %-24s %9s %8.1f %7.0f %8.1f%%\n", "copy kernel (16-byte)", "", kernel_us, gbs(kernel_us),
              100.0 * gbs(kernel_us) / copy_gbs);
  double best_us = INFINITY;
  std::string best = "none";
  for (const Candidate<T>& c : cands) {
    if (!c.fits(vocab)) {
      std::printf("  %-24s skipped: %zu bytes of shared memory do not fit a block\n", c.name.c_str(), c.smem(vocab));
      continue;
    }
    for (const std::string& before : o.before) {
      reset();
      const auto row_pass = [&](int s) { c.launch(in[size_t(s)]->call(), grid); };
      const auto fresh = [&](int s) {  // write: fresh logits; fma: then the FMA burn
        fill_logits<T><<<prop.multiProcessorCount * 8, 512>>>(in[size_t(s)]->logits, rows * vocab, o.seed);
        if (before == "fma") fma_burn<<<prop.multiProcessorCount * 4, 256>>>(burn, 40000);
      };
      const double us =
          before == "none" ? us_per_call(o, sets, calls, row_pass) : us_after(o, sets, calls, fresh, row_pass);
      CHECK_CUDA(cudaGetLastError());
      const std::string name = before == o.before.front() ? c.name : c.name + ", " + before;
      std::printf("  %-24s %9d %8.1f %7.0f %8.1f%%%s\n", name.c_str(), c.blocks_per_sm(vocab), us, gbs(us),
                  100.0 * gbs(us) / copy_gbs, c.failure.empty() ? "" : "  FAILED its check");
      if (before == o.before.front() && c.failure.empty() && us < best_us) best_us = us, best = c.name;
    }
  }
  std::printf("  fastest that passed its checks: %s\n", best.c_str());
  CHECK_CUDA(cudaFree(pristine));
  CHECK_CUDA(cudaFree(copy_dst));
  CHECK_CUDA(cudaFree(burn));
}

template <class T>
bool run_dtype(const Options& o, const cudaDeviceProp& prop) {
  std::vector<Candidate<T>> cands = candidates<T>(o);
  const int sms = prop.multiProcessorCount, grid = o.grid > 0 ? o.grid : sms;
  std::mt19937_64 rng(o.seed);
  for (int64_t vocab : o.check_vocab)
    for (int64_t rows : {int64_t(9), o.check_rows > 0 ? o.check_rows : 4 * int64_t(sms) + 3})
      // Rows of 16-byte multiples all start where row 0 does: those run at
      // shift 0 and 3; other rows already start at every even offset.
      for (int64_t shift : {0, 3})
        if (shift == 0 || vocab * int64_t(sizeof(T)) % 16 == 0) check_shape(cands, rows, vocab, shift, grid, rng);
  bool ok = true;
  for (const Candidate<T>& c : cands) {
    if (!c.failure.empty()) std::printf("FAILED %s: %s\n", c.name.c_str(), c.failure.c_str());
    ok &= c.failure.empty();
  }
  if (!o.check_only)
    for (int64_t rows : o.rows)
      for (int64_t vocab : o.vocab) time_shape(cands, o, rows, vocab, grid, prop);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o = parse(argc, argv);
  if (o.seed == 0) o.seed = (uint64_t(std::random_device{}()) << 16) ^ std::random_device{}();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "classifier_lab: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("classifier_lab on %s (%d SMs, L2 %d MiB, %zu KiB shared memory a block at most), seed %llu\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10,
              (unsigned long long)o.seed);
  if (prop.major < 9) {
    std::fprintf(stderr, "classifier_lab: every variant stages rows by sm_90 bulk copies; this is sm_%d%d\n",
                 prop.major, prop.minor);
    return 1;
  }
  bool ok = true;
  for (const std::string& d : o.dtypes) ok &= d == "f32" ? run_dtype<float>(o, prop) : run_dtype<bf16>(o, prop);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED\n");
  return ok ? 0 : 1;
}

// Multi-tensor AdamW lab: the product's update kernel (chunk_adamw, from
// cuda/multi_tensor_adamw_kernel.cuh, the very code the library compiles)
// beside candidate shapes of it (bench/lab/adamw_lab_kernels.cuh), on the
// parameter set of a real model. Every candidate first runs on a small
// random parameter set (odd sizes, unaligned tensors, hostile gradients,
// clipping on and off, a skipped step) and is checked against a CPU float64
// AdamW; those that keep the product's math must also give its bits. Then
// each is timed on the model's parameters with CUDA events (median after
// warm-up) and reported as us per step, GB/s and % of the best device copy
// of the same bytes. The step's scalars are made on the device the product's
// way: chunk_sum_squares, then finish_step_scalars. bench/lab/adamw.md.
// Standalone: CUDA runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/lab/adamw_lab_kernels.cuh"
#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"

namespace {

using bf16 = __nv_bfloat16;
using lab::LoadPath;
using lab::Math;
using lab::StorePath;

// ---- the parameter set -------------------------------------------------------------

enum class Grad { Normal, Zero, Huge, Tiny, Mixed };

struct ParamSpec {
  std::string name;
  int64_t n;
  bool copy;           // has a bf16 compute copy (a Linear's weight or bias)
  int shift = 0;       // p, g, m, v start this many floats past a 16-byte boundary
  int copy_shift = 0;  // the copy starts this many bf16 past an 8-byte boundary
  Grad grad = Grad::Normal;
};

// DecoderLM (models/decoder_lm.cpp) in named_parameters order. The product's
// head is its own Linear with a bias (untied); `tied` drops it and gives the
// token table the compute copy the head's GEMM would read.
struct ModelShape {
  int64_t d, layers, seq, vocab;
  bool tied;
};

std::vector<ParamSpec> model_params(const ModelShape& s) {
  const int64_t d = s.d, f = 4 * s.d;
  std::vector<ParamSpec> out = {{"embed.token", s.vocab * d, s.tied}, {"embed.position", s.seq * d, false}};
  auto linear = [&](const std::string& name, int64_t in, int64_t outs) {
    out.push_back({name + ".weight", in * outs, true});
    out.push_back({name + ".bias", outs, true});
  };
  auto norm = [&](const std::string& name) {
    out.push_back({name + ".weight", d, false});
    out.push_back({name + ".bias", d, false});
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "layers." + std::to_string(l);
    norm(p + ".ln1");
    linear(p + ".attn.qkv", d, 3 * d);
    linear(p + ".attn.proj", d, d);
    norm(p + ".ln2");
    linear(p + ".ffn.fc1", d, f);
    linear(p + ".ffn.fc2", f, d);
  }
  norm("ln_f");
  if (!s.tied) linear("head", d, s.vocab);
  return out;
}

// The check set: sizes around every chunk length the candidates use, tensors
// off 16-byte boundaries (they take the element path), copies off 8-byte
// ones, and gradients that are zero, huge (1e30 with clipping; 1e18
// without, so that (1 - beta2) g^2 stays a finite float), tiny (1e-30) or
// a mixture of all of these.
std::vector<ParamSpec> check_params() {
  const int64_t sizes[] = {1, 3, 4, 5, 8, 17, 4097, 8191, 8192, 8193, 16385, 32767, 32769, 65539, 100003};
  std::vector<ParamSpec> out;
  int k = 0;
  for (int64_t n : sizes) {
    const Grad kinds[] = {Grad::Normal, Grad::Mixed, Grad::Zero, Grad::Huge, Grad::Tiny};
    ParamSpec p{"check." + std::to_string(k), n, k % 3 != 2};
    p.shift = k % 5 == 3 ? 1 : 0;
    p.copy_shift = k % 7 == 4 ? 1 : 0;
    p.grad = kinds[k % 5];
    out.push_back(p);
    ++k;
  }
  out.push_back({"check.aligned.big", 3 * 32768 + 8, true});  // all whole vectors, many chunks
  return out;
}

// Element offsets of each tensor in the pools: 256-byte starts (an
// allocator's), plus the tensor's shift. Between tensors a gap of at least
// 64 elements that the checks require untouched.
struct Layout {
  std::vector<int64_t> at, copy_at;
  int64_t elems = 0, copy_elems = 0;
};

Layout layout_of(const std::vector<ParamSpec>& ps) {
  Layout l;
  for (const ParamSpec& p : ps) {
    l.at.push_back(l.elems + p.shift);
    l.elems += (p.shift + p.n + 64 + 63) / 64 * 64;
    l.copy_at.push_back(p.copy ? l.copy_elems + p.copy_shift : -1);
    if (p.copy) l.copy_elems += (p.copy_shift + p.n + 128 + 127) / 128 * 128;
  }
  return l;
}

// One parameter set on the device: pools of p, g, m, v and the copies, the
// tensor table, and one chunk list per chunk length.
struct DeviceSet {
  std::vector<ParamSpec> specs;
  Layout layout;
  float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;
  bf16* copy = nullptr;
  lab::TensorRef* tensors = nullptr;
  std::map<int64_t, std::pair<lab::Chunk*, int>> chunks;  // chunk length -> (device list, count)
  double* partials = nullptr;                             // chunk_sum_squares' outputs (8192-element chunks)
  double* state = nullptr;                                // kAdamWStateSize doubles
  int64_t params = 0, copied = 0;

  double bytes_per_step() const { return 28.0 * double(params) + 2.0 * double(copied); }
  std::pair<lab::Chunk*, int> table(int64_t chunk) const { return chunks.at(chunk); }
};

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

DeviceSet make_set(std::vector<ParamSpec> specs) {
  DeviceSet s;
  s.specs = std::move(specs);
  s.layout = layout_of(s.specs);
  const size_t bytes = size_t(s.layout.elems) * sizeof(float);
  for (float** pool : {&s.p, &s.g, &s.m, &s.v}) CHECK_CUDA(cudaMalloc(pool, bytes));
  CHECK_CUDA(cudaMalloc(&s.copy, std::max<size_t>(1, size_t(s.layout.copy_elems)) * sizeof(bf16)));
  std::vector<lab::TensorRef> refs;
  for (size_t i = 0; i < s.specs.size(); ++i) {
    const ParamSpec& ps = s.specs[i];
    const int64_t at = s.layout.at[i];
    lab::TensorRef r{s.p + at, s.g + at, s.m + at, s.v + at, ps.copy ? s.copy + s.layout.copy_at[i] : nullptr, ps.n, 0};
    // The product's rule (adamw_multi): 16-byte p, g, m, v and an 8-byte copy.
    r.vec = aligned(r.p, 16) && aligned(r.g, 16) && aligned(r.m, 16) && aligned(r.v, 16) && aligned(r.copy, 8);
    refs.push_back(r);
    s.params += ps.n;
    s.copied += ps.copy ? ps.n : 0;
  }
  CHECK_CUDA(cudaMalloc(&s.tensors, refs.size() * sizeof(lab::TensorRef)));
  CHECK_CUDA(cudaMemcpy(s.tensors, refs.data(), refs.size() * sizeof(lab::TensorRef), cudaMemcpyHostToDevice));
  for (int64_t chunk : {int64_t(8192), int64_t(16384), int64_t(32768)}) {
    std::vector<lab::Chunk> list;  // as cuda/multi_tensor_adamw.cu's table_for, for this length
    for (size_t i = 0; i < refs.size(); ++i)
      for (int64_t start = 0; start < refs[i].n; start += chunk) list.push_back({int32_t(i), start});
    lab::Chunk* dev = nullptr;
    CHECK_CUDA(cudaMalloc(&dev, list.size() * sizeof(lab::Chunk)));
    CHECK_CUDA(cudaMemcpy(dev, list.data(), list.size() * sizeof(lab::Chunk), cudaMemcpyHostToDevice));
    s.chunks[chunk] = {dev, int(list.size())};
  }
  CHECK_CUDA(cudaMalloc(&s.partials, size_t(s.chunks[8192].second) * sizeof(double)));
  CHECK_CUDA(cudaMalloc(&s.state, hg::kAdamWStateSize * sizeof(double)));
  return s;
}

void free_set(DeviceSet& s) {
  for (void* ptr : {(void*)s.p, (void*)s.g, (void*)s.m, (void*)s.v, (void*)s.copy, (void*)s.tensors, (void*)s.partials,
                    (void*)s.state})
    CHECK_CUDA(cudaFree(ptr));
  for (auto& [chunk, list] : s.chunks) CHECK_CUDA(cudaFree(list.first));
}

struct Hyper {
  double lr = 6e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, max_norm = 1.0;
};

// The product's first two launches (launch_sum_squares): the chunk sums of
// squares, then the norm, clip scale, step count and bias corrections in the
// state. The step count starts at `prior_steps` and lr is written as
// AdamW::write_lr_to_device does.
void prepare_state(const DeviceSet& s, const Hyper& h, double prior_steps) {
  double host[hg::kAdamWStateSize] = {};
  host[hg::kAdamWStep] = prior_steps;
  host[hg::kAdamWLr] = h.lr;
  CHECK_CUDA(cudaMemcpy(s.state, host, sizeof host, cudaMemcpyHostToDevice));
  const auto [chunks, count] = s.table(hg::gpu::kChunk);
  hg::gpu::chunk_sum_squares<<<count, hg::gpu::kThreads>>>(s.tensors, chunks, s.partials);
  hg::gpu::finish_step_scalars<<<1, hg::gpu::kThreads>>>(s.partials, count, s.state, h.max_norm, h.beta1, h.beta2, 1);
  CHECK_CUDA(cudaGetLastError());
}

// ---- the candidates ----------------------------------------------------------------

struct Variant {
  const char* name;
  const char* what;
  bool product_bits;  // the product's math: must equal its bits
  void (*launch)(const DeviceSet&, const Hyper&);
};

void launch_production(const DeviceSet& s, const Hyper& h) {  // as adamw_multi launches it
  const auto [chunks, count] = s.table(hg::gpu::kChunk);
  hg::gpu::chunk_adamw<<<count, hg::gpu::kThreads>>>(s.tensors, chunks, s.state, float(h.beta1), float(h.beta2),
                                                     float(h.eps), float(h.weight_decay));
}

// Persistent: as many blocks as the GPU holds at once, each striding over
// the chunks; else one block per chunk.
template <class S, bool kPersistent>
void launch_candidate(const DeviceSet& s, const Hyper& h) {
  static int resident = 0;
  if (kPersistent && resident == 0) {
    int device = 0, sms = 0, per_sm = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lab::candidate_adamw<S>, S::kThreads, 0));
    resident = std::max(per_sm, 1) * sms;
  }
  const auto [chunks, count] = s.table(S::kChunk);
  const int grid = kPersistent ? std::min(count, resident) : count;
  lab::candidate_adamw<S><<<grid, S::kThreads>>>(s.tensors, chunks, count, s.state, float(h.beta1), float(h.beta2),
                                                 float(h.eps), float(h.weight_decay));
}

constexpr LoadPath kCs = LoadPath::Streaming;
constexpr StorePath kStcs = StorePath::Streaming;
constexpr Math kExact = Math::Exact;
constexpr Math kFolded = Math::Folded;
// Shape<threads, unroll, chunk, width, math, loads, stores, pipelined, pair copy, min blocks an SM>
using Product = lab::Shape<256, 2, 8192, 4, kExact, kCs, kStcs, false>;

const std::vector<Variant> kVariants = {
    {"production", "chunk_adamw as the library launches it", true, launch_production},
    {"template", "the lab template in the product's shape (256 threads, unroll 2, chunk 8192)", true,
     launch_candidate<Product, false>},
    {"unroll1", "one group of 4 in flight per thread", true,
     launch_candidate<lab::Shape<256, 1, 8192, 4, kExact, kCs, kStcs, false>, false>},
    {"unroll4", "four groups of 4 in flight per thread", true,
     launch_candidate<lab::Shape<256, 4, 8192, 4, kExact, kCs, kStcs, false>, false>},
    {"threads512", "512 threads a block", true,
     launch_candidate<lab::Shape<512, 2, 8192, 4, kExact, kCs, kStcs, false>, false>},
    {"chunk16k", "16384 elements a chunk", true,
     launch_candidate<lab::Shape<256, 2, 16384, 4, kExact, kCs, kStcs, false>, false>},
    {"chunk32k", "32768 elements a chunk", true,
     launch_candidate<lab::Shape<256, 2, 32768, 4, kExact, kCs, kStcs, false>, false>},
    {"persistent", "resident blocks only, each striding over the chunks", true, launch_candidate<Product, true>},
    {"noalloc", "loads ld.global.L1::no_allocate (grads .nc)", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, LoadPath::NoAllocate, kStcs, false>, false>},
    {"evict-first", "no_allocate loads with an L2 evict_first policy", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, LoadPath::EvictFirst, kStcs, false>, false>},
    {"prefetch256", "no_allocate loads with .L2::256B prefetch", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, LoadPath::Prefetch256, kStcs, false>, false>},
    {"plain-stores", "st.global instead of st.global.cs", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, kCs, StorePath::Plain, false>, false>},
    {"wide8", "8 consecutive elements a thread: two float4 each, one 16-byte bf16 store", true,
     launch_candidate<lab::Shape<256, 2, 8192, 8, kExact, kCs, kStcs, false>, false>},
    {"pair-copy", "lane pairs merge their bf16 copies into 16-byte stores", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, kCs, kStcs, false, true>, false>},
    {"pipelined", "the next group's loads issued before this group's math (unroll 1)", true,
     launch_candidate<lab::Shape<256, 1, 8192, 4, kExact, kCs, kStcs, true>, false>},
    {"pipelined2", "the next round's loads issued before this round's math (unroll 2)", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, kCs, kStcs, true>, false>},
    {"regs64", "at most 64 registers a thread: 4 blocks an SM where the product fits 3", true,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kExact, kCs, kStcs, false, false, 4>, false>},
    {"folded", "PyTorch's folded scalars: lr / bc1 and 1 / sqrt(bc2) once a step", false,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kFolded, kCs, kStcs, false>, false>},
    {"persistent+chunk32k", "persistent grid over 32768-element chunks", true,
     launch_candidate<lab::Shape<256, 2, 32768, 4, kExact, kCs, kStcs, false>, true>},
    {"persistent+folded", "persistent grid, folded scalars", false,
     launch_candidate<lab::Shape<256, 2, 8192, 4, kFolded, kCs, kStcs, false>, true>},
};

std::vector<std::string> variant_names() {
  std::vector<std::string> out;
  for (const Variant& v : kVariants) out.push_back(v.name);
  return out;
}

// ---- initial values --------------------------------------------------------------

// A reproducible value in [lo, hi) for element i of stream `seed` (a hash, so
// the model's 4 x 163M values are made on the device in milliseconds).
__host__ __device__ inline float hashed(uint64_t seed, int64_t i, float lo, float hi) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29;
  return lo + (hi - lo) * float(double(x >> 11) * 0x1.0p-53);
}

__global__ void fill_kernel(float* x, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = hashed(seed, i, lo, hi);
}

// The model set's values: weights and grads of GPT-2 scale, m and v of a
// run in progress (v >= 0); the gaps hold values too, which no kernel reads.
void fill_model_set(const DeviceSet& s) {
  const int64_t n = s.layout.elems;
  fill_kernel<<<1024, 256>>>(s.p, n, 1, -0.05f, 0.05f);
  fill_kernel<<<1024, 256>>>(s.g, n, 2, -1e-3f, 1e-3f);
  fill_kernel<<<1024, 256>>>(s.m, n, 3, -1e-4f, 1e-4f);
  fill_kernel<<<1024, 256>>>(s.v, n, 4, 0.0f, 1e-7f);
  CHECK_CUDA(cudaMemset(s.copy, 0, size_t(s.layout.copy_elems) * sizeof(bf16)));
  CHECK_CUDA(cudaGetLastError());
}

// ---- the check -----------------------------------------------------------------

struct HostSet {
  std::vector<float> p, g, m, v;
  std::vector<bf16> copy;
};

float gradient(Grad kind, bool clip, std::mt19937_64& gen) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const float huge = clip ? 1e30f : 1e18f, sign = u(gen) < 0 ? -1.f : 1.f;
  switch (kind) {
    case Grad::Normal: return 0.01f * u(gen);
    case Grad::Zero: return 0.f;
    case Grad::Huge: return sign * huge * (1 + std::abs(u(gen)));
    case Grad::Tiny: return sign * 1e-30f * (1 + std::abs(u(gen)));
    case Grad::Mixed: {
      const Grad pick[] = {Grad::Normal, Grad::Normal, Grad::Zero, Grad::Huge, Grad::Tiny};
      return gradient(pick[gen() % 5], clip, gen);
    }
  }
  return 0.f;
}

// Fresh values for the check set; the gaps hold a sentinel (checked after).
constexpr float kGapValue = -7.25f;
HostSet make_check_values(const DeviceSet& s, bool clip, bool poison_grad, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  HostSet h;
  const size_t n = size_t(s.layout.elems);
  h.p.assign(n, kGapValue), h.g.assign(n, kGapValue), h.m.assign(n, kGapValue), h.v.assign(n, kGapValue);
  h.copy.assign(size_t(s.layout.copy_elems), lab::from_float<bf16>(kGapValue));
  for (size_t t = 0; t < s.specs.size(); ++t)
    for (int64_t j = 0; j < s.specs[t].n; ++j) {
      const size_t i = size_t(s.layout.at[t] + j);
      h.p[i] = 0.05f * u(gen);
      h.g[i] = gradient(s.specs[t].grad, clip, gen);
      h.m[i] = 1e-3f * u(gen);
      h.v[i] = 1e-6f * std::abs(u(gen));
    }
  if (poison_grad) h.g[size_t(s.layout.at[1])] = NAN;  // a non-finite norm: the step is skipped
  return h;
}

void upload(const DeviceSet& s, const HostSet& h) {
  const size_t bytes = h.p.size() * sizeof(float);
  CHECK_CUDA(cudaMemcpy(s.p, h.p.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.g, h.g.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.m, h.m.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.v, h.v.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(s.copy, h.copy.data(), h.copy.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

HostSet download(const DeviceSet& s) {
  HostSet h;
  const size_t n = size_t(s.layout.elems);
  h.p.resize(n), h.m.resize(n), h.v.resize(n), h.copy.resize(size_t(s.layout.copy_elems));
  CHECK_CUDA(cudaMemcpy(h.p.data(), s.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h.m.data(), s.m, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h.v.data(), s.v, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h.copy.data(), s.copy, h.copy.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  return h;
}

// The worst of |got - ref| / bound over every p, m and v: <= 1 passes.
// The reference is float64 AdamW on the same float inputs (the float betas,
// eps, weight decay and lr the kernels use, the clip scale as the float they
// multiply by, the state's double bias corrections). Each kernel rounds at
// most 8 times on the way to p (fewer to m and v), every rounding within
// u = 2^-24 of its result, so with the magnitudes below:
//   m: 4u (b1 |m0| + (1 - b1) |g'|) + T          (g' = g clip)
//   v: 6u (b2 v0 + (1 - b2) g'^2) + T
//   p: 2u (|p0| + |p1|) + |d upd|, upd = lr (m / bc1) / denom, denom = sqrt(v / bc2) + eps,
//      |d upd| <= |upd| (8u + r) + lr / (bc1 denom) |dm|, where r bounds the relative
//      error of denom: 4u plus what v's error does to sqrt(v / bc2)
// (T = 2^-126: an underflow to zero, 1e-30 squared). The bound is twice that.
struct Reference {
  double clip, lr, bc1, bc2, b1, b2, eps, wd;
};

double worst_error(const DeviceSet& s, const HostSet& in, const HostSet& out, const Reference& r) {
  const double u = std::ldexp(1.0, -24), T = std::ldexp(1.0, -126);
  double worst = 0;
  for (size_t t = 0; t < s.specs.size(); ++t)
    for (int64_t j = 0; j < s.specs[t].n; ++j) {
      const size_t i = size_t(s.layout.at[t] + j);
      const double g = double(in.g[i]) * r.clip, p0 = in.p[i], m0 = in.m[i], v0 = in.v[i];
      const double p1 = p0 - r.lr * r.wd * p0;
      const double m = r.b1 * m0 + (1 - r.b1) * g, v = r.b2 * v0 + (1 - r.b2) * g * g;
      const double denom = std::sqrt(v / r.bc2) + r.eps, upd = r.lr * (m / r.bc1) / denom, p = p1 - upd;
      const double dm = 4 * u * (r.b1 * std::abs(m0) + (1 - r.b1) * std::abs(g)) + T;
      const double dv = 6 * u * (r.b2 * v0 + (1 - r.b2) * g * g) + T;
      const double d_sqrt = dv / (std::sqrt(v) + std::sqrt(std::max(v - dv, 0.0))) / std::sqrt(r.bc2);
      const double rel_denom = 4 * u + d_sqrt / denom;
      const double d_upd = std::abs(upd) * (8 * u + rel_denom * (1 + 2 * rel_denom)) + r.lr / (r.bc1 * denom) * dm;
      const double dp = 2 * u * (std::abs(p0) + std::abs(p1)) + d_upd;
      const double errs[] = {std::abs(out.m[i] - m) / (2 * dm), std::abs(out.v[i] - v) / (2 * dv),
                             std::abs(out.p[i] - p) / (2 * dp)};
      for (double e : errs) worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
  return worst;
}

// What every variant's output must satisfy besides the bound: the copy is the
// bf16 of the new p (nearest even; where `updated`: a skipped step leaves
// the copies alone), and nothing outside the tensors changed.
bool copies_and_gaps_ok(const DeviceSet& s, const HostSet& in, const HostSet& out, bool updated, std::string& why) {
  std::vector<char> inside(in.p.size(), 0), copy_inside(in.copy.size(), 0);
  for (size_t t = 0; t < s.specs.size(); ++t) {
    for (int64_t j = 0; j < s.specs[t].n; ++j) {
      const size_t i = size_t(s.layout.at[t] + j);
      inside[i] = 1;
      if (!s.specs[t].copy) continue;
      const size_t c = size_t(s.layout.copy_at[t] + j);
      copy_inside[c] = 1;
      if (!updated) continue;
      const bf16 want = lab::from_float<bf16>(out.p[i]);
      if (std::memcmp(&want, &out.copy[c], sizeof(bf16)) != 0) {
        why = s.specs[t].name + " copy[" + std::to_string(j) + "] is not the bf16 of p";
        return false;
      }
    }
  }
  for (size_t i = 0; i < inside.size(); ++i)
    if (!inside[i] && (std::memcmp(&in.p[i], &out.p[i], 4) || std::memcmp(&in.m[i], &out.m[i], 4) ||
                       std::memcmp(&in.v[i], &out.v[i], 4))) {
      why = "wrote outside the tensors (float element " + std::to_string(i) + ")";
      return false;
    }
  for (size_t i = 0; i < copy_inside.size(); ++i)
    if (!copy_inside[i] && std::memcmp(&in.copy[i], &out.copy[i], sizeof(bf16))) {
      why = "wrote outside the copies (bf16 element " + std::to_string(i) + ")";
      return false;
    }
  return true;
}

bool same_bits(const HostSet& a, const HostSet& b) {
  auto eq = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  return eq(a.p, b.p) && eq(a.m, b.m) && eq(a.v, b.v) && eq(a.copy, b.copy);
}

struct CheckCase {
  const char* name;
  bool clip, skip;
  double prior_steps;
};

struct CheckResult {
  double worst = 0;  // over the cases, in units of the bound
  bool pass = true;
};

// Every selected variant on every case; false if any fails (or the norm does).
bool run_checks(const std::vector<const Variant*>& variants, std::map<std::string, CheckResult>& results) {
  const CheckCase cases[] = {{"no clipping, step 1", false, false, 0},
                             {"clipping, step 10", true, false, 9},
                             {"non-finite norm: skipped", true, true, 4}};
  DeviceSet s = make_set(check_params());
  bool ok = true;
  uint64_t seed = 11;
  for (const CheckCase& c : cases) {
    Hyper h;
    h.max_norm = c.clip ? 1.0 : 0.0;
    const HostSet in = make_check_values(s, c.clip, c.skip, seed++);
    upload(s, in);
    prepare_state(s, h, c.prior_steps);
    double st[hg::kAdamWStateSize];
    CHECK_CUDA(cudaMemcpy(st, s.state, sizeof st, cudaMemcpyDeviceToHost));
    // The device norm against a float64 sum (clipping needs it right): both
    // sums of n positive terms are within n 2^-53 of the exact one.
    double sum = 0;
    for (size_t t = 0; t < s.specs.size(); ++t)
      for (int64_t j = 0; j < s.specs[t].n; ++j)
        sum += double(in.g[size_t(s.layout.at[t] + j)]) * in.g[size_t(s.layout.at[t] + j)];
    const double norm = std::sqrt(sum);
    const bool norm_ok = c.skip ? st[hg::kAdamWSkipped] == 1.0
                                : std::abs(st[hg::kAdamWGradNorm] - norm) <= double(s.params) * 0x1p-53 * norm &&
                                      st[hg::kAdamWSkipped] == 0;
    std::printf("check case '%s': norm %.6e (float64 %.6e), clip scale %.3e, step %g %s\n", c.name,
                st[hg::kAdamWGradNorm], norm, st[hg::kAdamWClipScale], st[hg::kAdamWStep], norm_ok ? "ok" : "FAILED");
    ok &= norm_ok;
    const Reference r{double(float(st[hg::kAdamWClipScale])),
                      double(float(h.lr)),
                      st[5],
                      st[6],
                      double(float(h.beta1)),
                      double(float(h.beta2)),
                      double(float(h.eps)),
                      double(float(h.weight_decay))};
    HostSet production;
    launch_production(s, h);
    CHECK_CUDA(cudaDeviceSynchronize());
    production = download(s);
    for (const Variant* v : variants) {
      upload(s, in);
      v->launch(s, h);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaDeviceSynchronize());
      const HostSet out = download(s);
      std::string why;
      bool pass = copies_and_gaps_ok(s, in, out, !c.skip, why);
      double e = 0;
      if (c.skip) {
        if (pass && !(same_bits(in, out))) pass = false, why = "a skipped step changed the parameters";
      } else {
        e = worst_error(s, in, out, r);
        if (pass && !(e <= 1.0)) pass = false, why = "error " + std::to_string(e) + " x the bound";
        if (pass && v->product_bits && !same_bits(out, production)) pass = false, why = "bits differ from production";
      }
      CheckResult& result = results[v->name];
      result.worst = std::max(result.worst, e);
      result.pass &= pass;
      if (!pass) std::printf("  %-22s FAILED: %s\n", v->name, why.c_str());
      ok &= pass;
    }
  }
  free_set(s);
  return ok;
}

// ---- timing ----------------------------------------------------------------------

struct Options {
  std::string model = "gpt2s";
  std::vector<std::string> variants = variant_names();
  int iters = 20, warmup = 3;
  bool check_only = false;
};

const std::map<std::string, ModelShape> kModels = {
    {"gpt2s",
     {768, 12, 1024, 50304, false}},  // bench_train --d-model 768 --heads 12 --layers 12 --seq-len 1024 --vocab 50304
    {"gpt2s-tied", {768, 12, 1024, 50304, true}},
    {"bench", {512, 6, 256, 256, false}},  // bench_train's default CUDA model
};

void print_help() {
  std::printf("adamw_lab: candidate multi-tensor AdamW update kernels, checked against float64 and timed.\n"
              "  --model gpt2s|gpt2s-tied|bench  parameter set timed (default gpt2s: the product's GPT-2 small,\n"
              "                              untied head with bias, 163.2M parameters; gpt2s-tied: the head\n"
              "                              tied to the token table, 124.5M; bench: bench_train's CUDA model)\n"
              "  --variants a,b,...          candidates (default all; bench/lab/adamw.md):\n");
  for (const Variant& v : kVariants) std::printf("      %-22s %s\n", v.name, v.what);
  std::printf("  --iters N                   timed samples each (default 20); --warmup N (default 3)\n"
              "  --check-only                the checks, no timing\n"
              "  --help                      this text\n"
              "Exit status: 0 all checks passed, 1 a check failed or a CUDA error, 2 bad flags.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  lab::Flags f("adamw_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--model")) {
      const std::vector<std::string> model = f.choices({"gpt2s", "gpt2s-tied", "bench"});
      if (model.size() != 1) f.fail("--model takes one name");
      o.model = model[0];
    } else if (f.is("--variants")) {
      o.variants = f.choices(variant_names());
    } else if (f.is("--iters")) {
      o.iters = int(f.number(1, 100000));
    } else if (f.is("--warmup")) {
      o.warmup = int(f.number(0, 100000));
    } else if (f.is("--check-only")) {
      o.check_only = true;
    } else {
      f.unknown();
    }
  }
  return o;
}

void print_rate(const char* label, double ms, double bytes, double copy_ms_per_byte) {
  std::printf("  %-22s %9.1f us %7.0f GB/s %5.1f%% of copy", label, ms * 1e3, bytes / ms / 1e6,
              100 * copy_ms_per_byte * bytes / ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is measured, also into a file
  const Options o = parse(argc, argv);
  std::vector<const Variant*> variants;
  for (const std::string& name : o.variants)
    for (const Variant& v : kVariants)
      if (name == v.name) variants.push_back(&v);
  int device = 0, l2 = 0;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  std::printf("adamw_lab on %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, l2 >> 20);

  std::map<std::string, CheckResult> checked;
  const bool ok = run_checks(variants, checked);
  std::printf(ok ? "checks passed (%zu variants x 3 cases)\n" : "CHECK FAILED (%zu variants x 3 cases)\n",
              variants.size());
  if (o.check_only) return ok ? 0 : 1;

  DeviceSet s = make_set(model_params(kModels.at(o.model)));
  fill_model_set(s);
  const Hyper h;
  prepare_state(s, h, 0);
  CHECK_CUDA(cudaDeviceSynchronize());
  const double bytes = s.bytes_per_step();
  // The set is read and written once a step, ~4.8 GB against an L2 of tens of
  // MB: every sample comes from memory with no rotation of sets.
  std::printf("model %s: %zu tensors, %.1fM parameters (%.1fM with a bf16 copy), %.3f GB a step "
              "(28 B a parameter + 2 B a copy)\n",
              o.model.c_str(), s.specs.size(), s.params / 1e6, s.copied / 1e6, bytes / 1e9);

  // The copy yardstick: the same bytes moved, half read and half written.
  const size_t half = size_t(bytes / 2) / 16 * 16;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, half));
  CHECK_CUDA(cudaMalloc(&dst, half));
  CHECK_CUDA(cudaMemset(src, 1, half));
  const double memcpy_ms = lab::median_ms(
      o.warmup, o.iters, 1, [&](int) { CHECK_CUDA(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice)); });
  const double kernel_ms = lab::median_ms(o.warmup, o.iters, 1, [&](int) {
    lab::copy_kernel<<<1024, 512>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), int64_t(half / 16));
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  const double copy_ms = std::min(memcpy_ms, kernel_ms), copy_ms_per_byte = copy_ms / (2.0 * double(half));
  std::printf("copy of the same bytes: cudaMemcpyAsync %.1f us (%.0f GB/s), copy kernel %.1f us (%.0f GB/s)\n",
              memcpy_ms * 1e3, 2.0 * half / memcpy_ms / 1e6, kernel_ms * 1e3, 2.0 * half / kernel_ms / 1e6);

  std::printf("update (one step; * = production; err: worst over the check cases, in units of the bound):\n");
  const Variant* best = nullptr;
  double best_ms = 0, production_ms = 0;
  for (const Variant* v : variants) {
    const double ms = lab::median_ms(o.warmup, o.iters, 1, [&](int) { v->launch(s, h); });
    const CheckResult& c = checked[v->name];
    print_rate(v->name, ms, bytes, copy_ms_per_byte);
    std::printf("  err %.3f %s%s%s\n", c.worst, c.pass ? "ok" : "FAILED", v->product_bits ? ", bits = production" : "",
                std::strcmp(v->name, "production") == 0 ? "  *" : "");
    if (std::strcmp(v->name, "production") == 0) production_ms = ms;
    if (c.pass && (best == nullptr || ms < best_ms)) best = v, best_ms = ms;
  }
  if (best != nullptr) {
    std::printf("winner: %s (%.1f us", best->name, best_ms * 1e3);
    if (production_ms > 0)
      std::printf(", %.1f us = %.1f%% under production", (production_ms - best_ms) * 1e3,
                  100 * (production_ms - best_ms) / production_ms);
    std::printf(")%s\n", best->product_bits ? "" : "; it changes the bits (bench/lab/adamw.md, \"Promoting\")");
  }

  // The product's other two launches of the step, for their share.
  const std::pair<lab::Chunk*, int> table = s.table(hg::gpu::kChunk);
  lab::Chunk* const chunks = table.first;
  const int count = table.second;
  const double sum_ms = lab::median_ms(o.warmup, o.iters, 1, [&](int) {
    hg::gpu::chunk_sum_squares<<<count, hg::gpu::kThreads>>>(s.tensors, chunks, s.partials);
  });
  const double finish_ms = lab::median_ms(o.warmup, o.iters, 1, [&](int) {
    hg::gpu::finish_step_scalars<<<1, hg::gpu::kThreads>>>(s.partials, count, s.state, h.max_norm, h.beta1, h.beta2, 1);
  });
  std::printf("the step's other launches:\n");
  print_rate("chunk_sum_squares", sum_ms, 4.0 * double(s.params), copy_ms_per_byte);
  std::printf("  (reads the grads, 4 B a parameter)\n");
  std::printf("  %-22s %9.1f us (one block adds %d chunk sums)\n", "finish_step_scalars", finish_ms * 1e3, count);
  free_set(s);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a variant broke its bound or the product's bits\n");
  return ok ? 0 : 1;
}

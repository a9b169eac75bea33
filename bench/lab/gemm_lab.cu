// GEMM algorithm lab: does timing cuBLASLt's candidate algorithms once per
// shape, instead of taking the heuristic's first (cuda/gemm_lt.cu), bring
// every Linear form and epilogue of the training step within 5% of the plain
// GEMM of its shape, and how much faster do the plain GEMMs get?
//
// For each GEMM of the GPT-2 small step (B 8 and 32, T 1024) and of the bench
// model (gemm_lab_cases.cuh), with gemm_lt's descriptors, it asks the
// heuristic for up to N algorithms under gemm_lt's preference ("lt") and
// under changed ones (bigger workspace, no split-K, any reduction scheme),
// runs every algorithm once on exact check data (float64 reference on sampled
// outputs; every element against the first algorithm's result), times each
// (median, CUDA events, input sets rotated past the L2) and prints TFLOP/s of
// lt#1 (what production runs) and of the fastest passing candidate, and each
// epilogue form against the plain GEMM of the same shape. Standalone: CUDA
// runtime and cuBLASLt only (bench/lab/gemm.md).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/lab/gemm_lab_cases.cuh"
#include "bench/lab/gemm_lab_check.cuh"
#include "bench/lab/gemm_lab_lt.cuh"
#include "bench/lab/gemm_lab_report.cuh"
#include "bench/lab/lab_flags.hpp"
#include "bench/lab/lab_util.cuh"

namespace {

using namespace gemm_lab;

struct Options {
  bool gpt2s = true, bench = true, quick = false, verbose = false;
  int iters = 20, warmup = 3, count = 16;
  int search = 0;  // configurations screened beyond the heuristic's (0: none)
  bool iters_given = false;
  double peak = 989;  // dense bf16 TFLOP/s of an H100 / H200 SXM
  std::vector<int> knobs;
};

// What the whole run shares.
struct Lab {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // kMaxWorkspace; each call is given its knob's size
  int l2 = 0;
  int64_t* at = nullptr;  // sample indices and gathered values (kMaxSamples)
  float* gathered = nullptr;
  unsigned long long* bad = nullptr;
};
constexpr int kMaxSamples = 64;

// ---- buffers ---------------------------------------------------------------------

size_t out_bytes(const Case& c) { return size_t(c.m * c.n) * (c.f32_out ? 4 : 2); }
size_t vec_bytes(const Case& c) { return size_t(vec_len(c)) * (vec_f32(c.epi) ? 4 : 2); }
size_t set_bytes(const Case& c) {
  return size_t(c.m * c.k + c.k * c.n) * 2 + out_bytes(c) + (has_aux(c.epi) ? size_t(c.m * c.n) * 2 : 0);
}

Set alloc_set(const Case& c) {
  Set s;
  CHECK_CUDA(cudaMalloc(&s.a, size_t(c.m * c.k) * 2));
  CHECK_CUDA(cudaMalloc(&s.b, size_t(c.k * c.n) * 2));
  CHECK_CUDA(cudaMalloc(&s.out, out_bytes(c)));
  if (has_aux(c.epi)) CHECK_CUDA(cudaMalloc(&s.aux, size_t(c.m * c.n) * 2));
  if (has_vec(c.epi)) CHECK_CUDA(cudaMalloc(&s.vec, vec_bytes(c)));
  return s;
}

void free_set(Set& s) {
  for (void* p : {s.a, s.b, s.out, s.aux, s.vec})
    if (p) CHECK_CUDA(cudaFree(p));
  s = Set{};
}

// The inputs of variant v (0: check data), and the dW a weight gradient accumulates into.
void fill_inputs(const Case& c, const Set& s, int variant) {
  fill(static_cast<bf16*>(s.a), c.m * c.k, kFillA, variant);
  fill(static_cast<bf16*>(s.b), c.k * c.n, kFillB, variant);
  if (c.epi == Epi::Bias || c.epi == Epi::BiasGelu) fill(static_cast<bf16*>(s.vec), c.n, kFillBias, variant);
  if (c.epi == Epi::DGeluBGrad || c.epi == Epi::DGelu) fill(static_cast<bf16*>(s.aux), c.m * c.n, kFillAux, variant);
  if (c.accumulate()) fill(static_cast<float*>(s.out), c.m * c.n, kFillC, variant);
}

// Before a checked run: the accumulated dW back to its check values, every
// written buffer NaN (0xff bytes), so that an element left unwritten fails.
void reset_outputs(const Case& c, const Set& s) {
  if (c.accumulate()) fill(static_cast<float*>(s.out), c.m * c.n, kFillC, 0);
  else CHECK_CUDA(cudaMemset(s.out, 0xff, out_bytes(c)));
  if (c.epi == Epi::BiasGelu) CHECK_CUDA(cudaMemset(s.aux, 0xff, size_t(c.m * c.n) * 2));
  if (vec_is_output(c.epi)) CHECK_CUDA(cudaMemset(s.vec, 0xff, vec_bytes(c)));
}

// ---- checks ----------------------------------------------------------------------

// The sampled outputs and their float64 expectations.
struct Samples {
  std::vector<int64_t> out_at;  // m * N + n
  std::vector<Expect> out;
  std::vector<int64_t> vec_at;
  std::vector<double> vec_ref, vec_bound;
  double out_scale = 0, aux_scale = 0;  // mean |expected| (the agreement check's scale)
};

// The four corners (edge tiles) and random elements; for the bias gradient
// both ends and random entries (DGELU_BGRAD's entries cost M x K each: 4).
Samples make_samples(const Case& c) {
  Samples s;
  std::mt19937_64 gen(uint64_t(c.m * 1000003 + c.n * 1009 + c.k));
  auto pick = [&](int64_t n) { return int64_t(gen() % uint64_t(n)); };
  const int64_t corners[4][2] = {{0, 0}, {0, c.n - 1}, {c.m - 1, 0}, {c.m - 1, c.n - 1}};
  for (const auto& mn : corners) s.out_at.push_back(mn[0] * c.n + mn[1]);
  while (s.out_at.size() < 48) s.out_at.push_back(pick(c.m) * c.n + pick(c.n));
  for (int64_t at : s.out_at) {
    s.out.push_back(reference(c, at / c.n, at % c.n));
    s.out_scale += std::abs(s.out.back().out) / double(s.out_at.size());
    s.aux_scale += std::abs(s.out.back().aux) / double(s.out_at.size());
  }
  if (vec_is_output(c.epi)) {
    const int64_t len = vec_len(c);
    const size_t want = c.epi == Epi::BGradB ? 16 : 4;
    s.vec_at = {0, len - 1};
    while (s.vec_at.size() < want) s.vec_at.push_back(pick(len));
    reference_vec(c, s.vec_at, s.vec_ref, s.vec_bound);
  }
  return s;
}

std::vector<float> gather(const Lab& lab, const void* src, bool f32, const std::vector<int64_t>& at) {
  const int n = int(at.size());
  CHECK_CUDA(cudaMemcpy(lab.at, at.data(), size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice));
  if (f32) gather_kernel<<<1, kMaxSamples>>>(static_cast<const float*>(src), lab.at, n, lab.gathered);
  else gather_kernel<<<1, kMaxSamples>>>(static_cast<const bf16*>(src), lab.at, n, lab.gathered);
  CHECK_CUDA(cudaGetLastError());
  std::vector<float> out(static_cast<size_t>(n));
  CHECK_CUDA(cudaMemcpy(out.data(), lab.gathered, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

// |got - expected| / bound: <= 1 passes; NaN or a zero bound missed is infinite.
double ratio(double got, double expected, double bound) {
  const double err = std::abs(got - expected);
  if (!(err <= bound)) return std::isnan(err) || bound == 0 ? INFINITY : err / bound;
  return bound == 0 ? 0 : err / bound;
}

// The worst ratio over the sampled outputs, the GELU pre-activation and the bias gradient.
double sampled_error(const Lab& lab, const Case& c, const Set& s, const Samples& smp) {
  double worst = 0;
  const std::vector<float> out = gather(lab, s.out, c.f32_out, smp.out_at);
  for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, ratio(out[i], smp.out[i].out, smp.out[i].out_bound));
  if (c.epi == Epi::BiasGelu) {
    const std::vector<float> aux = gather(lab, s.aux, false, smp.out_at);
    for (size_t i = 0; i < aux.size(); ++i)
      worst = std::max(worst, ratio(aux[i], smp.out[i].aux, smp.out[i].aux_bound));
  }
  if (vec_is_output(c.epi)) {
    const std::vector<float> vec = gather(lab, s.vec, vec_f32(c.epi), smp.vec_at);
    for (size_t i = 0; i < vec.size(); ++i) worst = std::max(worst, ratio(vec[i], smp.vec_ref[i], smp.vec_bound[i]));
  }
  return worst;
}

template <class T>
uint64_t count_disagree(const Lab& lab, const void* got, const void* ref, int64_t n, double scale) {
  CHECK_CUDA(cudaMemset(lab.bad, 0, sizeof *lab.bad));
  disagree_kernel<<<1024, 256>>>(static_cast<const T*>(got), static_cast<const T*>(ref), n, float(scale), lab.bad);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long bad = 0;
  CHECK_CUDA(cudaMemcpy(&bad, lab.bad, sizeof bad, cudaMemcpyDeviceToHost));
  return bad;
}

std::vector<float> read_vec(const Case& c, const Set& s) {
  std::vector<float> v(static_cast<size_t>(vec_len(c)));
  if (vec_f32(c.epi)) {
    CHECK_CUDA(cudaMemcpy(v.data(), s.vec, vec_bytes(c), cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<bf16> h(v.size());
  CHECK_CUDA(cudaMemcpy(h.data(), s.vec, vec_bytes(c), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < v.size(); ++i) v[i] = __bfloat162float(h[i]);
  return v;
}

// The first algorithm that ran: its outputs, which every other one must agree with.
struct FirstResult {
  void* out = nullptr;
  void* aux = nullptr;
  std::vector<float> vec;
  double vec_scale = 0;
};

void keep_first(const Case& c, const Set& s, FirstResult& first) {
  CHECK_CUDA(cudaMalloc(&first.out, out_bytes(c)));
  CHECK_CUDA(cudaMemcpy(first.out, s.out, out_bytes(c), cudaMemcpyDeviceToDevice));
  if (c.epi == Epi::BiasGelu) {
    CHECK_CUDA(cudaMalloc(&first.aux, size_t(c.m * c.n) * 2));
    CHECK_CUDA(cudaMemcpy(first.aux, s.aux, size_t(c.m * c.n) * 2, cudaMemcpyDeviceToDevice));
  }
  if (vec_is_output(c.epi)) {
    first.vec = read_vec(c, s);
    for (float v : first.vec) first.vec_scale += std::abs(v) / double(first.vec.size());
  }
}

uint64_t disagreements(const Lab& lab, const Case& c, const Set& s, const Samples& smp, const FirstResult& first) {
  const int64_t n = c.m * c.n;
  uint64_t bad = c.f32_out ? count_disagree<float>(lab, s.out, first.out, n, smp.out_scale)
                           : count_disagree<bf16>(lab, s.out, first.out, n, smp.out_scale);
  if (c.epi == Epi::BiasGelu) bad += count_disagree<bf16>(lab, s.aux, first.aux, n, smp.aux_scale);
  if (vec_is_output(c.epi)) {
    const std::vector<float> v = read_vec(c, s);
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = v[i], y = first.vec[i];
      bad += !(std::abs(x - y) <= kAgree * (std::abs(x) + std::abs(y) + first.vec_scale));
    }
  }
  return bad;
}

// Runs every candidate once on the check data of set s.
void check_all(const Lab& lab, const Case& c, const Plan& plan, std::vector<Candidate>& cands, const Set& s) {
  const Samples smp = make_samples(c);
  FirstResult first;
  bool have_first = false;
  for (Candidate& cand : cands) {
    reset_outputs(c, s);
    if (run(lab.handle, plan, c, cand, s, lab.workspace) != CUBLAS_STATUS_SUCCESS) continue;  // not runnable here
    CHECK_CUDA(cudaDeviceSynchronize());
    cand.ran = true;
    cand.worst = sampled_error(lab, c, s, smp);
    if (!have_first) {
      keep_first(c, s, first);
      have_first = true;
    } else {
      cand.disagree = disagreements(lab, c, s, smp, first);
    }
    cand.checked_ok = cand.worst <= 1 && cand.disagree == 0;
  }
  for (void* p : {first.out, first.aux})
    if (p) CHECK_CUDA(cudaFree(p));
}

// ---- timing ----------------------------------------------------------------------

// Median ms of one call; calls of a small GEMM are grouped so that a sample
// lasts tens of microseconds, each call on the next input set. 0 when a call fails.
double time_one(const Lab& lab, const Case& c, const Plan& plan, const Candidate& cand, const std::vector<Set>& sets,
                int warmup, int iters) {
  const int reps = int(std::clamp(std::ceil(3e10 / c.flops()), 1.0, 16.0));
  size_t turn = 0;
  bool failed = false;
  const double ms = lab::median_ms(warmup, iters, 1, [&](int) {
    for (int r = 0; r < reps; ++r)
      failed |= run(lab.handle, plan, c, cand, sets[turn++ % sets.size()], lab.workspace) != CUBLAS_STATUS_SUCCESS;
  });
  return failed ? 0 : ms / reps;
}

void time_all(const Lab& lab, const Options& o, const Case& c, const Plan& plan, std::vector<Candidate>& cands,
              const std::vector<Set>& sets) {
  for (Candidate& cand : cands) {
    if (!cand.ran) continue;
    cand.ms = time_one(lab, c, plan, cand, sets, o.warmup, o.iters);
    if (cand.ms == 0) {
      std::fprintf(stderr, "gemm_lab: %s ran once, then failed\n", cand.label.c_str());
      std::exit(1);
    }
  }
}

// --search: every configuration cuBLASLt accepts (enumerate_configs), at
// most o.search of them (evenly spaced in the enumeration) timed briefly;
// the o.count fastest join the candidates, to be checked and timed as they are.
void add_searched(const Lab& lab, const Options& o, const Case& c, const Plan& plan, std::vector<Candidate>& cands,
                  const std::vector<Set>& sets) {
  std::vector<Candidate> found;
  for (const Candidate& f : enumerate_configs(lab.handle, plan, c)) {
    bool seen = false;
    for (const Candidate& known : cands) seen |= std::memcmp(&known.algo, &f.algo, sizeof f.algo) == 0;
    if (!seen) found.push_back(f);
  }
  const size_t total = found.size(), screened = std::min(total, size_t(o.search));
  std::vector<Candidate> timed;
  for (size_t i = 0; i < screened; ++i) {
    Candidate cand = found[i * total / screened];
    cand.ms = time_one(lab, c, plan, cand, sets, 1, 3);
    if (cand.ms > 0) timed.push_back(cand);
  }
  std::sort(timed.begin(), timed.end(), [](const Candidate& a, const Candidate& b) { return a.ms < b.ms; });
  if (timed.size() > size_t(o.count)) timed.resize(size_t(o.count));
  for (size_t i = 0; i < timed.size(); ++i) {
    timed[i].label = "search#" + std::to_string(i + 1);
    timed[i].rank = int(i) + 1;
    timed[i].ms = 0;
    cands.push_back(timed[i]);
  }
  if (o.verbose)
    std::printf("    search: %zu configurations accepted, %zu screened, %zu kept\n", total, screened, timed.size());
}

// ---- one case --------------------------------------------------------------------

// The candidates of one case: offered (and searched) on timing data, run on
// the check data, then timed; one line per candidate with --verbose.
Result measure(const Lab& lab, const Options& o, const Case& c) {
  const int nsets = int(std::clamp<int64_t>(2 * int64_t(lab.l2) / int64_t(set_bytes(c)) + 1, 1, 16));
  std::vector<Set> sets;
  for (int i = 0; i < nsets; ++i) sets.push_back(alloc_set(c));
  Plan plan = make_plan(c);
  for (int i = 0; i < nsets; ++i) fill_inputs(c, sets[size_t(i)], i + 1);
  set_pointers(plan, c, sets[0]);
  std::vector<Candidate> cands = candidates(lab.handle, plan, c, o.knobs, o.count);
  if (o.search > 0) add_searched(lab, o, c, plan, cands, sets);
  fill_inputs(c, sets[0], 0);  // the check data, then the timing data again
  check_all(lab, c, plan, cands, sets[0]);
  fill_inputs(c, sets[0], 1);
  time_all(lab, o, c, plan, cands, sets);
  const Result r = summarize(cands);
  for (const Candidate& cand : cands) print_candidate(o.verbose, c, cand, r);
  destroy(plan);
  for (Set& s : sets) free_set(s);
  return r;
}

// ---- flags -----------------------------------------------------------------------

void print_help() {
  std::printf("gemm_lab: cuBLASLt's candidate algorithms for the training step's GEMMs, checked and timed.\n"
              "  --shapes gpt2s|bench|all  GPT-2 small (B 8 and 32, T 1024), the bench model, or both (default all)\n"
              "  --quick                   without GPT-2 small's B 32; 10 timed samples unless --iters\n"
              "  --iters N                 timed samples per candidate (default 20); --warmup N (default 3)\n"
              "  --candidates N            algorithms asked of the heuristic per preference, 1..64 (default 16)\n"
              "  --knobs LIST              preferences to ask under (lt always; default all): ");
  for (int k = 0; k < kKnobCount; ++k) std::printf("%s%s", k ? "," : "", kKnobs[k].name);
  std::printf("\n");
  for (int k = 0; k < kKnobCount; ++k)
    std::printf("                              %-8s %s\n", kKnobs[k].name, kKnobs[k].what);
  std::printf(
      "  --search N                also screen up to N configurations enumerated from cuBLASLt's algorithm\n"
      "                            ids, tiles, stages, cluster shapes and swizzles (no split-K), 3 samples each;\n"
      "                            the --candidates fastest are checked and timed as 'search#i' (default 0: off)\n"
      "  --peak TFLOPS             dense bf16 peak for the %% columns (default 989: H100 / H200 SXM)\n"
      "  --verbose                 one line per candidate (+ fastest, * lt#1)\n"
      "  --help                    this text\n"
      "Exit status: 0 all checks passed, 1 a candidate gemm_lt may run failed a check or a CUDA error, 2 bad "
      "flags.\n");
}

std::vector<int> parse_knobs(const lab::Flags& f, const std::string& list) {
  std::vector<int> out;
  for (const std::string& item : lab::split(list)) {
    int found = -1;
    for (int k = 0; k < kKnobCount; ++k)
      if (item == kKnobs[k].name) found = k;
    if (found < 0) f.fail("--knobs: unknown preference '" + item + "' (allowed: lt, ws64, ws128, nosplit, anyred)");
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
  }
  if (std::find(out.begin(), out.end(), 0) == out.end()) out.insert(out.begin(), 0);  // lt#1 is the yardstick
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int k = 0; k < kKnobCount; ++k) o.knobs.push_back(k);
  lab::Flags f("gemm_lab", argc, argv);
  while (f.next()) {
    if (f.is("--help") || f.is("-h")) {
      print_help();
      std::exit(0);
    } else if (f.is("--shapes")) {
      const std::string v = f.value();
      if (v != "gpt2s" && v != "bench" && v != "all")
        f.fail("--shapes: unknown value '" + v + "' (allowed: gpt2s, bench, all)");
      o.gpt2s = v != "bench";
      o.bench = v != "gpt2s";
    } else if (f.is("--quick")) {
      o.quick = true;
    } else if (f.is("--iters")) {
      o.iters = int(f.number(1, 100000));
      o.iters_given = true;
    } else if (f.is("--warmup")) {
      o.warmup = int(f.number(0, 100000));
    } else if (f.is("--candidates")) {
      o.count = int(f.number(1, 64));
    } else if (f.is("--search")) {
      o.search = int(f.number(0, 1000000));
    } else if (f.is("--knobs")) {
      o.knobs = parse_knobs(f, f.value());
    } else if (f.is("--peak")) {
      o.peak = double(f.number(1, 100000));
    } else if (f.is("--verbose")) {
      o.verbose = true;
    } else {
      f.unknown();
    }
  }
  if (o.quick && !o.iters_given) o.iters = 10;
  return o;
}

Lab open_lab() {
  Lab lab;
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&lab.l2, cudaDevAttrL2CacheSize, device));
  CHECK_CUBLAS(cublasLtCreate(&lab.handle));
  CHECK_CUDA(cudaMalloc(&lab.workspace, kMaxWorkspace));
  CHECK_CUDA(cudaMalloc(&lab.at, kMaxSamples * sizeof(int64_t)));
  CHECK_CUDA(cudaMalloc(&lab.gathered, kMaxSamples * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&lab.bad, sizeof *lab.bad));
  return lab;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is measured, also into a file
  const Options o = parse(argc, argv);
  const Lab lab = open_lab();
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("gemm_lab on %s (sm_%d%d, L2 %d MiB), cuBLASLt %zu; up to %d algorithms per preference (%zu "
              "preferences), %d timed samples\n",
              prop.name, prop.major, prop.minor, lab.l2 >> 20, cublasLtGetVersion(), o.count, o.knobs.size(), o.iters);
  std::vector<Case> cases;
  for (const Model& md : models(o.gpt2s, o.bench, o.quick)) add_model(cases, md);
  print_header(o.peak);
  std::vector<Result> results(cases.size());
  std::map<std::string, size_t> first_of;  // a shape measured once, reused by equal cases
  bool ok = true;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const auto seen = first_of.find(c.key());
    const bool again = seen != first_of.end();
    results[i] = again ? results[seen->second] : measure(lab, o, c);
    if (!again) first_of[c.key()] = i;
    ok &= results[i].failed == 0;
    Case plain_case = c;
    plain_case.epi = Epi::None;
    const Result* plain = c.epi != Epi::None ? &results[first_of.at(plain_case.key())] : nullptr;
    print_case(o.peak, c, results[i], plain, again ? " (measured above)" : "");
  }
  print_summary(cases, results, first_of);
  std::printf(ok ? "all checks passed\n" : "CHECK FAILED: a candidate gemm_lt may run exceeded its bound\n");
  return ok ? 0 : 1;
}

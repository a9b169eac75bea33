// GemmAlgorithms::Measured: the heuristic's candidates timed on the call's
// own operands, the fastest kept (docs/gemm.md, "Algorithm choice").
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "core/cuda_runtime.hpp"
#include "core/gemm_algorithm_file.hpp"
#include "core/gemm_algorithms.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_lt_plan.hpp"

namespace hg::gpu::gemm_lt_detail {
namespace {

std::string describe(const Call& c) {
  std::string s = std::string(dtype_name(c.a.dtype())) + " " + std::to_string(c.s.m) + "x" + std::to_string(c.s.n) +
                  "x" + std::to_string(c.s.k);
  if (c.s.batch > 1) s += " batch " + std::to_string(c.s.batch);
  s += c.args.transpose_a ? " a^T" : " a";
  s += c.args.transpose_b ? " b^T" : " b";
  s += std::string(" -> ") + dtype_name(c.out.dtype()) + ", " + gemm_epilogue_name(c.args.epilogue);
  if (c.args.accumulate) s += ", accumulate";
  s += ", aligned " + std::to_string(alignment_of(c.a.raw_data())) + "/" +
       std::to_string(alignment_of(c.b.raw_data())) + "/" + std::to_string(alignment_of(c.out.raw_data()));
  if (c.vec) s += "/" + std::to_string(alignment_of(c.vec->raw_data()));
  if (c.args.aux) s += "/" + std::to_string(alignment_of(c.args.aux->raw_data()));
  return s;
}

// The configuration cuBLASLt reports for an algorithm (enum values of cublasLt.h).
std::string describe(const cublasLtMatmulAlgo_t& algo) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    size_t bytes = 0;  // each attribute has its own width (asked first); all are little-endian integers <= 8 bytes
    uint64_t v = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &bytes) == CUBLAS_STATUS_SUCCESS &&
        bytes <= sizeof v)
      cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, bytes, &bytes);
    return v;
  };
  return "id " + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + ", tile " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) + ", stages " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + ", split-K " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + ", reduction " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + ", cluster " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) + ", swizzle " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
}

// Buffers the timed launches write instead of the call's out (and aux, when
// the epilogue writes it); raw device memory, so the caching allocator's
// peak does not include them.
struct Scratch {
  void* out = nullptr;
  void* aux = nullptr;
  ~Scratch() {
    cudaFree(out);
    cudaFree(aux);
  }
  bool allocate(size_t out_bytes, size_t aux_bytes) {
    if (cudaMalloc(&out, out_bytes) != cudaSuccess || (aux_bytes && cudaMalloc(&aux, aux_bytes) != cudaSuccess)) {
      cudaGetLastError();  // clear the failed allocation
      return false;
    }
    HG_CUDA_CHECK(cudaMemsetAsync(out, 0, out_bytes, stream()));
    return true;
  }
};

// Median of five samples, in microseconds a launch, of `algo` on the call's
// operands into `out`; each sample runs enough launches for about 100 us.
// Negative when cuBLASLt refuses the algorithm.
double time_algorithm(const Plan& p, const cublasLtMatmulAlgo_t& algo, const Call& c, void* out) {
  const float alpha = 1.f, beta = c.args.accumulate ? 1.f : 0.f;
  const auto launch = [&] {
    return cublasLtMatmul(lt_handle(), p.desc, &alpha, c.b.raw_data(), p.lt_a, c.a.raw_data(), p.lt_b, &beta, out,
                          p.lt_d, out, p.lt_d, &algo, workspace(), kWorkspaceBytes, stream());
  };
  cudaEvent_t start = nullptr, stop = nullptr;
  HG_CUDA_CHECK(cudaEventCreate(&start));
  HG_CUDA_CHECK(cudaEventCreate(&stop));
  const auto sample = [&](int launches) {
    HG_CUDA_CHECK(cudaEventRecord(start, stream()));
    for (int i = 0; i < launches; ++i) HG_CUBLAS_CHECK(launch());
    HG_CUDA_CHECK(cudaEventRecord(stop, stream()));
    HG_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    HG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0 * ms / launches;
  };
  double us = -1.0;
  if (launch() == CUBLAS_STATUS_SUCCESS) {
    const int launches = std::clamp(static_cast<int>(100.0 / std::max(sample(1), 1.0)), 1, 50);
    std::array<double, 5> samples{};
    for (double& t : samples) t = sample(launches);
    std::sort(samples.begin(), samples.end());
    us = samples[2];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return us;
}

// The file's entry for this shape, when it still names the same candidate
// list (same count, same configuration at its index); nullopt otherwise.
std::optional<SavedGemmAlgorithm> saved_choice(const GemmAlgorithmFile& file, int64_t library, const std::string& gemm,
                                               const cublasLtMatmulHeuristicResult_t* results, int found) {
  SavedGemmAlgorithm saved;
  if (!file.find(device_name(), library, gemm, saved)) return std::nullopt;
  if (saved.candidates == found && saved.candidate < found &&
      describe(results[saved.candidate].algo) == saved.algorithm)
    return saved;
  spdlog::warn("cuda gemm: the choice {} holds for {} does not match cuBLASLt's candidates now ({} offered, {} saved, "
               "'{}' at index {}); measured again",
               file.path(), gemm, found, saved.candidates, saved.algorithm, saved.candidate);
  return std::nullopt;
}

}  // namespace

bool stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  HG_CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

int fastest_candidate(Plan& p, const Call& c, const cublasLtMatmulHeuristicResult_t* results, int found) {
  const std::shared_ptr<GemmAlgorithmFile> file = gemm_algorithm_file();
  const auto library = static_cast<int64_t>(cublasLtGetVersion());
  GemmAlgorithmChoice choice{describe(c), "", found, 0, 0.0, 0.0};
  if (file) {
    if (const std::optional<SavedGemmAlgorithm> saved = saved_choice(*file, library, choice.gemm, results, found)) {
      record_gemm_algorithm_choice({choice.gemm, saved->algorithm, found, saved->candidate, saved->first_us,
                                    saved->chosen_us, /*from_file=*/true});
      return saved->candidate;
    }
  }
  const size_t out_bytes = size_t(c.s.batch * c.s.m * c.s.n) * dtype_size(c.out.dtype());
  const bool writes_aux = c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  Scratch scratch;
  if (!scratch.allocate(out_bytes, writes_aux ? c.args.aux->nbytes() : 0)) {
    spdlog::debug("cuda gemm: no memory to time the algorithms of {}; the heuristic's first is kept", choice.gemm);
    return 0;
  }
  if (writes_aux) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, scratch.aux);
  double best = -1.0;
  for (int i = 0; i < found; ++i) {
    const double us = time_algorithm(p, results[i].algo, c, scratch.out);
    if (i == 0) choice.first_us = us;
    if (us >= 0.0 && (best < 0.0 || us < best)) {
      best = us;
      choice.chosen = i;
    }
  }
  if (best < 0.0) choice.chosen = 0;
  choice.chosen_us = best;
  const int chosen = choice.chosen;
  choice.algorithm = describe(results[chosen].algo);
  spdlog::debug("cuda gemm: {}: candidate {} of {} ({}), {:.1f} us (heuristic's first {:.1f} us)", choice.gemm,
                choice.chosen, found, choice.algorithm, best, choice.first_us);
  if (file)
    file->save(
        {device_name(), library, choice.gemm, chosen, found, choice.algorithm, choice.first_us, choice.chosen_us});
  record_gemm_algorithm_choice(std::move(choice));
  return chosen;
}

}  // namespace hg::gpu::gemm_lt_detail

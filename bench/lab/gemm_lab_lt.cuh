#pragma once
// gemm_lab's cuBLASLt side: the descriptors of one case exactly as
// cuda/gemm_lt.cu's build_plan makes them, the candidate algorithms the
// heuristic offers under each preference "knob", and one matmul call.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/lab/gemm_lab_cases.cuh"

#define CHECK_CUBLAS(call)                                                                             \
  do {                                                                                                 \
    const cublasStatus_t s_ = (call);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasLtGetStatusString(s_)); \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)

namespace gemm_lab {

constexpr size_t kMiB = size_t(1) << 20;

// A heuristic preference. "lt" is gemm_lt.cu's; the others change one thing.
struct Knob {
  const char* name;
  size_t workspace;
  bool lt_reductions;   // gemm_lt's reduction mask: COMPUTE_TYPE only for bf16 out, all for f32 out
  uint32_t reductions;  // otherwise this mask
  const char* what;
};
constexpr Knob kKnobs[] = {
    {"lt", 32 * kMiB, true, 0, "gemm_lt.cu's preference (32 MiB workspace)"},
    {"ws64", 64 * kMiB, true, 0, "64 MiB workspace"},
    {"ws128", 128 * kMiB, true, 0, "128 MiB workspace"},
    {"nosplit", 32 * kMiB, false, CUBLASLT_REDUCTION_SCHEME_NONE, "no split-K reduction"},
    {"anyred", 32 * kMiB, false, CUBLASLT_REDUCTION_SCHEME_MASK,
     "every reduction scheme (bf16 split-K sums for bf16 out: outside gemm_lt's mask)"},
    {"search", 32 * kMiB, true, 0, "configurations enumerated by --search, the fastest screened ones"},
};
constexpr int kKnobCount =
    sizeof(kKnobs) / sizeof(kKnobs[0]) - 1;  // the last is --search's, not asked of the heuristic
constexpr int kSearchKnob = kKnobCount;
constexpr size_t kMaxWorkspace = 128 * kMiB;

// The device buffers of one input set (row-major, Backend::gemm's names).
struct Set {
  void* a = nullptr;    // bf16, M x K (K x M stored when ta)
  void* b = nullptr;    // bf16, K x N (N x K stored when tb)
  void* out = nullptr;  // bf16 M x N, or fp32 for a weight gradient
  void* aux = nullptr;  // bf16 M x N: GELU_AUX_BIAS writes it, DGELU reads it
  void* vec = nullptr;  // the bias (read) or bias gradient (written)
};

inline bool has_aux(Epi e) { return e == Epi::BiasGelu || e == Epi::DGeluBGrad || e == Epi::DGelu; }
inline bool has_vec(Epi e) { return e != Epi::None && e != Epi::DGelu; }
inline bool vec_is_output(Epi e) { return e == Epi::DGeluBGrad || e == Epi::BGradB; }
// The bias gradient of a weight gradient has dW's dtype (fp32); every other vector is bf16.
inline bool vec_f32(Epi e) { return e == Epi::BGradB; }
inline int64_t vec_len(const Case& c) { return c.epi == Epi::BGradB ? c.m : c.n; }

inline cublasLtEpilogue_t lt_epilogue(Epi e) {
  switch (e) {
    case Epi::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epi::BiasGelu: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epi::DGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epi::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epi::BGradB: return CUBLASLT_EPILOGUE_BGRADB;  // our a is cuBLASLt's B
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // cuBLASLt's A = our b, B = our a
};

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

inline cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  return layout;
}

// Row-major out (M x N) = op(a) op(b) as column-major out^T = op(b)^T op(a)^T
// (gemm_lt.cu's build_plan, batch 1).
inline Plan make_plan(const Case& c) {
  const int64_t m = c.m, n = c.n, k = c.k;
  Plan p;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(c.epi));
  if (has_vec(c.epi))
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(vec_f32(c.epi) ? CUDA_R_32F : CUDA_R_16BF));
  if (has_aux(c.epi)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(n));
  p.a = c.tb ? make_layout(CUDA_R_16BF, k, n, k) : make_layout(CUDA_R_16BF, n, k, n);
  p.b = c.ta ? make_layout(CUDA_R_16BF, m, k, m) : make_layout(CUDA_R_16BF, k, m, k);
  p.d = make_layout(c.f32_out ? CUDA_R_32F : CUDA_R_16BF, n, m, n);
  return p;
}

inline void destroy(Plan& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.d);
  cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

// One algorithm the heuristic offered, and what became of it.
struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // what the heuristic says it needs
  float waves = 0;
  int knob = 0, rank = 0;     // rank 1: the first of kKnobs[knob]'s list (lt#1 is what gemm_lt runs)
  bool fp32_partials = true;  // no split-K, or its partial sums in fp32: what gemm_lt allows
  std::string label, config;
  // results
  bool ran = false, checked_ok = false;
  double worst = 0;       // max |err| / bound over the sampled outputs (<= 1 passes)
  uint64_t disagree = 0;  // elements off the first algorithm's result
  double ms = 0;
};

inline uint64_t algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  size_t size = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size > 8)
    return 0;
  uint64_t v = 0;  // little-endian: the low bytes hold a narrower attribute
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, size, &size) != CUBLAS_STATUS_SUCCESS) return 0;
  return v;
}

inline std::string describe(const cublasLtMatmulAlgo_t& algo, size_t workspace, float waves) {
  const uint64_t split = algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                 red = algo_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  char text[200];
  std::snprintf(text, sizeof text,
                "algo %3d tile %3d stages %3d cluster %2d split %2d%s swz %d ws %5.1f MiB waves %.2f",
                int(algo_attr(algo, CUBLASLT_ALGO_CONFIG_ID)), int(algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)),
                int(algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)),
                int(algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)), int(split),
                split <= 1                                      ? "          "
                : red == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? " red fp32 "
                : red == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? " red out  "
                : red == CUBLASLT_REDUCTION_SCHEME_INPLACE      ? " red inpl "
                                                                : " red ?    ",
                int(algo_attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)), double(workspace) / double(kMiB), waves);
  return text;
}

// Up to `count` algorithms per knob (same attributes as gemm_lt.cu: 16-byte
// aligned operands, as the caching allocator's blocks are), in knob order,
// an algorithm offered by several knobs kept once under the first.
inline std::vector<Candidate> candidates(cublasLtHandle_t handle, const Plan& p, const Case& c,
                                         const std::vector<int>& knobs, int count) {
  std::vector<Candidate> out;
  for (int kn : knobs) {
    const Knob& knob = kKnobs[kn];
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = knob.workspace;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
    const uint32_t lt_mask =
        c.f32_out ? uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK) : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    const uint32_t mask = knob.lt_reductions ? lt_mask : knob.reductions;
    CHECK_CUBLAS(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
    std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(count));
    int n = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, count, found.data(), &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS) n = 0;  // NOT_SUPPORTED: no algorithm under this preference
    for (int i = 0; i < n; ++i) {
      if (found[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
      const cublasLtMatmulAlgo_t& algo = found[size_t(i)].algo;
      bool seen = false;
      for (const Candidate& o : out) seen |= std::memcmp(&o.algo, &algo, sizeof algo) == 0;
      if (seen) continue;
      Candidate cand;
      cand.algo = algo;
      cand.workspace = found[size_t(i)].workspaceSize;
      cand.waves = found[size_t(i)].wavesCount;
      cand.knob = kn;
      cand.rank = i + 1;
      const uint64_t red = algo_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
      cand.fp32_partials = c.f32_out || algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1 ||
                           red == CUBLASLT_REDUCTION_SCHEME_NONE || red == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cand.label = std::string(knob.name) + "#" + std::to_string(i + 1);
      cand.config = describe(algo, cand.workspace, cand.waves);
      out.push_back(cand);
    }
  }
  return out;
}

// ---- exhaustive search ------------------------------------------------------------

inline std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {0};  // not offered: the attribute's default
  std::vector<uint32_t> ids(bytes / sizeof(uint32_t));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {0};
  return ids;
}

// Sets a configuration attribute in the width cuBLASLt stores it (uint16 or uint32).
inline bool set_algo_attr(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, uint32_t v) {
  size_t size = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size > 8)
    return false;
  uint64_t wide = v;  // little-endian: the low bytes are the narrow value
  return cublasLtMatmulAlgoConfigSetAttribute(&algo, attr, &wide, size) == CUBLAS_STATUS_SUCCESS;
}

// Every configuration cuBLASLt accepts for the case beyond its heuristic's
// short list: algorithm ids x tile x stages x cluster shape (auto, and the
// ones up to 4x4) x CTA swizzle, without split-K, each validated by
// cublasLtMatmulAlgoCheck within gemm_lt's 32 MiB workspace.
inline std::vector<Candidate> enumerate_configs(cublasLtHandle_t handle, const Plan& p, const Case& c) {
  const cudaDataType_t in = CUDA_R_16BF, out = c.f32_out ? CUDA_R_32F : CUDA_R_16BF;
  int ids[128], n_ids = 0;
  if (cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, in, in, out, out, 128, ids, &n_ids) !=
      CUBLAS_STATUS_SUCCESS)
    return {};
  std::vector<Candidate> found;
  for (int i = 0; i < n_ids; ++i) {
    cublasLtMatmulAlgo_t base{};
    if (cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, in, in, out, out, ids[i], &base) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    const uint32_t swizzle = cap_list(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT)[0];
    for (uint32_t tile : cap_list(base, CUBLASLT_ALGO_CAP_TILE_IDS))
      for (uint32_t stages : cap_list(base, CUBLASLT_ALGO_CAP_STAGES_IDS))
        for (uint32_t cluster : {0u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u})
          for (uint32_t swz = 0; swz <= swizzle; ++swz) {
            cublasLtMatmulAlgo_t algo = base;
            const bool set = set_algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) &&
                             set_algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages) &&
                             set_algo_attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz) &&
                             (cluster == 0 || set_algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster));
            cublasLtMatmulHeuristicResult_t r{};
            if (!set ||
                cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, &algo, &r) != CUBLAS_STATUS_SUCCESS ||
                r.workspaceSize > kKnobs[0].workspace)
              continue;
            Candidate cand;
            cand.algo = algo;
            cand.workspace = r.workspaceSize;
            cand.waves = r.wavesCount;
            cand.knob = kSearchKnob;
            cand.config = describe(algo, cand.workspace, cand.waves);
            found.push_back(cand);
          }
  }
  return found;
}

// The bias / aux pointers live on the descriptor: set before the heuristic
// and at every call, as gemm_lt does.
inline void set_pointers(const Plan& p, const Case& c, const Set& s) {
  if (has_vec(c.epi)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.vec);
  if (has_aux(c.epi)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.aux);
}

// One matmul of candidate `cand` on set `s`, given the knob's workspace size.
inline cublasStatus_t run(cublasLtHandle_t handle, const Plan& p, const Case& c, const Candidate& cand, const Set& s,
                          void* workspace) {
  set_pointers(p, c, s);
  const float alpha = 1.f, beta = c.accumulate() ? 1.f : 0.f;
  return cublasLtMatmul(handle, p.desc, &alpha, s.b, p.a, s.a, p.b, &beta, s.out, p.d, s.out, p.d, &cand.algo,
                        workspace, kKnobs[cand.knob].workspace, nullptr);
}

}  // namespace gemm_lab

// Diagnostic (not part of the library): what cuBLASLt does with bf16 D.
// For each case: up to 8 heuristic algorithms; each is run and its output
// compared element by element with candidate rounding orders:
//   single : rn_bf16(product + beta C + bias)            (fp32 epilogue, one rounding)
//   prod1st: rn_bf16(rn_bf16(product) + beta C + bias)    (product rounded before the epilogue adds)
//   chain  : rn_bf16(rn_bf16(rn_bf16(product) + beta C) + bias)
// plus the worst ratio against test_gemm's bound (1e-5 s + 2^-8 |ref| + 1e-6).
// Also the algorithm's split-K count and reduction scheme, and the same with
// the reduction scheme restricted to NONE | COMPUTE_TYPE.
// Part 2: which epilogue / bias-type combinations have an algorithm at the
// model's shapes.
//
// Build and run on the GPU machine (no part of the CMake build):
//   nvcc -O2 -arch=sm_90 -std=c++17 scripts/probe/gemm_probe.cu -lcublasLt -o gemm_probe && ./gemm_probe
// Findings (H100, cuBLASLt 13.1, 2026-11-24): docs/gemm.md, "What cuBLASLt
// does with a bf16 D".
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                      \
  do {                                                             \
    auto e_ = (x);                                                 \
    if (e_ != cudaSuccess) {                                       \
      printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                     \
    }                                                              \
  } while (0)
#define LK(x)                                                  \
  do {                                                         \
    auto s_ = (x);                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                         \
      printf("cuBLASLt status %d at %d\n", int(s_), __LINE__); \
      exit(1);                                                 \
    }                                                          \
  } while (0)

static cublasLtHandle_t H;
static void* WS;
static const size_t kWS = 32u << 20;

static double rbd(double x) {  // round a double to bf16 (through float: fine for our magnitudes)
  return double(__bfloat162float(__float2bfloat16_rn(float(x))));
}

enum Epi { NONE, BIAS, BIASGELU, DGELU };
static const char* ename[] = {"None", "Bias", "BiasGelu", "GeluBackward"};

static double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad(double x) {
  const double c = 0.7978845608028654, a = 0.044715, t = std::tanh(c * (x + a * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * a * x * x);
}

struct Case {
  int m, n, k;
  bool ta, tb, acc;
  Epi e;
};

static void layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, int rows, int cols, int ld) {
  LK(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
}

static void run_case(const Case& c, std::mt19937_64& rng, uint32_t red_mask) {
  std::normal_distribution<double> nd(0, 1), nd2(0, 2);
  const int m = c.m, n = c.n, k = c.k;
  std::vector<__nv_bfloat16> a(m * k), b(k * n), out(m * n), bias(n), aux(m * n);
  std::vector<double> av(m * k), bv(k * n), ov(m * n), biasv(n), auxv(m * n);
  for (int i = 0; i < m * k; ++i) {
    a[i] = __float2bfloat16_rn(float(nd(rng)));
    av[i] = __bfloat162float(a[i]);
  }
  for (int i = 0; i < k * n; ++i) {
    b[i] = __float2bfloat16_rn(float(nd(rng)));
    bv[i] = __bfloat162float(b[i]);
  }
  for (int i = 0; i < m * n; ++i) {
    out[i] = __float2bfloat16_rn(float(nd(rng)));
    ov[i] = __bfloat162float(out[i]);
  }
  for (int i = 0; i < n; ++i) {
    bias[i] = __float2bfloat16_rn(float(nd(rng)));
    biasv[i] = __bfloat162float(bias[i]);
  }
  for (int i = 0; i < m * n; ++i) {
    aux[i] = __float2bfloat16_rn(float(nd2(rng)));
    auxv[i] = __bfloat162float(aux[i]);
  }
  // reference product (row-major out (m, n) = op(a) op(b); a stored (k, m) when ta)
  std::vector<double> prod(m * n), s(m * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0, sc = 0;
      for (int p = 0; p < k; ++p) {
        const double x = c.ta ? av[p * m + i] : av[i * k + p], y = c.tb ? bv[j * k + p] : bv[p * n + j];
        sum += x * y;
        sc += std::abs(x * y);
      }
      prod[i * n + j] = sum;
      s[i * n + j] = sc;
    }
  __nv_bfloat16 *da, *db, *dout, *dbias, *daux;
  CK(cudaMalloc(&da, a.size() * 2));
  CK(cudaMalloc(&db, b.size() * 2));
  CK(cudaMalloc(&dout, out.size() * 2));
  CK(cudaMalloc(&dbias, bias.size() * 2));
  CK(cudaMalloc(&daux, aux.size() * 2));
  CK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbias, bias.data(), bias.size() * 2, cudaMemcpyHostToDevice));

  cublasLtMatmulDesc_t d;
  LK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opA = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opB = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  if (c.e == BIAS) ep = CUBLASLT_EPILOGUE_BIAS;
  if (c.e == BIASGELU) ep = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (c.e == DGELU) ep = CUBLASLT_EPILOGUE_DGELU;
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
  if (c.e == BIAS || c.e == BIASGELU) {
    int32_t bt = CUDA_R_16BF;
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias));
  }
  if (c.e == BIASGELU || c.e == DGELU) {
    int64_t ld = n;
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux, sizeof daux));
  }
  cublasLtMatrixLayout_t la, lb, ld_;
  if (c.tb) layout(&la, CUDA_R_16BF, k, n, k);
  else layout(&la, CUDA_R_16BF, n, k, n);
  if (c.ta) layout(&lb, CUDA_R_16BF, m, k, m);
  else layout(&lb, CUDA_R_16BF, k, m, k);
  layout(&ld_, CUDA_R_16BF, n, m, n);
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWS;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red_mask,
                                          sizeof red_mask));
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(H, d, la, lb, ld_, ld_, pref, 8, res, &found);
  printf("%-13s M %3d N %3d K %3d ta %d tb %d acc %d mask %u: %d algos (status %d)\n", ename[c.e], m, n, k, c.ta, c.tb,
         c.acc, red_mask, found, int(st));
  const double beta_v = c.acc ? 1.0 : 0.0;
  for (int r = 0; r < found; ++r) {
    CK(cudaMemcpy(dout, out.data(), out.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(daux, aux.data(), aux.size() * 2, cudaMemcpyHostToDevice));
    const float alpha = 1, beta = float(beta_v);
    st = cublasLtMatmul(H, d, &alpha, db, la, da, lb, &beta, dout, ld_, dout, ld_, &res[r].algo, WS, kWS, 0);
    if (st != CUBLAS_STATUS_SUCCESS) {
      printf("  algo %d: run status %d\n", r, int(st));
      continue;
    }
    CK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> got(m * n), gaux(m * n);
    CK(cudaMemcpy(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gaux.data(), daux, gaux.size() * 2, cudaMemcpyDeviceToHost));
    int id = 0, tile = 0, splitk = 0, stages = 0;
    uint32_t red = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    int eq_single = 0, eq_prod1st = 0, eq_chain = 0, eq_aux_single = 0;
    double worst = 0, worst_aux = 0;
    for (int i = 0; i < m * n; ++i) {
      const int j = i % n;
      const double g = __bfloat162float(got[i]);
      double ref, single, prod1st, chain, bound_s = s[i] + (c.acc ? std::abs(ov[i]) : 0);
      const double pre = prod[i] + beta_v * ov[i];
      if (c.e == NONE) {
        ref = pre;
        single = rbd(ref);
        prod1st = rbd(rbd(prod[i]) + beta_v * ov[i]);
        chain = prod1st;
      } else if (c.e == BIAS) {
        ref = pre + biasv[j];
        single = rbd(ref);
        prod1st = rbd(rbd(prod[i]) + beta_v * ov[i] + biasv[j]);
        chain = rbd(rbd(rbd(prod[i]) + beta_v * ov[i]) + biasv[j]);
        bound_s += std::abs(biasv[j]);
      } else if (c.e == BIASGELU) {
        const double x = pre + biasv[j];
        ref = gelu(x);
        single = rbd(gelu(x));
        prod1st = rbd(gelu(rbd(prod[i]) + beta_v * ov[i] + biasv[j]));
        chain = rbd(gelu(rbd(rbd(rbd(prod[i]) + beta_v * ov[i]) + biasv[j])));
        bound_s += std::abs(biasv[j]);
        const double ga = __bfloat162float(gaux[i]);
        if (ga == rbd(x)) ++eq_aux_single;
        const double bnd = 1e-5 * bound_s + std::ldexp(1.0, -8) * std::abs(x) + 1e-6;
        worst_aux = std::max(worst_aux, std::abs(ga - x) / bnd);
      } else {
        const double gg = gelu_grad(auxv[i]);
        ref = prod[i] * gg;
        single = rbd(ref);
        prod1st = rbd(rbd(prod[i]) * gg);
        chain = rbd(rbd(prod[i]) * rbd(gg));
      }
      eq_single += g == single;
      eq_prod1st += g == prod1st;
      eq_chain += g == chain;
      const double bnd = 1.13e-5 * bound_s + std::ldexp(1.0, -8) * std::abs(ref) + 1e-6 +
                         (c.e >= BIASGELU ? 2e-3 * std::abs(ref) : 0);  // generous tanh slack
      worst = std::max(worst, std::abs(g - ref) / bnd);
    }
    printf(
        "  algo %d: id %3d tile %3d stages %3d splitK %2d red %u | ==single %5.1f%% ==prod1st %5.1f%% ==chain %5.1f%% "
        "| worst/bound %.2f",
        r, id, tile, stages, splitk, red, 100.0 * eq_single / (m * n), 100.0 * eq_prod1st / (m * n),
        100.0 * eq_chain / (m * n), worst);
    if (c.e == BIASGELU) printf(" | aux ==single %5.1f%% worst %.2f", 100.0 * eq_aux_single / (m * n), worst_aux);
    printf("\n");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld_);
  cublasLtMatmulDescDestroy(d);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  cudaFree(dbias);
  cudaFree(daux);
}

// Part 2: does an algorithm exist? (no run). in: operand type; dt: D type;
// vt: bias / bias-grad type (or -1 none).
static void support(const char* what, int m, int n, int k, bool ta, bool tb, cublasLtEpilogue_t ep, cudaDataType_t dt,
                    int vt) {
  cublasLtMatmulDesc_t d;
  LK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opA = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opB = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
  LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
  void* vec = WS;  // any aligned pointer
  if (vt >= 0) {
    int32_t t = vt;
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec));
  }
  if (ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || ep == CUBLASLT_EPILOGUE_DGELU || ep == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    int64_t ld = n;
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    LK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &vec, sizeof vec));
  }
  cublasLtMatrixLayout_t la, lb, ldl;
  if (tb) layout(&la, CUDA_R_16BF, k, n, k);
  else layout(&la, CUDA_R_16BF, n, k, n);
  if (ta) layout(&lb, CUDA_R_16BF, m, k, m);
  else layout(&lb, CUDA_R_16BF, k, m, k);
  layout(&ldl, dt, n, m, n);
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWS;
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res[4];
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(H, d, la, lb, ldl, ldl, pref, 4, res, &found);
  printf("  %-44s M %5d N %5d K %5d ta %d tb %d D %s vec %s: %d algos (status %d)\n", what, m, n, k, ta, tb,
         dt == CUDA_R_32F ? "f32 " : "bf16",
         vt < 0             ? "-   "
         : vt == CUDA_R_32F ? "f32 "
                            : "bf16",
         found, int(st));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ldl);
  cublasLtMatmulDescDestroy(d);
}

int main() {
  LK(cublasLtCreate(&H));
  CK(cudaMalloc(&WS, kWS));
  printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  std::mt19937_64 rng(42);
  const int shapes[][3] = {{7, 16, 5}, {33, 24, 65}, {130, 40, 200}, {33, 17, 3}, {512, 1536, 512}};
  for (uint32_t mask : {uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK),
                        uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)}) {
    printf("==== reduction scheme mask %u\n", mask);
    for (auto& sh : shapes)
      for (int e = 0; e < 4; ++e)
        for (int t = 0; t < 4; t += 3)
          for (int acc = 0; acc < 2; ++acc) {
            if (e == DGELU && acc) continue;
            if ((e == BIASGELU || e == DGELU) && sh[1] % 8) continue;
            run_case(Case{sh[0], sh[1], sh[2], (t & 1) != 0, (t & 2) != 0, acc != 0, Epi(e)}, rng, mask);
          }
  }
  printf("==== support at model shapes (rows 8192 / 8192*? ; d 512, 3d 1536, 4d 2048; gpt2s d 768, V 50304)\n");
  const int rows = 8192;
  for (int d : {512, 768}) {
    for (int nout : {3 * d, d, 4 * d}) {
      support("fwd Bias  x W^T", rows, nout, d, false, true, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF, CUDA_R_16BF);
      support("fwd Bias  x W^T (f32 bias)", rows, nout, d, false, true, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF,
              CUDA_R_32F);
      support("dW BGRADB dy^T x, f32 D", nout, d, rows, true, false, CUBLASLT_EPILOGUE_BGRADB, CUDA_R_32F, CUDA_R_32F);
      support("dW BGRADB dy^T x, f32 D, bf16 bgrad", nout, d, rows, true, false, CUBLASLT_EPILOGUE_BGRADB, CUDA_R_32F,
              CUDA_R_16BF);
      support("dW BGRADB dy^T x, f32 D, no vec type", nout, d, rows, true, false, CUBLASLT_EPILOGUE_BGRADB, CUDA_R_32F,
              -1);
      support("dW BGRADA (swapped: x^T dy), f32 D", d, nout, rows, true, false, CUBLASLT_EPILOGUE_BGRADA, CUDA_R_32F,
              CUDA_R_32F);
    }
    support("fwd BiasGelu", rows, 4 * d, d, false, true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF, CUDA_R_16BF);
    support("fwd BiasGelu (f32 bias)", rows, 4 * d, d, false, true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF,
            CUDA_R_32F);
    support("dx DGELU_BGRAD dy W, bf16 bgrad", rows, 4 * d, d, false, false, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF,
            CUDA_R_16BF);
    support("dx DGELU_BGRAD dy W, f32 bgrad", rows, 4 * d, d, false, false, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF,
            CUDA_R_32F);
    support("dx DGELU dy W", rows, 4 * d, d, false, false, CUBLASLT_EPILOGUE_DGELU, CUDA_R_16BF, -1);
  }
  return 0;
}

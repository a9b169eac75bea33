// A question about compute-sanitizer racecheck, asked with the smallest
// kernel that has the shape of the resident LayerNorm backward
// (cuda/layernorm.cu): R groups of G threads in one block, each group summing
// through shared memory behind its own named barrier (bar.sync 1 + group, G),
// each adding into its own shared partial row; then one __syncthreads and
// every thread reads all R partial rows.
//
// By the PTX barrier rules this is race-free however many named-barrier
// reductions each group makes: every thread of the block takes part in the
// __syncthreads, so every partial-row write is ordered before every read.
// Modes: "uneven" (group 0 makes three reductions, the others one), "none"
// (three and zero), "even" (three each). The LayerNorm kernel drew racecheck
// hazards while its groups made different numbers of reductions; this
// kernel, on an H100 with CUDA 13.0 (2026-11-23), draws none in any mode, so
// the count alone is not what the tool objected to (docs/reliability.md).
//
//   nvcc -arch=sm_90 -o /tmp/racecheck_named_barriers scripts/racecheck_named_barriers.cu
//   compute-sanitizer --tool racecheck /tmp/racecheck_named_barriers uneven
//   compute-sanitizer --tool racecheck /tmp/racecheck_named_barriers none
//   compute-sanitizer --tool racecheck /tmp/racecheck_named_barriers even
#include <cstdio>
#include <cstring>

constexpr int G = 128, R = 4, kWarps = G / 32, kBlocks = 2, kTrips = 3;

__device__ void group_barrier(int id) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(G) : "memory"); }

__global__ void grouped_partials(float* out, int others_trips) {
  __shared__ float partial[R][G];
  __shared__ float scratch[R][kWarps];
  const int group = threadIdx.x / G, t = threadIdx.x % G;
  partial[group][t] = 0.0f;
  const int trips = group == 0 ? kTrips : others_trips;
  for (int k = 0; k < trips; ++k) {
    if (t % 32 == 0) scratch[group][t / 32] = static_cast<float>(t + k);
    group_barrier(1 + group);
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += scratch[group][w];
    group_barrier(1 + group);  // all have read before the next trip writes
    partial[group][t] += s;
  }
  __syncthreads();
  if (threadIdx.x < G) {
    float sum = 0.0f;
    for (int r = 0; r < R; ++r) sum += partial[r][threadIdx.x];
    out[blockIdx.x * G + threadIdx.x] = sum;
  }
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "uneven";
  const int others_trips = std::strcmp(mode, "even") == 0 ? kTrips : std::strcmp(mode, "none") == 0 ? 0 : 1;
  float* out = nullptr;
  cudaMalloc(&out, kBlocks * G * sizeof(float));
  grouped_partials<<<kBlocks, G * R>>>(out, others_trips);
  float host[kBlocks * G];
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  if (cudaGetLastError() != cudaSuccess) return 2;
  // Each reduction adds sum over warps of (32 w + k) = 192 + 4 k.
  double want = 0.0;
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < (r == 0 ? kTrips : others_trips); ++k) want += 192.0 + 4.0 * k;
  int wrong = 0;
  for (float v : host) wrong += v != static_cast<float>(want);
  std::printf("%s: %d of %d sums wrong (each should be %.0f)\n", mode, wrong, kBlocks * G, want);
  cudaFree(out);
  return wrong == 0 ? 0 : 1;
}

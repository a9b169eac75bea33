// The GPU API for builds without CUDA, linked instead of cuda/*.cu (the one
// place that decides is cuda/CMakeLists.txt). Queries answer "no GPU";
// everything else throws hg::Error naming the call, so a CPU-only build has
// the same API, needs no #ifdef in ops/ or core/, and fails loudly (never
// silently) if a CUDA path is reached. Every entry point of cuda/*_kernels.hpp
// and core/cuda_runtime.hpp has its throwing twin here.

#include "core/backend.hpp"
#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/attention_kernels.hpp"
#include "cuda/column_sum_kernels.hpp"
#include "cuda/cross_entropy_kernels.hpp"
#include "cuda/cross_entropy_lse_kernels.hpp"
#include "cuda/gemm_lt.hpp"
#include "cuda/indexing_kernels.hpp"
#include "cuda/layernorm_kernels.hpp"
#include "cuda/optim_kernels.hpp"
#include "cuda/softmax_kernels.hpp"

namespace hg {
namespace {
[[noreturn]] void no_cuda(const char* fn) { fail(fn, "handgrad was built without CUDA"); }
}  // namespace

Backend& cuda_backend() { no_cuda("cuda_backend"); }

namespace gpu {

bool built_with_cuda() { return false; }
int device_count() { return 0; }
void set_device(int) { no_cuda("gpu::set_device"); }
MemoryStats memory_stats() { return MemoryStats{}; }

void* allocate(size_t) { no_cuda("gpu::allocate"); }
void release(void* ptr) {
  if (ptr != nullptr) no_cuda("gpu::release");  // nullptr: nothing to give back, as with CUDA
}
void reset_peak_memory() { no_cuda("gpu::reset_peak_memory"); }
void empty_cache() { no_cuda("gpu::empty_cache"); }
void set_memory_limit(size_t) { no_cuda("gpu::set_memory_limit"); }
size_t memory_limit() { return 0; }
void copy_bytes(void*, Device, const void*, Device, size_t) { no_cuda("gpu::copy_bytes"); }
void synchronize() { no_cuda("gpu::synchronize"); }
intptr_t current_stream() { return 0; }  // nothing runs on a stream without CUDA
void set_stream(intptr_t) { no_cuda("gpu::set_stream"); }
void use_own_stream() {}

Graph::~Graph() = default;
void Graph::begin_capture() { no_cuda("gpu::Graph::begin_capture"); }
void Graph::end_capture() { no_cuda("gpu::Graph::end_capture"); }
void Graph::abort_capture() noexcept {}
void Graph::replay() { no_cuda("gpu::Graph::replay"); }
void Graph::reset() noexcept {}

Beside::Beside(const std::function<void()>&) { no_cuda("gpu::Beside"); }
Beside::~Beside() = default;
void Beside::join() {}
bool beside_active() { return false; }

Timer::Timer() { no_cuda("gpu::Timer"); }
Timer::~Timer() = default;
void Timer::start() { no_cuda("gpu::Timer::start"); }
float Timer::stop_ms() { no_cuda("gpu::Timer::stop_ms"); }

int sm_count() { no_cuda("gpu::sm_count"); }
int compute_capability() { no_cuda("gpu::compute_capability"); }

const char* device_name() { no_cuda("gpu::device_name"); }
double dram_peak_gbps() { no_cuda("gpu::dram_peak_gbps"); }

void sgd_step(float*, const float*, float*, int64_t, float, float, float) { no_cuda("gpu::sgd_step"); }
void adamw_step(float*, const float*, float*, float*, int64_t, float, float, float, float, float, float, float) {
  no_cuda("gpu::adamw_step");
}
double sum_of_squares(const float*, int64_t) { no_cuda("gpu::sum_of_squares"); }
void scale_inplace(float*, int64_t, float) { no_cuda("gpu::scale_inplace"); }
void zero_multi(const std::vector<Tensor>&) { no_cuda("gpu::zero_multi"); }

MemorySystem device_memory_system() { no_cuda("gpu::device_memory_system"); }
void layernorm_forward_fused(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) {
  no_cuda("gpu::layernorm_forward_fused");
}
void layernorm_backward_fused(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                              Tensor&, Tensor&, ParamGradWrite) {
  no_cuda("gpu::layernorm_backward_fused");
}
void layernorm_forward_fused(const Tensor&, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&,
                             const LnKernel&) {
  no_cuda("gpu::layernorm_forward_fused");
}
void layernorm_backward_fused(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                              Tensor&, Tensor&, const LnKernel&, ParamGradWrite) {
  no_cuda("gpu::layernorm_backward_fused");
}

void softmax_forward_fused(const Tensor&, const SoftmaxRows&, Tensor&) { no_cuda("gpu::softmax_forward_fused"); }
bool softmax_forward_is_staged(const Tensor&, const SoftmaxRows&, const Tensor&) {
  no_cuda("gpu::softmax_forward_is_staged");
}
bool softmax_forward_keeps_mask_row(const Tensor&, const SoftmaxRows&, const Tensor&) {
  no_cuda("gpu::softmax_forward_keeps_mask_row");
}
void softmax_backward_fused(const Tensor&, const Tensor&, int64_t, int64_t, float, Tensor&) {
  no_cuda("gpu::softmax_backward_fused");
}

void attention_forward(DType, const void*, const void*, const void*, const AttentionLayout&, void*, Tensor&, Tensor&) {
  no_cuda("gpu::attention_forward");
}
void allow_wgmma_attention(bool) { no_cuda("gpu::allow_wgmma_attention"); }
bool wgmma_attention_allowed() { no_cuda("gpu::wgmma_attention_allowed"); }
void allow_stored_ds_attention(bool) { no_cuda("gpu::allow_stored_ds_attention"); }
AttentionKernel attention_forward_kernel(DType, const void*, const void*, const void*, const AttentionLayout&) {
  no_cuda("gpu::attention_forward_kernel");
}
bool attention_backward(DType, const void*, const void*, const void*, const void*, const void*, const Tensor&,
                        const AttentionLayout&, void*, void*, void*, const Tensor*) {
  no_cuda("gpu::attention_backward");
}
AttentionKernel attention_backward_kernel(DType, const void*, const void*, const void*, const void*,
                                          const AttentionLayout&) {
  no_cuda("gpu::attention_backward_kernel");
}

void cross_entropy_fused(const Tensor&, const Tensor&, int64_t, int64_t, int64_t, float, Tensor&, Tensor&) {
  no_cuda("gpu::cross_entropy_fused");
}
void cross_entropy_count_targets(const Tensor&, int64_t, Tensor&) { no_cuda("gpu::cross_entropy_count_targets"); }
int64_t cross_entropy_staged_max_vocab(DType) { no_cuda("gpu::cross_entropy_staged_max_vocab"); }
int64_t cross_entropy_staged_min_vocab(DType) { no_cuda("gpu::cross_entropy_staged_min_vocab"); }
void cross_entropy_lse_rows_grad(Tensor&, const Tensor&, int64_t, const Tensor&, Tensor&, RowPassKernel) {
  no_cuda("gpu::cross_entropy_lse_rows_grad");
}
void cross_entropy_sum_row_losses(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("gpu::cross_entropy_sum_row_losses");
}

void column_sum(const Tensor&, int64_t, int64_t, int64_t, const Tensor&, bool) { no_cuda("gpu::column_sum"); }
void gemm_lt(const Tensor&, const Tensor&, Tensor&, const GemmArgs&, const MatmulShape&) { no_cuda("gpu::gemm_lt"); }

void gather_rows_cuda(const Tensor&, const Tensor&, int64_t, Tensor&) { no_cuda("gpu::gather_rows_cuda"); }
void embed_rows_cuda(const Tensor&, const Tensor&, const Tensor&, Tensor&) { no_cuda("gpu::embed_rows_cuda"); }
void scatter_add_rows_cuda_device_ids(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("gpu::scatter_add_rows_cuda_device_ids");
}
std::vector<int64_t> count_bad_indices_cuda(const std::vector<IndexSet>&) { no_cuda("gpu::count_bad_indices_cuda"); }
void scatter_add_rows_cuda(const Tensor&, const std::vector<int32_t>&, Tensor&) {
  no_cuda("gpu::scatter_add_rows_cuda");
}

}  // namespace gpu
}  // namespace hg

// The CUDA runtime behind core/cuda_runtime.hpp: the one stream, checked
// errors, the caching allocator, copies, timing, device facts and the cuBLAS
// handle. Long-lived objects (stream, allocator, handle) are created on first
// use and deliberately never destroyed: tensors held in static storage may be
// released after main() returns, and the driver reclaims everything at exit.
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "core/cuda_runtime.hpp"
#include "core/error.hpp"
#include "cuda/cublas_handle.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/graph_memset_nodes.hpp"
#include "cuda/side_stream.hpp"

namespace hg::gpu {

bool built_with_cuda() { return true; }

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  // Clear the (non-sticky) error so the next HG_CUDA_CHECK_LAUNCH does not
  // report it a second time.
  cudaGetLastError();
  std::ostringstream os;
  os << what << " failed at " << file << ":" << line << ": " << cudaGetErrorName(err) << ": "
     << cudaGetErrorString(err);
  throw Error(os.str());
}

namespace {

// handgrad's own stream. Non-blocking: it does not synchronise with the legacy
// default stream, so third-party work there cannot stall handgrad (and vice versa).
cudaStream_t own_stream() {
  static cudaStream_t s = [] {
    cudaStream_t created = nullptr;
    HG_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    return created;
  }();
  return s;
}

// The stream in use, as set_stream's handle; kOwnStream: own_stream().
constexpr intptr_t kOwnStream = -1;
std::atomic<intptr_t> current_handle{kOwnStream};

cudaStream_t to_stream(intptr_t handle) {
  return handle == kOwnStream ? own_stream() : reinterpret_cast<cudaStream_t>(handle);
}

// 0 and cudaStreamLegacy (1) name the same stream (handgrad is not built with
// per-thread default streams).
bool same_stream(cudaStream_t a, cudaStream_t b) {
  auto canonical = [](cudaStream_t s) { return s == nullptr ? cudaStreamLegacy : s; };
  return canonical(a) == canonical(b);
}

}  // namespace

cudaStream_t stream() { return to_stream(current_handle.load(std::memory_order_relaxed)); }

intptr_t current_stream() { return reinterpret_cast<intptr_t>(stream()); }

void set_stream(intptr_t handle) {
  if (handle == current_handle.load(std::memory_order_relaxed)) return;
  const cudaStream_t prev = stream(), next = to_stream(handle);
  if (same_stream(prev, next)) {
    current_handle.store(handle, std::memory_order_relaxed);
    return;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  HG_CUDA_CHECK(cudaStreamIsCapturing(prev, &capturing));
  HG_CHECK(capturing == cudaStreamCaptureStatusNone, "gpu::set_stream",
           "the current stream is being captured into a CUDA graph; end the capture first");
  // The new stream waits for everything queued so far on the old one, so all
  // of handgrad's work stays one sequence in issue order (the caching
  // allocator's argument below). Destroying an event with a pending wait is allowed.
  cudaEvent_t joined = nullptr;
  HG_CUDA_CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(joined, prev);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(next, joined, 0);
  cudaEventDestroy(joined);
  HG_CUDA_CHECK(err);
  current_handle.store(handle, std::memory_order_relaxed);
}

void use_own_stream() { set_stream(kOwnStream); }

namespace {

const ForkJoin& beside_handles() {
  static const ForkJoin h = create_fork_join();
  return h;
}

std::atomic<bool> beside_open{false};

}  // namespace

Beside::Beside(const std::function<void()>& work) {
  HG_CHECK(!beside_open.exchange(true), "gpu::Beside", "another Beside is still open; join it first");
  try {
    const ForkJoin& h = beside_handles();
    h.fork();
    struct Restore {  // stream() is the handgrad stream again however `work` ends
      intptr_t handle;
      ~Restore() { current_handle.store(handle, std::memory_order_relaxed); }
    } restore{current_handle.load(std::memory_order_relaxed)};
    current_handle.store(reinterpret_cast<intptr_t>(h.stream), std::memory_order_relaxed);
    work();
  } catch (...) {
    join();
    throw;
  }
}

Beside::~Beside() {
  if (joined_) return;
  joined_ = true;
  beside_open.store(false);
  beside_handles().join_quietly();
}

// stream() is a Beside's stream only while its work is queued.
bool beside_active() {
  return beside_open.load() &&
         current_handle.load(std::memory_order_relaxed) == reinterpret_cast<intptr_t>(beside_handles().stream);
}

void Beside::join() {
  if (joined_) return;
  joined_ = true;
  beside_open.store(false);
  beside_handles().join();
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no GPU: clear the error, report none
    return 0;
  }
  return n;
}

void set_device(int ordinal) {
  const int n = device_count();
  if (ordinal < 0 || ordinal >= n)
    fail("gpu::set_device", "GPU ", ordinal, " does not exist: ", n, " GPU(s) are visible");
  HG_CUDA_CHECK(cudaSetDevice(ordinal));
}

// ---- caching allocator ------------------------------------------------------
//
// Why reuse is safe without events: every handgrad kernel, copy and cuBLAS
// call runs on the one stream, in issue order (set_stream may change which
// stream that is, but the new one first waits for all work on the old). When a tensor is released its
// last uses are already queued on that stream; any later user of the same
// block queues its work after them, so the stream finishes the old reads and
// writes before the new ones start. A freed block can therefore be handed out
// again at once. (Work on any other stream would break this argument.)
namespace {

constexpr size_t kSmallRound = 512;  // granularity below 1 MiB
constexpr size_t kLargeThreshold = size_t(1) << 20;
constexpr size_t kLargeRound = size_t(2) << 20;  // 2 MiB chunks above

size_t round_up(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;  // a zero-byte tensor still gets a distinct, valid pointer
  return round_up(bytes, bytes < kLargeThreshold ? kSmallRound : kLargeRound);
}

// CUDA graphs (class Graph below): while a graph is being captured, every
// block handed out or given back belongs to that graph's private pool. A
// replay re-reads and re-writes those addresses without the host knowing, so
// a pool block is only ever reused by the same graph's capture, never by an
// allocation outside it; blocks of the shared cache released during a capture
// join the pool (the captured work may still use them). When the graph is
// destroyed its pool is closed: its free blocks return to the shared cache,
// and its live blocks follow when their tensors release them.
//
// Stats count whole blocks (the rounded size), so in_use can exceed the sum
// of the tensors' nbytes by the rounding.
using FreeList = std::multimap<size_t, void*>;  // block size -> cached block

class CachingAllocator {
 public:
  void* allocate(size_t bytes) {
    const size_t size = round_size(bytes);
    const size_t requested = round_up(bytes == 0 ? 1 : bytes, kSmallRound);
    std::lock_guard<std::mutex> lock(mutex_);
    if (capture_pool_ != 0) {
      // The pool's own blocks first, then the shared cache (whose queued
      // users all precede the graph on the stream), then the driver.
      if (void* ptr = take_cached(pools_[capture_pool_].free, size, requested, capture_pool_)) return ptr;
      if (void* ptr = take_cached(free_, size, requested, capture_pool_)) return ptr;
    } else if (void* ptr = take_cached(free_, size, requested, 0)) {
      return ptr;
    }
    void* ptr = nullptr;
    cudaError_t err = device_malloc(&ptr, size);
    if (err != cudaSuccess && capture_pool_ == 0) {  // freeing the cache synchronizes: not while capturing
      // Out of memory (or fragmented): give the cache back and try once more.
      cudaGetLastError();
      free_cached_locked();
      err = device_malloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      std::ostringstream os;
      os << "gpu::allocate: ";
      if (over_limit(size))
        os << size << " bytes more would hold " << stats_.reserved + size << " bytes, over the limit of " << limit_
           << " (gpu::set_memory_limit)";
      else
        os << "cudaMalloc of " << size << " bytes failed: " << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
      os << " (in use " << stats_.in_use << " bytes, reserved " << stats_.reserved << " bytes)";
      if (err == cudaErrorMemoryAllocation) throw OutOfMemory(os.str());
      throw Error(os.str());
    }
    stats_.reserved += size;
    stats_.device_mallocs += 1;
    hand_out(ptr, size, requested, capture_pool_);
    return ptr;
  }

  // Never throws: it runs from Storage's destructor.
  void release(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      // Not ours (or released twice): a bug elsewhere, but not worth aborting over.
      unknown_releases_ += 1;
      return;
    }
    const Block block = it->second;
    live_.erase(it);
    stats_.in_use -= block.size;
    stats_.requested -= block.requested;
    free_list_for(block).emplace(block.size, ptr);
  }

  // Graph capture: blocks handed out or released until end_capture() belong to the new pool.
  int begin_capture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (capture_pool_ != 0) fail("gpu::Graph::begin_capture", "another graph is already being captured");
    capture_pool_ = next_pool_++;
    pools_[capture_pool_] = Pool{};
    return capture_pool_;
  }

  void end_capture() {
    std::lock_guard<std::mutex> lock(mutex_);
    capture_pool_ = 0;
  }

  // The graph is gone: its cached blocks return to the shared cache.
  void close_pool(int id) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pools_.find(id);
    if (it == pools_.end()) return;
    for (const auto& entry : it->second.free) free_.emplace(entry);
    pools_.erase(it);
    if (capture_pool_ == id) capture_pool_ = 0;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
    stats_.peak_requested = stats_.requested;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    free_cached_locked();
  }

  void set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
  }

  size_t limit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return limit_;
  }

 private:
  struct Block {
    size_t size;
    size_t requested;  // the tensor's bytes rounded up to kSmallRound
    int pool;          // 0: the shared cache; else the graph pool it belongs to
  };
  struct Pool {
    FreeList free;
  };

  // Smallest cached block of `list` that fits and wastes at most half of
  // itself (a huge block is not pinned by a tiny tensor); nullptr if none.
  void* take_cached(FreeList& list, size_t size, size_t requested, int pool) {
    auto it = list.lower_bound(size);
    if (it == list.end() || it->first > 2 * size) return nullptr;
    void* ptr = it->second;
    const size_t block = it->first;
    list.erase(it);
    hand_out(ptr, block, requested, pool);
    return ptr;
  }

  // Where a released block is cached: the capturing graph's pool during a
  // capture, else the pool it belongs to while that graph lives, else the shared cache.
  FreeList& free_list_for(const Block& block) {
    if (capture_pool_ != 0) return pools_[capture_pool_].free;
    auto it = pools_.find(block.pool);
    return it != pools_.end() ? it->second.free : free_;
  }

  bool over_limit(size_t size) const { return limit_ != 0 && stats_.reserved + size > limit_; }

  // cudaMalloc within the limit; over it, the driver's out-of-memory error.
  cudaError_t device_malloc(void** ptr, size_t size) {
    return over_limit(size) ? cudaErrorMemoryAllocation : cudaMalloc(ptr, size);
  }

  void hand_out(void* ptr, size_t block, size_t requested, int pool) {
    live_.emplace(ptr, Block{block, requested, pool});
    stats_.in_use += block;
    stats_.requested += requested;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    if (stats_.requested > stats_.peak_requested) stats_.peak_requested = stats_.requested;
  }

  void free_cached_locked() {
    if (free_.empty()) return;
    // Cached blocks may still be read by queued work; let it finish first.
    HG_CUDA_CHECK(cudaStreamSynchronize(stream()));
    while (!free_.empty()) {
      auto it = free_.begin();
      HG_CUDA_CHECK(cudaFree(it->second));
      stats_.reserved -= it->first;
      free_.erase(it);
    }
  }

  std::mutex mutex_;
  size_t limit_ = 0;                       // set_memory_limit; 0: none
  FreeList free_;                          // the shared cache
  std::unordered_map<void*, Block> live_;  // handed-out block -> its size and pool
  std::map<int, Pool> pools_;              // live graphs' pools
  int capture_pool_ = 0;                   // the pool of the graph being captured, 0 when none
  int next_pool_ = 1;
  MemoryStats stats_;
  int64_t unknown_releases_ = 0;
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed, see top of file
  return *a;
}

}  // namespace

void* allocate(size_t bytes) { return allocator().allocate(bytes); }

// ---- CUDA graphs ---------------------------------------------------------------

Graph::~Graph() { reset(); }

void Graph::begin_capture() {
  reset();
  pool_ = allocator().begin_capture();
  const cudaError_t err = cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess) {
    allocator().end_capture();
    allocator().close_pool(pool_);
    pool_ = 0;
    throw_cuda_error(err, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
  capturing_ = true;
}

void Graph::end_capture() {
  if (!capturing_) fail("gpu::Graph::end_capture", "no capture in progress");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream(), &graph);
  allocator().end_capture();
  if (err != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    reset();
    throw_cuda_error(err, "cudaStreamEndCapture (was something in the captured work synchronizing with the host?)",
                     __FILE__, __LINE__);
  }
  graph_ = graph;
  try {
    memset_nodes_to_kernels(graph);
  } catch (...) {
    reset();
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    reset();
    throw_cuda_error(inst, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  exec_ = exec;
}

void Graph::abort_capture() noexcept {
  if (capturing_) {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream(), &graph);  // ends the (possibly invalidated) capture
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    allocator().end_capture();
  }
  reset();
}

void Graph::replay() {
  if (exec_ == nullptr) fail("gpu::Graph::replay", "nothing captured (call begin_capture / end_capture first)");
  HG_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()));
}

void Graph::reset() noexcept {
  if (capturing_) return abort_capture();
  if (exec_ != nullptr || graph_ != nullptr) {
    cudaStreamSynchronize(stream());  // a replay may still be running on the pool's blocks
    if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
    cudaGetLastError();
  }
  exec_ = nullptr;
  graph_ = nullptr;
  if (pool_ != 0) allocator().close_pool(pool_);
  pool_ = 0;
}
void release(void* ptr) { allocator().release(ptr); }
MemoryStats memory_stats() { return allocator().stats(); }
void reset_peak_memory() { allocator().reset_peak(); }
void empty_cache() { allocator().empty_cache(); }
void set_memory_limit(size_t bytes) { allocator().set_limit(bytes); }
size_t memory_limit() { return allocator().limit(); }

// ---- copies -----------------------------------------------------------------

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst == nullptr || src == nullptr)
    fail("gpu::copy_bytes", "null pointer for a copy of ", bytes, " bytes (dst ", dst, ", src ", src, ")");
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device == Device::CPU) kind = cudaMemcpyDeviceToHost;
  if (src_device == Device::CPU) kind = cudaMemcpyHostToDevice;
  HG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  // Host memory may be pageable and may be reused by the caller right after
  // we return, so a copy from or to the host completes before returning. A
  // device-to-device copy is ordered on the stream like a kernel: no wait
  // (and so it can be captured in a CUDA graph).
  if (kind != cudaMemcpyDeviceToDevice) HG_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void synchronize() { HG_CUDA_CHECK(cudaStreamSynchronize(stream())); }

// ---- timing -----------------------------------------------------------------

Timer::Timer() {
  cudaEvent_t start = nullptr, stop = nullptr;
  HG_CUDA_CHECK(cudaEventCreate(&start));
  const cudaError_t err = cudaEventCreate(&stop);
  if (err != cudaSuccess) {
    cudaEventDestroy(start);
    throw_cuda_error(err, "cudaEventCreate(&stop)", __FILE__, __LINE__);
  }
  start_ = start;
  stop_ = stop;
}

Timer::~Timer() {
  // Destructors must not throw; a failure here only leaks an event.
  if (start_) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void Timer::start() { HG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), stream())); }

float Timer::stop_ms() {
  auto stop = static_cast<cudaEvent_t>(stop_);
  HG_CUDA_CHECK(cudaEventRecord(stop, stream()));
  HG_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  HG_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), stop));
  return ms;
}

// ---- device facts -------------------------------------------------------------

namespace {
int current_device() {
  int device = 0;
  HG_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// One attribute of the current device.
int attribute(cudaDeviceAttr what) {
  int value = 0;
  HG_CUDA_CHECK(cudaDeviceGetAttribute(&value, what, current_device()));
  return value;
}
}  // namespace

int sm_count() {
  static const int count = attribute(cudaDevAttrMultiProcessorCount);
  return count;
}

int compute_capability() {
  static const int cc =
      attribute(cudaDevAttrComputeCapabilityMajor) * 10 + attribute(cudaDevAttrComputeCapabilityMinor);
  return cc;
}

double dram_peak_gbps() {
  static const double gbps = 2.0 * attribute(cudaDevAttrMemoryClockRate) * 1e3 *  // kHz, two transfers a clock
                             (attribute(cudaDevAttrGlobalMemoryBusWidth) / 8) * 1e-9;
  return gbps;
}

const char* device_name() {
  static const std::string name = [] {
    cudaDeviceProp prop{};
    HG_CUDA_CHECK(cudaGetDeviceProperties(&prop, current_device()));
    return std::string(prop.name);
  }();
  return name.c_str();
}

// ---- cuBLAS -------------------------------------------------------------------

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line) {
  std::ostringstream os;
  os << what << " failed at " << file << ":" << line << ": " << cublasGetStatusName(status) << ": "
     << cublasGetStatusString(status);
  throw Error(os.str());
}

cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    HG_CUBLAS_CHECK(cublasCreate(&h));
    HG_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    HG_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    return h;
  }();
  static cudaStream_t bound = nullptr;
  static bool bound_once = false;
  if (!bound_once || bound != stream()) {  // set_stream changed it (or first use)
    HG_CUBLAS_CHECK(cublasSetStream(handle, stream()));
    bound = stream();
    bound_once = true;
  }
  return handle;
}

}  // namespace hg::gpu

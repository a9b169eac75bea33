#include "core/cpu_matmul.hpp"

#include <algorithm>
#include <atomic>
#include <memory>

#include "core/aligned_scratch.hpp"
#include "core/cpu_gemm.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"

namespace hg::cpu {
namespace {

// The output of each batch entry is cut into tiles from its shape alone.
// Tiles start at 64 x 192 and are halved, larger side first, until there are
// kTasks per product (enough for 16 cores when m x n is small and k long, as
// in weight gradients) or they reach 16 rows and kColUnit columns. Products
// under kSerialFlops, and batches of at least kTasks entries (attention's
// per-head products), stay whole: one product per entry, the entries spread
// over the threads. On one thread a product without an epilogue stays whole:
// the level's own blocking runs the same kernel faster than tiles do (on the
// H200 machines' AVX-512 Xeon 7% faster on one, about 1.5x on another:
// docs/cpu.md); an epilogue (bias, GELU) keeps its tiles, where it runs on
// each tile while the tile is in cache.
//
// Tile widths are multiples of kColUnit (or the whole width), a multiple of
// every level's widest micro-panel (Eigen's 48 float32 columns at x86-64-v4,
// 24 at v3, 12 at the baseline; half that for float64), and heights are 64,
// 32 or 16 rows, multiples of its 4-row panels: a tile then holds the micro-
// panels the whole product holds at the same places, so tiled and whole
// products give the same bits and the result does not depend on the thread
// count (tests/test_cpu_threads.cpp).
struct Tiles {
  int64_t rows, cols, row_tiles, col_tiles;
};

constexpr int64_t kSerialFlops = int64_t(1) << 17, kTasks = 16, kColUnit = 48;

Tiles tiles_for(const MatmulShape& s) {
  if (s.m * s.n * s.k < kSerialFlops || s.batch >= kTasks) return {s.m, s.n, 1, 1};
  int64_t rows = std::min<int64_t>(s.m, 64);
  int64_t cols = s.n <= kColUnit ? s.n : std::min<int64_t>(s.n / kColUnit, 4) * kColUnit;
  auto count = [&] { return pieces(s.m, rows) * pieces(s.n, cols); };
  const auto cols_halve = [&] { return cols % (2 * kColUnit) == 0; };
  while (count() < kTasks && (rows > 16 || cols_halve())) {
    if (cols_halve() && (cols >= 2 * rows || rows <= 16)) cols /= 2;
    else rows /= 2;
  }
  return {rows, cols, pieces(s.m, rows), pieces(s.n, cols)};
}

template <class T>
GemmBlock<T> entry_block(const T* a, const T* b, T* c, const MatmulShape& s, int64_t i, bool ta, bool tb) {
  GemmBlock<T> g;
  g.rows = s.m;
  g.cols = s.n;
  g.depth = s.k;
  g.a = a + i * s.m * s.k;
  g.lda = ta ? s.m : s.k;
  g.transpose_a = ta;
  g.b = b + (s.b_shared ? 0 : i * s.k * s.n);
  g.ldb = tb ? s.k : s.n;
  g.transpose_b = tb;
  g.c = c + i * s.m * s.n;
  g.ldc = s.n;
  return g;
}

template <class T>
const PackedGemm<T>& packed_gemm();
template <>
const PackedGemm<float>& packed_gemm<float>() {
  return packed_gemm_f32();
}
template <>
const PackedGemm<double>& packed_gemm<double>() {
  return packed_gemm_f64();
}

// A panel is packed into the shared buffer by the first tile that needs it.
// A tile that finds it still being packed by another thread packs its own
// copy (same bits) instead of waiting: that thread may have been descheduled
// on a busy machine, and waiting for it made two threads slower than one.
class PanelStates {
 public:
  explicit PanelStates(int64_t n) : s_(new std::atomic<int>[static_cast<size_t>(n)]) {
    for (int64_t i = 0; i < n; ++i) s_[i].store(kUnpacked, std::memory_order_relaxed);
  }
  // The panel: `shared` once packed there, else `own` after packing it there.
  template <class T, class Pack>
  const T* get(int64_t i, T* shared, T* own, const Pack& pack) {
    int state = s_[i].load(std::memory_order_acquire);
    if (state == kReady) return shared;
    if (state == kUnpacked && s_[i].compare_exchange_strong(state, kPacking, std::memory_order_acquire)) {
      pack(shared);
      s_[i].store(kReady, std::memory_order_release);
      return shared;
    }
    if (s_[i].load(std::memory_order_acquire) == kReady) return shared;
    pack(own);
    return own;
  }

 private:
  static constexpr int kUnpacked = 0, kPacking = 1, kReady = 2;
  std::unique_ptr<std::atomic<int>[]> s_;
};

// One product, tile by tile, in one parallel call: per depth block, each of
// op(A)'s row tiles and op(B)'s column tiles is packed once, by the first
// tile that needs it, and every tile multiplies its two panels block after
// block. Which tile holds an element and the depth blocks depend on the shape
// alone, so its k-order does too.
template <class T>
void packed_product(const GemmBlock<T>& g, const Tiles& t, const MatmulEpilogue<T>* epilogue) {
  const PackedGemm<T>& p = packed_gemm<T>();
  const int64_t kc_max = std::min(g.depth, p.depth_block(g.rows, g.cols, g.depth));
  const int64_t blocks = pieces(g.depth, kc_max);
  // Each panel (tile, depth block) starts 64-byte aligned.
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  const int64_t align = 64 / sizeof(T), row_panel = round_up(round_up(t.rows, p.row_multiple) * kc_max, align),
                col_panel = round_up(round_up(t.cols, p.col_multiple) * kc_max, align);
  // The calling thread's buffers (workers use them only inside its call),
  // 64-byte aligned: the kernels load the packed panels with aligned loads.
  thread_local AlignedScratch row_scratch, col_scratch;
  T* rows_buf = static_cast<T*>(row_scratch.get(sizeof(T) * blocks * t.row_tiles * row_panel));
  T* cols_buf = static_cast<T*>(col_scratch.get(sizeof(T) * blocks * t.col_tiles * col_panel));
  PanelStates row_states(blocks * t.row_tiles), col_states(blocks * t.col_tiles);
  parallel_for(t.row_tiles * t.col_tiles, g.rows * g.cols * g.depth, [&](int64_t task) {
    const int64_t i = task / t.col_tiles, j = task % t.col_tiles, r0 = i * t.rows, c0 = j * t.cols;
    const int64_t rows = std::min(t.rows, g.rows - r0), cols = std::min(t.cols, g.cols - c0);
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t k0 = kb * kc_max, kc = std::min(kc_max, g.depth - k0);
      thread_local AlignedScratch own_rows, own_cols;
      const T* row_panel_at = row_states.get(kb * t.row_tiles + i, rows_buf + (kb * t.row_tiles + i) * row_panel,
                                             static_cast<T*>(own_rows.get(sizeof(T) * row_panel)),
                                             [&](T* to) { p.pack_rows(g, k0, kc, r0, rows, to); });
      const T* col_panel_at = col_states.get(kb * t.col_tiles + j, cols_buf + (kb * t.col_tiles + j) * col_panel,
                                             static_cast<T*>(own_cols.get(sizeof(T) * col_panel)),
                                             [&](T* to) { p.pack_cols(g, k0, kc, c0, cols, to); });
      p.multiply(g, kc, r0, rows, c0, cols, row_panel_at, col_panel_at, kb == 0, kb == blocks - 1);
    }
    if (epilogue && epilogue->finish) epilogue->finish(r0, rows, c0, cols);
  });
}

}  // namespace

bool matmul_runs_whole_products(int64_t batch, int64_t m, int64_t n, int64_t k) {
  MatmulShape s;
  s.batch = batch, s.m = m, s.n = n, s.k = k;
  const Tiles t = tiles_for(s);
  return t.row_tiles * t.col_tiles == 1;
}

template <class T>
void matmul(const T* a, const T* b, T* c, const MatmulShape& s, bool ta, bool tb, bool accumulate,
            const MatmulEpilogue<T>* epilogue) {
  HG_CHECK(epilogue == nullptr || s.batch == 1, "cpu::matmul", "an epilogue needs one product, got a batch of ",
           s.batch);
  const Tiles t = tiles_for(s);
  if (t.row_tiles * t.col_tiles > 1 && (num_threads() > 1 || epilogue != nullptr)) {
    for (int64_t i = 0; i < s.batch; ++i) {
      GemmBlock<T> g = entry_block(a, b, c, s, i, ta, tb);
      g.accumulate = accumulate;
      g.bias = epilogue ? epilogue->bias : nullptr;
      packed_product(g, t, epilogue);
    }
    return;
  }
  parallel_for(s.batch, s.batch * s.m * s.n * s.k, [&](int64_t i) {
    GemmBlock<T> g = entry_block(a, b, c, s, i, ta, tb);
    g.accumulate = accumulate;
    g.bias = epilogue ? epilogue->bias : nullptr;
    gemm(g);
    if (epilogue && epilogue->finish) epilogue->finish(0, s.m, 0, s.n);
  });
}

template void matmul(const float*, const float*, float*, const MatmulShape&, bool, bool, bool,
                     const MatmulEpilogue<float>*);
template void matmul(const double*, const double*, double*, const MatmulShape&, bool, bool, bool,
                     const MatmulEpilogue<double>*);

}  // namespace hg::cpu

#pragma once
// What each kernel of a stretch of GPU work costs, from CUPTI's activity
// records: the kernels inside a CUDA graph are recorded one by one, which
// the step's own CUDA events cannot show. Used by bench_train
// --kernel-trace to show where a captured training step's time goes, and
// how much of it the GPU runs no kernel at all (launch gaps, tails).
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace hg::bench {

struct KernelTime {
  std::string name;  // demangled, template arguments cut
  int64_t calls = 0;
  double total_us = 0;
};

// One record of the window: a kernel, memset or copy on its stream.
struct KernelEvent {
  std::string name;  // as short_kernel_name gives it
  uint32_t stream = 0;
  double start_us = 0, end_us = 0;  // from the window's first start
};

struct KernelTraceResult {
  std::vector<KernelTime> kernels;  // by total time, largest first
  std::vector<KernelEvent> events;  // every record, by start
  int64_t launches = 0;             // kernels, memsets and copies in the window
  double span_us = 0;               // first start to last end
  double busy_us = 0;               // the union of their intervals
};

// Whether this build can trace (CUPTI found at configure time).
bool kernel_trace_available();

// Turns on kernel, memset and copy records; call before the work to trace
// is first launched or captured. Throws hg::Error in a build without CUPTI.
void kernel_trace_enable();

// The records between open and close (each a synchronisation point: the
// work before open is excluded, the work before close is complete).
void kernel_trace_open();
KernelTraceResult kernel_trace_close();

// Writes traces as Chrome trace events (JSON that ui.perfetto.dev and
// chrome://tracing open): each labelled trace a process, each CUDA stream
// a row of it, so what ran beside what can be seen.
void write_chrome_trace(std::ostream& out, const std::vector<std::pair<std::string, KernelTraceResult>>& traces);

// A kernel's name as shown: demangled, without its template arguments and
// parameter list ("void hg::gpu::f<float, 4>(float*)" -> "hg::gpu::f"); a
// label in parentheses ("(memset)") as it is.
std::string short_kernel_name(const std::string& name);

}  // namespace hg::bench

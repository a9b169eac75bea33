#include "bench/kernel_trace.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

#ifdef HG_HAVE_CUPTI
#include <cuda_runtime.h>
#include <cupti.h>
#endif

namespace hg::bench {

std::string short_kernel_name(const std::string& name) {
  if (name.empty() || name.front() == '(') return name;  // a label such as "(memset)", not a symbol
  std::string s = name;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                   std::free);
  if (status == 0 && demangled) s = demangled.get();
  // "(anonymous namespace)::" is scope, not a parameter list.
  for (const std::string anon = "(anonymous namespace)::"; s.find(anon) != std::string::npos;)
    s.erase(s.find(anon), anon.size());
  // Drop the parameter list, then every template argument list.
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' && depth == 0) break;
    if (c == '<') ++depth;
    if (depth == 0) out += c;
    if (c == '>' && depth > 0) --depth;
  }
  // A leading return type ("void ") is not part of the name.
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  return out;
}

void write_chrome_trace(std::ostream& out, const std::vector<std::pair<std::string, KernelTraceResult>>& traces) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t pid = 0; pid < traces.size(); ++pid) {
    const auto& [label, trace] = traces[pid];
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", label}}}});
    std::set<uint32_t> named;  // streams whose row has its name
    for (const KernelEvent& e : trace.events) {
      if (named.insert(e.stream).second)
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", e.stream},
                          {"args", {{"name", "stream " + std::to_string(e.stream)}}}});
      events.push_back({{"name", e.name},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", e.stream},
                        {"ts", e.start_us},
                        {"dur", e.end_us - e.start_us}});
    }
  }
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump() << '\n';
}

#ifdef HG_HAVE_CUPTI
namespace {

struct Interval {
  uint64_t start, end;
  std::string name;
  uint32_t stream;
};

std::mutex g_mutex;
std::vector<Interval> g_records;
bool g_enabled = false;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  fail("kernel trace", what, " failed: ", text != nullptr ? text : "unknown CUPTI error");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = size_t(4) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer != nullptr ? kBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_records.push_back({k->start, k->end, k->name != nullptr ? k->name : "?", k->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        g_records.push_back({m->start, m->end, "(memset)", m->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        g_records.push_back({m->start, m->end, "(memcpy)", m->streamId});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
}

std::vector<Interval> take_records() {
  if (cudaDeviceSynchronize() != cudaSuccess) fail("kernel trace", "the traced work failed on the GPU");
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(g_records, {});
}

}  // namespace

bool kernel_trace_available() { return true; }

void kernel_trace_enable() {
  if (g_enabled) return;
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  g_enabled = true;
}

void kernel_trace_open() {
  HG_CHECK(g_enabled, "kernel trace", "kernel_trace_enable() must come first");
  (void)take_records();  // everything before the window
}

KernelTraceResult kernel_trace_close() {
  HG_CHECK(g_enabled, "kernel trace", "kernel_trace_enable() must come first");
  std::vector<Interval> records = take_records();
  KernelTraceResult r;
  r.launches = static_cast<int64_t>(records.size());
  if (records.empty()) return r;
  std::sort(records.begin(), records.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::map<std::string, KernelTime> by_name;
  const uint64_t first = records.front().start;
  uint64_t covered_end = first, busy = 0;
  for (const Interval& i : records) {
    const std::string name = short_kernel_name(i.name);
    r.events.push_back(
        {name, i.stream, static_cast<double>(i.start - first) * 1e-3, static_cast<double>(i.end - first) * 1e-3});
    KernelTime& k = by_name[name];
    ++k.calls;
    k.total_us += static_cast<double>(i.end - i.start) * 1e-3;
    // Union of the intervals (they may overlap on other streams).
    const uint64_t from = std::max(i.start, covered_end);
    if (i.end > from) busy += i.end - from;
    covered_end = std::max(covered_end, i.end);  // ends as the last end
  }
  r.span_us = static_cast<double>(covered_end - first) * 1e-3;
  r.busy_us = static_cast<double>(busy) * 1e-3;
  for (auto& [name, k] : by_name) {
    k.name = name;
    r.kernels.push_back(k);
  }
  std::sort(r.kernels.begin(), r.kernels.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_us > b.total_us; });
  return r;
}

#else

bool kernel_trace_available() { return false; }
void kernel_trace_enable() { fail("kernel trace", "this build has no CUPTI (CUDA's profiling library)"); }
void kernel_trace_open() { kernel_trace_enable(); }
KernelTraceResult kernel_trace_close() {
  kernel_trace_enable();
  return {};
}

#endif

}  // namespace hg::bench

#pragma once
// gemm_lab's report: what one case's candidates came to (Result), its line,
// and the summary over all cases (epilogue forms against their plain GEMM,
// the plain GEMMs' gain, the step's GEMM time, where the fastest came from).
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/lab/gemm_lab_cases.cuh"
#include "bench/lab/gemm_lab_lt.cuh"

namespace gemm_lab {

struct Result {
  int offered = 0, ran = 0, passed = 0, failed = 0;  // failed: an allowed (fp32-partial) candidate off its bound
  double first_ms = 0;                               // lt#1, what gemm_lt runs (0: none ran)
  bool first_ok = false;
  double best_ms = 0;  // fastest allowed candidate that passed, any knob (0: none)
  std::string best_label;
  double best_lt_ms = 0;        // the same among lt's own list
  double bf16_partials_ms = 0;  // fastest candidate with bf16 split-K sums (outside gemm_lt's mask)
};

inline Result summarize(const std::vector<Candidate>& cands) {
  Result r;
  r.offered = int(cands.size());
  for (const Candidate& cand : cands) {
    if (!cand.ran) continue;
    ++r.ran;
    const bool lt = kKnobs[cand.knob].name == std::string("lt");
    if (lt && cand.rank == 1) r.first_ms = cand.ms, r.first_ok = cand.checked_ok;
    if (!cand.fp32_partials) {
      if (r.bf16_partials_ms == 0 || cand.ms < r.bf16_partials_ms) r.bf16_partials_ms = cand.ms;
      continue;
    }
    if (!cand.checked_ok) {
      ++r.failed;
      continue;
    }
    ++r.passed;
    if (r.best_ms == 0 || cand.ms < r.best_ms) r.best_ms = cand.ms, r.best_label = cand.label;
    if (lt && (r.best_lt_ms == 0 || cand.ms < r.best_lt_ms)) r.best_lt_ms = cand.ms;
  }
  return r;
}

inline void print_candidate(bool verbose, const Case& c, const Candidate& cand, const Result& r) {
  const bool bad = cand.ran && cand.fp32_partials && !cand.checked_ok;
  if (!verbose && !bad) return;
  const char mark = cand.label == r.best_label ? '+' : (cand.label == "lt#1" ? '*' : ' ');
  if (!cand.ran) {
    std::printf("    %c %-10s %s  not runnable\n", mark, cand.label.c_str(), cand.config.c_str());
    return;
  }
  std::printf("    %c %-10s %s %9.1f us %6.1f TF/s  err/bound %.2f  off #1: %llu %s\n", mark, cand.label.c_str(),
              cand.config.c_str(), cand.ms * 1e3, c.flops() / cand.ms / 1e9, cand.worst,
              (unsigned long long)cand.disagree,
              cand.checked_ok ? "ok" : (cand.fp32_partials ? "FAILED" : "off (bf16 split-K sums, excluded)"));
}

inline double tflops(const Case& c, double ms) { return ms > 0 ? c.flops() / ms / 1e9 : 0; }
inline double overhead(double ms, double plain_ms) { return ms > 0 && plain_ms > 0 ? 100 * (ms / plain_ms - 1) : NAN; }

inline void print_header(double peak) {
  std::printf("TF = TFLOP/s (2 M N K / median), %% of %.0f peak; #1 = lt#1 (gemm_lt's choice); best = fastest "
              "candidate with fp32 split-K sums that passed both checks; 'vs plain' = time over the plain GEMM's "
              "of the same shape\n",
              peak);
  std::printf("%-9s %-4s %-5s %-13s %6s %6s %6s | %-15s | %-27s | %-22s | %s\n", "model", "layer", "pass", "epilogue",
              "M", "N", "K", "#1 TF (%peak)", "best TF (%peak) label gain", "vs plain: #1    best", "ok/ran");
}

inline void print_case(double peak, const Case& c, const Result& r, const Result* plain, const char* again) {
  std::printf("%-9s %-4s %-5s %-13s %6lld %6lld %6lld | ", c.model.c_str(), c.layer.c_str(), pass_name(c.pass),
              epi_name(c.epi), (long long)c.m, (long long)c.n, (long long)c.k);
  if (r.ran == 0) {
    std::printf("no algorithm runs (gemm_lt falls back)\n");
    return;
  }
  std::printf("%6.1f (%4.1f%%)%s | ", tflops(c, r.first_ms), 100 * tflops(c, r.first_ms) / peak,
              r.first_ok ? " " : "!");
  std::printf("%6.1f (%4.1f%%) %-8s %+5.1f%% | ", tflops(c, r.best_ms), 100 * tflops(c, r.best_ms) / peak,
              r.best_label.c_str(), overhead(r.first_ms, r.best_ms));
  if (plain)
    std::printf("%+6.1f%% %+6.1f%% | ", overhead(r.first_ms, plain->first_ms), overhead(r.best_ms, plain->best_ms));
  else std::printf("%22s | ", "");
  std::printf("%d/%d%s%s\n", r.passed, r.ran, r.failed ? " FAILED" : "", again);
}

// Per model: the step's GEMM time with lt#1, with the fastest candidate, and
// with the fastest of lt's own list.
inline void print_step_totals(const std::vector<Case>& cases, const std::vector<Result>& results) {
  std::map<std::string, std::array<double, 3>> totals;
  std::vector<std::string> order;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (cases[i].per_step == 0) continue;
    if (!totals.count(cases[i].model)) order.push_back(cases[i].model);
    auto& t = totals[cases[i].model];
    const Result& r = results[i];
    t[0] += cases[i].per_step * r.first_ms;
    t[1] += cases[i].per_step * (r.best_ms > 0 ? r.best_ms : r.first_ms);
    t[2] += cases[i].per_step * (r.best_lt_ms > 0 ? r.best_lt_ms : r.first_ms);
  }
  std::printf("GEMM time of one training step (each form x its calls; the head's last chunk as a fraction):\n");
  for (const std::string& m : order) {
    const auto& t = totals[m];
    std::printf("  %-9s lt#1 %8.3f ms | fastest %8.3f ms (%+5.1f%% time) | fastest of lt's list %8.3f ms (%+5.1f%%)\n",
                m.c_str(), t[0], t[1], 100 * (t[1] / t[0] - 1), t[2], 100 * (t[2] / t[0] - 1));
  }
}

inline void print_summary(const std::vector<Case>& cases, const std::vector<Result>& results,
                          const std::map<std::string, size_t>& first_of) {
  std::printf("\nsummary\n");
  int forms = 0, within_first = 0, within_best = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (c.epi == Epi::None || c.per_step == 0 || first_of.at(c.key()) != i) continue;
    Case plain_case = c;
    plain_case.epi = Epi::None;
    const Result& r = results[i];
    const Result& p = results[first_of.at(plain_case.key())];
    const double of = overhead(r.first_ms, p.first_ms), ob = overhead(r.best_ms, p.best_ms);
    ++forms;
    within_first += of <= 5;
    within_best += ob <= 5;
    if (!(ob <= 5))
      std::printf("  over 5%%: %-9s %-4s %-5s %-13s best %+6.1f%% (#1 %+6.1f%%) over the plain GEMM\n", c.model.c_str(),
                  c.layer.c_str(), pass_name(c.pass), epi_name(c.epi), ob, of);
  }
  std::printf("epilogue forms within 5%% of the plain GEMM of their shape: lt#1 vs lt#1 %d of %d; fastest vs "
              "fastest %d of %d\n",
              within_first, forms, within_best, forms);
  double log_sum = 0, largest = 0;
  int plain = 0, bf16_faster = 0;
  std::string largest_at;
  double bf16_gain = 0;
  std::map<std::string, int> best_knob;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    if (first_of.at(c.key()) != i || r.best_ms == 0 || r.first_ms == 0) continue;
    ++best_knob[r.best_label.substr(0, r.best_label.find('#'))];
    if (r.bf16_partials_ms > 0 && r.bf16_partials_ms < r.best_ms) {
      ++bf16_faster;
      bf16_gain = std::max(bf16_gain, 100 * (r.best_ms / r.bf16_partials_ms - 1));
    }
    if (c.epi != Epi::None) continue;
    const double gain = r.first_ms / r.best_ms;
    ++plain;
    log_sum += std::log(gain);
    if (gain - 1 > largest) largest = gain - 1, largest_at = c.model + " " + c.layer + " " + pass_name(c.pass);
  }
  if (plain)
    std::printf("plain GEMMs (%d shapes): fastest over lt#1 %+.1f%% TFLOP/s (geometric mean), largest %+.1f%% (%s)\n",
                plain, 100 * (std::exp(log_sum / plain) - 1), 100 * largest, largest_at.c_str());
  print_step_totals(cases, results);
  std::printf("where the fastest came from (shapes):");
  for (const auto& [knob, n] : best_knob) std::printf(" %s %d", knob.c_str(), n);
  std::printf("\nbf16 split-K sums (outside gemm_lt's mask) faster than the fastest allowed: %d shapes, by up to "
              "%.1f%%\n",
              bf16_faster, bf16_gain);
}

}  // namespace gemm_lab

#!/usr/bin/env bash
# The whole GPU job in one call (for the lent H100): build for sm_90, run every
# test, then the benchmarks; logs, CSVs and plots go to $OUT (default out/).
# Usage: scripts/gpu_check.sh [tests|bench|sanitize|all]...   (default: tests bench)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
out="${OUT:-out}"
mkdir -p "$out"
stages=("$@")
((${#stages[@]})) || stages=(tests bench)
has() { local s; for s in "${stages[@]}"; do [[ $s == "$1" || $s == all ]] && return 0; done; return 1; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ >> "$out/gpu.txt"

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if ! { cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
         && cmake --build build-gpu -j"$(nproc)"; } > "$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -40
  echo "BUILD FAILED"; exit 1
fi

status=0
if has tests; then
  ctest --test-dir build-gpu --output-on-failure -j4 --timeout 600 > "$out/ctest.log" 2>&1 || status=1
  # Per-binary Catch2 summaries: how many GPU assertions actually ran.
  for t in build-gpu/tests/test_*; do
    [[ -x $t ]] && echo "$(basename "$t"): $("$t" 2>&1 | grep -E '^(All tests passed|test cases:)' | tail -1)"
  done > "$out/test_summary.txt"
  tail -15 "$out/ctest.log"; cat "$out/test_summary.txt"
fi
if has sanitize; then
  for tool in memcheck racecheck initcheck; do
    for t in build-gpu/tests/test_cuda_backend build-gpu/tests/test_layernorm build-gpu/tests/test_softmax build-gpu/tests/test_models build-gpu/tests/test_determinism build-gpu/tests/test_validation; do
      [[ -x $t ]] || continue
      echo "== $tool $(basename "$t")" >> "$out/sanitize.log"
      compute-sanitizer --tool "$tool" --error-exitcode 3 "$t" '[cuda]' >> "$out/sanitize.log" 2>&1 \
        && echo "$tool $(basename "$t"): clean" >> "$out/sanitize_summary.txt" \
        || { echo "$tool $(basename "$t"): ERRORS" >> "$out/sanitize_summary.txt"; status=1; }
    done
  done
  cat "$out/sanitize_summary.txt"
fi
if has bench; then
  b=build-gpu/bench
  run_bench() {  # name, args...
    local name=$1; shift
    "$b/$name" --device cuda "$@" > "$out/$name.txt" 2>&1 || { echo "$name FAILED"; status=1; }
    tail -45 "$out/$name.txt"
  }
  run_bench bench_layernorm --csv "$out/bench_layernorm.csv"
  run_bench bench_softmax --csv "$out/bench_softmax.csv"
  run_bench bench_train --csv "$out/bench_train.csv" --breakdown-csv "$out/bench_train_breakdown.csv"
  plot=scripts/plot_bench.py
  python3 $plot "$out/bench_layernorm.csv" -o "$out/bench_layernorm.png" --where device=cuda --where M=4096 \
      --series pass,dtype,impl --hline 3000:copy --title "LayerNorm, H100, M=4096" || true
  python3 $plot "$out/bench_softmax.csv" -o "$out/bench_softmax.png" --x T --where device=cuda \
      --series pass,variant,dtype,impl --hline 3000:copy --title "Attention softmax, H100" || true
fi
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz . 2>/dev/null
exit $status

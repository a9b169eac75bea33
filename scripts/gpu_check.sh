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
  for b in build-gpu/bench/bench_*; do
    [[ -x $b ]] || continue
    name=$(basename "$b")
    "$b" --device cuda --csv "$out/$name.csv" > "$out/$name.txt" 2>&1 || { echo "$name FAILED"; status=1; }
    python3 scripts/plot_bench.py "$out/$name.csv" "$out/$name.png" >/dev/null 2>&1 || true
    tail -40 "$out/$name.txt"
  done
fi
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz . 2>/dev/null
exit $status

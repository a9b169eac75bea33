#!/usr/bin/env bash
# The whole GPU job in one command (on an H100 or H200 machine): build for sm_90, run every
# test, then the benchmarks; logs, CSVs and plots go to $OUT (default out/).
# Usage: scripts/gpu_check.sh [tests|bench|sanitize|all]...   (default: tests bench)
# HG_TEST_TIMEOUT caps each test program (seconds, default 900).
# HG_TEST_PROGS (space-separated test program names) builds only those test
# programs and the benchmarks, and runs only those tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
# This is the GPU machine: a GPU test that would skip for want of a GPU fails
# instead (tests/test_util.hpp). HG_REQUIRE_CUDA=0 turns that off.
export HG_REQUIRE_CUDA="${HG_REQUIRE_CUDA:-1}"
export HG_TEST_TIMEOUT="${HG_TEST_TIMEOUT:-900}"
out="${OUT:-out}"
mkdir -p "$out"
stages=("$@")
((${#stages[@]})) || stages=(tests bench)
has() { local s; for s in "${stages[@]}"; do [[ $s == "$1" || $s == all ]] && return 0; done; return 1; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ >> "$out/gpu.txt"

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
targets=()
if [[ -n ${HG_TEST_PROGS:-} ]]; then
  read -ra targets <<< "$HG_TEST_PROGS"
  targets=(--target "${targets[@]}" $(ls bench/bench_*.cpp | xargs -n1 basename | sed 's/\.cpp$//'))
fi
# The Python module builds where pip's pybind11 is importable (the GPU image has no pybind11-dev).
py=(); pyb=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null) \
  && py=(-DPython3_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$pyb")
if ! { cmake -S . -B build-gpu "${gen[@]}" "${py[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
         && cmake --build build-gpu -j"$(nproc)" "${targets[@]}"; } > "$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -40
  echo "BUILD FAILED"; exit 1
fi

status=0
if has tests; then
  # Each test program once, in parallel, its whole output kept; the summary
  # line of each shows how many assertions ran (GPU cases included).
  mkdir -p "$out/tests"
  # test_dist_ranks tests two ranks at once: it runs under mpirun below, not alone.
  if [[ -n ${HG_TEST_PROGS:-} ]]; then printf 'build-gpu/tests/%s\n' $HG_TEST_PROGS; else ls build-gpu/tests/test_*; fi |
    grep -v '/test_dist_ranks$' | xargs -P 6 -I{} bash -c 't={}; n=$(basename $t); timeout ${HG_TEST_TIMEOUT:-900} $t > '"$out"'/tests/$n.log 2>&1 && echo "$n: PASS" || echo "$n: FAIL rc=$?"' \
    | sort > "$out/test_status.txt"
  if [[ -x build-gpu/tests/test_dist_ranks ]]; then
    root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
    if (($(nvidia-smi -L | wc -l) >= 2)) && command -v mpirun >/dev/null; then
      # NVLink multicast stays off (NCCL_NVLS_ENABLE=0) on the shared multi-GPU hosts.
      NCCL_NVLS_ENABLE=0 timeout "$HG_TEST_TIMEOUT" mpirun -np 2 "${root[@]}" -x NCCL_NVLS_ENABLE -x HG_REQUIRE_CUDA \
        build-gpu/tests/test_dist_ranks > "$out/tests/test_dist_ranks.log" 2>&1 \
        && echo "test_dist_ranks: PASS (2 ranks, 2 GPUs)" || echo "test_dist_ranks: FAIL rc=$? (2 ranks, 2 GPUs)"
    else
      echo "test_dist_ranks: SKIPPED (needs 2 GPUs and mpirun; CTest runs its CPU cases on 2 ranks)"
    fi >> "$out/test_status.txt"
  fi
  for f in "$out"/tests/*.log; do
    echo "$(basename "$f" .log): $(grep -E '^(All tests passed|test cases:)' "$f" | tail -1) $(grep -c 'SKIPPED' "$f") skipped"
  done > "$out/test_summary.txt"
  # The Python module's suite, where it was built (pip's pybind11 found). Where handgrad._torch_ext
  # was built too, the suite requires it (HG_TORCH_EXT=1) and handgrad.torch's tests run again on
  # the Python autograd Functions (HG_TORCH_EXT=0), as CTest does.
  if [[ -d build-gpu/python/handgrad && -z ${HG_TEST_PROGS:-} ]]; then
    runs=("python_tests auto discover -s python/tests -t python/tests")
    if compgen -G "build-gpu/python/handgrad/_torch_ext*.so" > /dev/null; then
      runs=("python_tests 1 discover -s python/tests -t python/tests"
            "python_tests_torch_fallback 0 discover -s python/tests -t python/tests -p test_torch.py")
    fi
    for run in "${runs[@]}"; do
      read -r name ext args <<< "$run"
      if HG_TORCH_EXT=$ext PYTHONPATH=build-gpu/python timeout "$HG_TEST_TIMEOUT" python3 -m unittest $args \
           > "$out/tests/$name.log" 2>&1; then
        echo "$name: PASS" >> "$out/test_status.txt"
      else
        echo "$name: FAIL" >> "$out/test_status.txt"
      fi
      echo "$name: $(tail -1 "$out/tests/$name.log") $(grep -c 'skipped' "$out/tests/$name.log") skipped" \
        >> "$out/test_summary.txt"
    done
  fi
  grep -q FAIL "$out/test_status.txt" && status=1
  cat "$out/test_status.txt" "$out/test_summary.txt"
fi
if has sanitize; then
  # Every test program with [cuda] cases, under each tool, in parallel (the
  # GPU is shared; the tools slow kernels 10-100x). Each pair gets a time cap.
  : > "$out/sanitize_summary.txt"
  mkdir -p "$out/sanitize"
  # Cases tagged [api-errors] provoke CUDA API failures on purpose (a 1 PiB
  # cudaMalloc must become an hg::Error); the tools would count those, so they
  # run separately with API-error reporting off and every other check on.
  sanitize_one() {  # tool test shard [filter] [extra tool flags...]; shard: a D range for test_layernorm_kernels, or -
    local tool=$1 prog=$2 shard=$3 filter=${4:-'[cuda]~[api-errors]'}; shift 4 2>/dev/null || shift $#
    local name="${tool}_${prog}" what="$tool $prog"
    unset HG_KERNEL_WIDTHS HG_KERNEL_ROWS_CAP
    if [[ $shard != - ]]; then export HG_KERNEL_WIDTHS=$shard; name+="_D$shard"; what+=" D=$shard"; fi
    # racecheck on the cluster kernels (16384 < D <= 131072): fewer rows (see the test).
    if [[ $tool == racecheck && $shard != - && ${shard%%-*} -gt 16384 && ${shard%%-*} -le 131072 ]]; then
      export HG_KERNEL_ROWS_CAP=19; what+=" rows<=19"
    fi
    case $filter in *'~'*) ;; '[api-errors]') name+=_api ;; *) name+="_${filter//[^a-z-]/}" ;; esac
    local log="$OUT_DIR/sanitize/$name.log"
    if timeout "${HG_SANITIZE_TIMEOUT:-540}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$@" \
         "build-gpu/tests/$prog" "$filter" > "$log" 2>&1; then
      echo "$what $filter: clean ($(grep -oE '(ERROR|RACECHECK) SUMMARY.*' "$log" | tail -1))"
    else
      echo "$what $filter: FAILED rc=$? ($(grep -oE '(ERROR|RACECHECK) SUMMARY.*|(All tests passed|test cases:).*' "$log" | tail -2 | tr '\n' ' '))"
    fi
  }
  export -f sanitize_one; export OUT_DIR="$out"
  # HG_SANITIZE_PROGS (space-separated names) narrows the run to some programs.
  progs=${HG_SANITIZE_PROGS:-$(grep -l '\[cuda\]' tests/test_*.cpp | xargs -n1 basename | sed 's/\.cpp$//')}
  # test_layernorm_kernels walks every kernel layout up to D = 140000; whole,
  # it outlasts the cap under racecheck, so it runs as shards of D (together
  # they cover every D), started first since they are the slowest jobs.
  # HG_KERNEL_SHARDS and HG_SANITIZE_TOOLS narrow a re-run.
  kernel_shards=${HG_KERNEL_SHARDS:-"1-1024 1025-4096 4097-16384 16385-16385 16386-16392 16393-40000 40001-65536 65537-100003 100004-131072 131073-1000000000"}
  tools=${HG_SANITIZE_TOOLS:-"memcheck racecheck initcheck"}
  for tool in $tools; do for p in $progs; do
    [[ $p == test_layernorm_kernels ]] || continue
    for d in $kernel_shards; do
      # Clusters of 7 and 8 (D > 65536) under racecheck: one job per test case.
      if [[ $tool == racecheck && ${d%%-*} -gt 65536 && ${d%%-*} -le 131072 ]]; then
        for tag in '[layouts]' '[reproducible]' '[hostile]' '[few-rows]'; do echo "$tool $p $d $tag"; done
      else
        echo "$tool $p $d"
      fi
    done
  done; done > "$out/sanitize_jobs.txt"
  for tool in $tools; do for p in $progs; do
    [[ $p == test_layernorm_kernels ]] || echo "$tool $p -"
  done; done >> "$out/sanitize_jobs.txt"
  xargs -P "${HG_SANITIZE_JOBS:-8}" -L1 bash -c 'sanitize_one "$0" "$@"' < "$out/sanitize_jobs.txt" \
    | sort >> "$out/sanitize_summary.txt"
  if [[ " $progs " == *" test_cuda_backend "* && " $tools " == *" memcheck "* ]]; then
    sanitize_one memcheck test_cuda_backend - '[api-errors]' --report-api-errors no >> "$out/sanitize_summary.txt"
  fi
  grep -q FAILED "$out/sanitize_summary.txt" && status=1
  cat "$out/sanitize_summary.txt"
  tar czf "$out/sanitize_logs.tgz" -C "$out" sanitize && rm -rf "$out/sanitize"
fi
if has bench; then
  b=build-gpu/bench
  run_bench() {  # program, log name, args...
    local prog=$1 name=$2; shift 2
    "$b/$prog" --device cuda "$@" > "$out/$name.txt" 2>&1 || { echo "$name FAILED"; status=1; }
    tail -45 "$out/$name.txt"
  }
  run_bench bench_layernorm bench_layernorm --csv "$out/bench_layernorm.csv" --png "$out/bench_layernorm.png"
  # Rows past 16384 (backward: cluster kernels up to 131072; forward, and beyond: chunked): fused
  # only, since the unfused op at these widths would take most of the run.
  run_bench bench_layernorm bench_layernorm_long --fused-only --png '' --csv "$out/bench_layernorm_long.csv" \
    --sizes 4096x16385,4096x40000,2048x65536,1024x100003,1024x131072,1024x140000
  run_bench bench_softmax bench_softmax --csv "$out/bench_softmax.csv" --png "$out/bench_softmax.png"
  run_bench bench_train bench_train --csv "$out/bench_train.csv" --breakdown-csv "$out/bench_train_breakdown.csv"
  # Prettier plots (matplotlib, where installed): scripts/plot_bench.py on the CSVs.
fi
tar czf "$out/results.tgz" -C "$out" --exclude results.tgz --exclude sanitize_logs.tgz . 2>/dev/null
exit $status

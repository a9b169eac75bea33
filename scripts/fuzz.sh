#!/usr/bin/env bash
# Fuzzes the four file loaders with libFuzzer (clang, ASan + UBSan), each for a
# bounded time, starting from the seed corpus in tests/corpus/{npy,checkpoint,gemm_algorithms,run_record}.
#
#   scripts/fuzz.sh                 60 s per target
#   scripts/fuzz.sh --seconds 300   longer run
#   HG_WITH_FUZZ=1 scripts/install_deps.sh   installs clang + libclang-rt-dev first
#
# New coverage-increasing inputs go to build-fuzz/corpus-<target>/ (scratch,
# not kept). Any crash, timeout or out-of-memory input is minimised and copied
# into tests/corpus/<kind>/ as a regression input, which the normal test suite
# replays (tests/test_corpus_replay.cpp); the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

build=build-fuzz
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DHG_FUZZ=ON -DHG_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_npy fuzz_checkpoint fuzz_gemm_algorithms fuzz_run_record

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for kind in npy checkpoint gemm_algorithms run_record; do
  target="$build/tests/fuzz/fuzz_$kind"
  scratch="$build/corpus-$kind"
  artifacts="$build/artifacts-$kind/"
  rm -rf "$artifacts"; mkdir -p "$scratch" "$artifacts"
  echo "== fuzz_$kind for ${seconds}s"
  # -rss_limit_mb / -malloc_limit_mb turn an unbounded allocation into an "oom" finding;
  # -timeout turns a hang into a "timeout" finding.
  dict=(); [[ -f tests/fuzz/$kind.dict ]] && dict=(-dict="tests/fuzz/$kind.dict")
  "$target" "$scratch" "tests/corpus/$kind" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$artifacts" 2>&1 | tee "$build/fuzz_$kind.log" | grep -E '^#[0-9]+.*(DONE|pulse)|stat::|ERROR|SUMMARY' || true
  for found in "$artifacts"*; do
    [[ -f $found ]] || continue
    base=$(basename "$found")
    min="tests/corpus/$kind/$base"
    # Minimise the reproducer (keeps the same failure), then keep it as a regression input.
    "$target" -minimize_crash=1 -max_total_time=30 -exact_artifact_path="$min" "$found" >/dev/null 2>&1 \
      || cp "$found" "$min"
    [[ -s $min ]] || cp "$found" "$min"
    echo "FOUND: $base -> $min"
    status=1
  done
done
exit $status

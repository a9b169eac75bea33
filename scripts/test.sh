#!/usr/bin/env bash
# Quick start, command 2 (and what .ci/run calls): install what is missing,
# build, run the whole test suite; then the same CPU tests again in a second
# build under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   scripts/test.sh           normal build (build/) + ctest, then the sanitizer
#                             build (build-asan/: -DHG_SANITIZE=ON, CUDA off,
#                             Debug at -O1) + ctest, which must be clean
#   scripts/test.sh --quick   the normal build + ctest only (no sanitizer build)
#
# In the sanitizer run each test binary gets the Catch2 filter "~[slow]~[.]":
# it skips only cases tagged [slow] (for sweeps ASan would make too slow for
# CI; none need it today) and hidden cases ([.]). Any sanitizer report fails
# the run. Measured on 2 idle cores: the sanitizer build of the test programs
# takes ~4 min from scratch, its ctest ~25 s.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

HG_WITH_TORCH=1 scripts/install_deps.sh
scripts/build.sh
build_dir="${HG_BUILD_DIR:-build}"
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)"
# ctest hides the output of passing tests: say plainly how many GPU cases skipped.
skipped=0
for t in "$build_dir"/tests/test_*; do
  [[ -x $t ]] || continue
  n=$("$t" "[cuda]" 2>&1 | grep -c "SKIPPED: no CUDA GPU present" || true)
  skipped=$((skipped + n))
done
# The Python tests (python/tests, one CTest entry) log their skips in ctest's log.
py_log="$build_dir/Testing/Temporary/LastTest.log"
if [[ -f $py_log ]]; then
  n=$(grep -c "skipped 'SKIPPED: no CUDA GPU present'" "$py_log" || true)
  skipped=$((skipped + n))
  if grep -q "skipped 'SKIPPED: PyTorch not installed" "$py_log"; then
    echo "NOTE: Python handgrad.torch tests SKIPPED: PyTorch not installed"
  elif grep -q "skipped 'SKIPPED: handgrad._torch_ext not built" "$py_log"; then
    echo "NOTE: handgrad._torch_ext tests SKIPPED: not built (PyTorch's C++ headers: libtorch-dev)"
  fi
fi
((skipped)) && echo "NOTE: $skipped GPU test cases SKIPPED: no CUDA GPU present (they run on a GPU machine: scripts/gpu_check.sh)"
((quick)) && exit 0

echo "== sanitizer build (ASan + UBSan, CPU): build-asan"
asan_dir="${HG_ASAN_BUILD_DIR:-build-asan}"
# CMakePresets.json's `asan` preset: -DHG_SANITIZE=ON -DHG_ENABLE_CUDA=OFF, Debug at -O1 -g1
# (line tables only: reports keep file:line, and the build stays near 3 GB
# where full debug info made it 7 GB).
cmake --preset asan -B "$asan_dir" >/dev/null
# Only the test programs: examples and benchmarks add build time, not coverage.
# Every test program CTest registered there (tests/test_*.cpp, and optional
# ones such as tests/translation/test_translation.cpp when their library was found).
tests=()
registered=$(ctest --test-dir "$asan_dir" -N | sed -n 's/^ *Test *#[0-9]*: \(test_[A-Za-z0-9_]*\)$/\1/p')
for t in $registered; do tests+=("$t"); done
# (+ the planted object that gemm_level_symbols_catches_sharing reads)
cmake --build "$asan_dir" -j"$(nproc)" --target "${tests[@]}" hg_gemm_symbols_fixture
# The `asan` test preset sets ASAN_OPTIONS and UBSAN_OPTIONS (leaks detected,
# the first UBSan report fatal) and a 1500 s timeout per test. Its
# malloc_fill_byte=255 fills every allocation with 0xff bytes (a NaN in f32
# and f64), so a result that reads memory it never wrote shows up as a
# failed comparison.
ctest --preset asan --test-dir "$asan_dir" -j"$(nproc)"

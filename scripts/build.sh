#!/usr/bin/env bash
# Configures and builds handgrad into build/ (or $HG_BUILD_DIR). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${HG_BUILD_DIR:-build}"
# nvcc is often installed outside PATH; let CMake find it there.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${HG_BUILD_TYPE:-Release}" "$@"
cmake --build "$build_dir" -j"$(nproc)"

#!/usr/bin/env bash
# Configures and builds handgrad into build/ (or $HG_BUILD_DIR): CMake's
# `release` preset (CMakePresets.json; CUDA when nvcc is found, also in
# /usr/local/cuda/bin), build type $HG_BUILD_TYPE (default Release). Extra
# args go to cmake. Links compile_commands.json at the repository root to the
# build's, for editors (unless a file of that name is there already).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${HG_BUILD_DIR:-build}"
cmake --preset release -B "$build_dir" -DCMAKE_BUILD_TYPE="${HG_BUILD_TYPE:-Release}" "$@"
if [[ -L compile_commands.json || ! -e compile_commands.json ]]; then
  ln -sfn "$build_dir/compile_commands.json" compile_commands.json
fi
cmake --build "$build_dir" -j"$(nproc)"

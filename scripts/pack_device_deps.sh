#!/usr/bin/env bash
# Copies the header-only dependencies the GPU machine lacks (Eigen, spdlog,
# fmt, CLI11) into .deps/include, which the device tool carries (it is
# ignored by git). CMake falls back to it when find_package fails.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=.deps/include
rm -rf .deps && mkdir -p "$dst"
cp -r /usr/include/eigen3 "$dst/"
cp -r /usr/include/spdlog /usr/include/fmt /usr/include/CLI /usr/include/catch2 "$dst/"
du -sh .deps

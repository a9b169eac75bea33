#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
ctest --test-dir "${HG_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"

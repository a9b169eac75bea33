#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec "${HG_BUILD_DIR:-build}"/examples/train "$@"

#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, run the main job.
# Its outputs (train_log.csv, train_loss.png) go to out/ (ignored by git)
# unless --log-csv / --plot say otherwise; other arguments go to train.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
out="${HG_OUT_DIR:-out}"
mkdir -p "$out"
defaults=()
[[ " $* " == *" --log-csv"* ]] || defaults+=(--log-csv "$out/train_log.csv")
[[ " $* " == *" --plot"* ]] || defaults+=(--plot "$out/train_loss.png")
exec "${HG_BUILD_DIR:-build}"/examples/train "${defaults[@]}" "$@"

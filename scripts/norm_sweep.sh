#!/usr/bin/env bash
# The norm kernels' lab sweep in one GPU call: the copy yardstick, then
# every LayerNorm candidate configuration (the lab program
# bench/lab/layernorm_lab.cu; LN_CONFIGS=SUBSTRING narrows it) and every
# softmax candidate (bench/lab/softmax_lab.cu), raw kernels only, each as
# GB/s and % of the best copy at the same size. Tables go to $OUT (default
# out/). Needs a built build-gpu/ (targets bench_copy layernorm_lab
# softmax_lab), or pass BUILD=dir.
# Usage: [LN_CONFIGS=staged] scripts/norm_sweep.sh [ln|softmax|copy]...
#   (default: all three parts)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build-gpu}"
out="${OUT:-out}"
mkdir -p "$out"
parts=("$@")
((${#parts[@]})) || parts=(copy ln softmax)
has() { local p; for p in "${parts[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
for b in bench_copy lab/layernorm_lab lab/softmax_lab; do
  [[ -x $build/bench/$b ]] || { echo "missing $build/bench/$b: build it first (cmake --build $build --target ${b#lab/})"; exit 1; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/sweep_gpu.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/sweep_gpu.txt"
status=0

if has copy; then
  # One tensor's MiB for every tensor of the sweeps below (f32 and bf16).
  "$build/bench/bench_copy" --sizes-mib 8,16,24,32,48,64,96,128,256,512 --iters 20 --csv "$out/sweep_copy.csv" \
    > "$out/sweep_copy.txt" 2>&1 || status=1
  grep -E "best:" "$out/sweep_copy.txt" | tee "$out/sweep_copy_best.txt"
fi

if has ln; then
  "$build/bench/lab/layernorm_lab" --iters 30 ${LN_CONFIGS:+--configs "$LN_CONFIGS"} \
    --sizes 4096x1024,4096x4096,4096x8192,4096x16384,16384x768 2>&1 | tee "$out/sweep_ln.txt" || status=1
fi

if has softmax; then
  # the softmax candidates live in a standalone lab program (bench/lab/softmax.md)
  "$build/bench/lab/softmax_lab" --sizes 4x16x1024,2x16x2048,8x12x512 --iters 30 \
    > "$out/sweep_softmax.txt" 2>&1 || status=1
  tail -n 30 "$out/sweep_softmax.txt"
fi
exit $status

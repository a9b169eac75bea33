#!/usr/bin/env bash
# The norm kernels' lab sweep in one GPU call: the copy yardstick, then
# every LayerNorm candidate configuration (the lab program
# bench/lab/layernorm_lab.cu; LN_CONFIGS=SUBSTRING narrows it) and every
# softmax lab variant (HG_SOFTMAX_VARIANT 0..3, or the list in
# SOFTMAX_VARIANTS, selected in-process by --variants), raw kernels only,
# each as GB/s and % of the best copy at the same size. Tables and the CSVs
# go to $OUT (default out/). Needs a built build-gpu/ (targets bench_copy
# layernorm_lab bench_softmax), or pass BUILD=dir.
# Usage: [LN_CONFIGS=staged] [SOFTMAX_VARIANTS=1,3] scripts/norm_sweep.sh [ln|softmax|copy]...
#   (default: all three parts)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build-gpu}"
out="${OUT:-out}"
mkdir -p "$out"
parts=("$@")
((${#parts[@]})) || parts=(copy ln softmax)
has() { local p; for p in "${parts[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
for b in bench_copy lab/layernorm_lab bench_softmax; do
  [[ -x $build/bench/$b ]] || { echo "missing $build/bench/$b: build it first (cmake --build $build --target ${b#lab/})"; exit 1; }
done
unset HG_SOFTMAX_VARIANT  # --variants picks each one in-process
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/sweep_gpu.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/sweep_gpu.txt"
status=0

if has copy; then
  # One tensor's MiB for every tensor of the sweeps below (f32 and bf16).
  "$build/bench/bench_copy" --sizes-mib 8,16,24,32,48,64,96,128,256,512 --iters 20 --csv "$out/sweep_copy.csv" \
    > "$out/sweep_copy.txt" 2>&1 || status=1
  grep -E "best:" "$out/sweep_copy.txt" | tee "$out/sweep_copy_best.txt"
fi

# Compact table from a bench CSV: rows of the given passes, one line per
# (dtype, size, pass, variant kind) with GB/s and %copy of each impl.
table() {
  python3 - "$@" <<'PY'
import csv, sys
path, key = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(path)))
groups = {}
for r in rows:
    if r["device"] != "cuda" or r["pass"] == "copy":
        continue
    size = f'{r["M"]}x{r["N"]}' if key == "ln" else f'({r["B"]},{r["H"]},{r["T"]})'
    what = r["pass"] if key == "ln" else f'{r["pass"]}-{r["variant"]}'
    groups.setdefault((r["dtype"], size, what), []).append(r)
copies = {}
for r in rows:
    if r["pass"] == "copy":
        size = f'{r["M"]}x{r["N"]}' if key == "ln" else f'({r["B"]},{r["H"]},{r["T"]})'
        copies[(r["dtype"], size, r["impl"])] = float(r["gbps"])
impls = sorted({r["impl"] for g in groups.values() for r in g})
print(f'{"dtype":5} {"size":14} {"pass":16} {"memcpy":>7} {"best":>7} ' + " ".join(f'{i:>12}' for i in impls))
for (dtype, size, what), g in groups.items():
    by = {r["impl"]: r for r in g}
    cells = []
    for i in impls:
        r = by.get(i)
        cells.append(f'{float(r["gbps"]):6.0f} {float(r["pct_of_copy"]):4.1f}%' if r else " " * 12)
    m = copies.get((dtype, size, "memcpy"), 0); b = copies.get((dtype, size, "best"), 0)
    print(f'{dtype:5} {size:14} {what:16} {m:7.0f} {b:7.0f} ' + " ".join(f'{c:>12}' for c in cells))
PY
}

if has ln; then
  "$build/bench/lab/layernorm_lab" --iters 30 ${LN_CONFIGS:+--configs "$LN_CONFIGS"} \
    --sizes 4096x1024,4096x4096,4096x8192,4096x16384,16384x768 2>&1 | tee "$out/sweep_ln.txt" || status=1
fi

if has softmax; then
  "$build/bench/bench_softmax" --device cuda --kernels-only --variants "${SOFTMAX_VARIANTS:-0,1,2,3}" --iters 30 --png '' \
    --sizes 4x16x1024,2x16x2048,8x12x512 --csv "$out/sweep_softmax.csv" \
    > "$out/sweep_softmax.txt" 2>&1 || status=1
  table "$out/sweep_softmax.csv" softmax | tee "$out/sweep_softmax_table.txt"
fi
exit $status

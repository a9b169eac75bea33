#!/usr/bin/env bash
# Issue 17's lab sweep in one GPU call: the copy yardstick, then every
# LayerNorm and softmax lab variant (HG_LN_VARIANT 0..10, HG_SOFTMAX_VARIANT
# 0..3, or the lists in LN_VARIANTS and SOFTMAX_VARIANTS, selected in-process
# by --variants) on the issue's sizes, raw kernels
# only, each as GB/s and % of the best copy at the same size. Compact tables
# and the CSVs go to $OUT (default out/). About 2-3 minutes on an H100.
# Needs a built build-gpu/ (targets bench_copy bench_layernorm bench_softmax),
# or pass BUILD=dir.
# Usage: [LN_VARIANTS=0,5] [SOFTMAX_VARIANTS=1,3] scripts/norm_sweep.sh [ln|softmax|copy]...
#   (default: all three parts, every variant)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build-gpu}"
out="${OUT:-out}"
mkdir -p "$out"
parts=("$@")
((${#parts[@]})) || parts=(copy ln softmax)
has() { local p; for p in "${parts[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }
for b in bench_copy bench_layernorm bench_softmax; do
  [[ -x $build/bench/$b ]] || { echo "missing $build/bench/$b: build it first (cmake --build $build --target $b)"; exit 1; }
done
unset HG_LN_VARIANT HG_SOFTMAX_VARIANT  # --variants picks each one in-process
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
  "$build/bench/bench_layernorm" --device cuda --kernels-only --variants "${LN_VARIANTS:-0,1,2,3,4,5,6,7,8,9,10}" --iters 30 --png '' \
    --sizes 4096x1024,4096x4096,4096x8192,4096x16384,16384x768 --csv "$out/sweep_ln.csv" \
    > "$out/sweep_ln.txt" 2>&1 || status=1
  table "$out/sweep_ln.csv" ln | tee "$out/sweep_ln_table.txt"
fi

if has softmax; then
  # the softmax candidates live in a standalone lab program (bench/lab/softmax.md)
  "$build/bench/lab/softmax_lab" --sizes 4x16x1024,2x16x2048,8x12x512 --iters 30 \
    > "$out/sweep_softmax.txt" 2>&1 || status=1
  tail -n 30 "$out/sweep_softmax.txt"
fi
exit $status

#!/usr/bin/env bash
# Data parallelism on the GPU machine (docs/distributed.md), in one command
# (about 5-6 minutes on 2 x H200, 3-4 of them the build):
#   1. builds into build-gpu/ (test_dist, test_dist_ranks, the benchmarks, train) and runs
#      test_dist (NCCL with one rank) through scripts/gpu_check.sh;
#   2. test_dist_ranks on 2 GPUs under mpirun: the reduced gradient against one
#      process with the whole batch, the ZeRO-1 resume on 2 ranks, the bf16 reduction's bound;
#   3. train on one GPU, plain vs --ddp (NCCL, one rank): the same losses, bit for bit;
#      --zero 1 within a relative 1e-5 (its clipping scales the gradients in a separate pass);
#   4. bench_ddp on every GPU of the host, bench and gpt2s configs: the bucket size x
#      gradient dtype sweep, ZeRO-1 (both dtypes), fp32 precision, and NCCL channel
#      counts (NCCL_MAX_NCHANNELS) on gpt2s; then 2-GPU train with --check-sync;
#   5. one summary table of every bench_ddp run (scaling over one GPU alone,
#      hidden share of the collectives, ms per step), also as $OUT/ddp_summary.csv.
# Outputs in $OUT (default out/). Needs mpirun and NCCL (CMake: "NCCL ON").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: the multi-GPU machines measured need it off
HG_TEST_PROGS="test_dist test_dist_ranks" scripts/gpu_check.sh tests || exit 1
cat "$out/test_summary.txt"
grep -E "handgrad: (MPI|NCCL)" "$out/build.log"
cmake --build build-gpu -j"$(nproc)" --target train bench_ddp > "$out/build_train.log" 2>&1 || { tail -30 "$out/build_train.log"; exit 1; }
root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
n=$(nvidia-smi -L | wc -l)
launch=(mpirun -np "$n" "${root[@]}" -x NCCL_NVLS_ENABLE)

if ((n >= 2)); then
  HG_REQUIRE_CUDA=1 tests/mpi/mpirun2.sh mpirun build-gpu/tests/test_dist_ranks > "$out/test_dist_ranks.log" 2>&1 \
    && echo "test_dist_ranks (2 GPUs, NCCL): PASS" || echo "FAIL: test_dist_ranks (2 GPUs), see $out/test_dist_ranks.log"
  grep -E "^(All tests passed|test cases:)|bf16 vs fp32" -A1 "$out/test_dist_ranks.log" | grep -v "^--" | head -20
fi

t=(--device cuda --steps 300 --eval-every 100 --plot "" -q)
build-gpu/examples/train "${t[@]}" --log-csv "$out/plain.csv" > "$out/train_plain.txt" 2>&1
build-gpu/examples/train "${t[@]}" --ddp --check-sync --log-csv "$out/ddp1.csv" > "$out/train_ddp1.txt" 2>&1
build-gpu/examples/train "${t[@]}" --zero 1 --check-sync --log-csv "$out/zero1.csv" > "$out/train_zero1.txt" 2>&1
cmp -s <(cut -d, -f2 "$out/plain.csv") <(cut -d, -f2 "$out/ddp1.csv") && echo "train --ddp (NCCL, 1 rank) = plain: bitwise" \
  || echo "FAIL: train --ddp differs from plain"
paste -d' ' <(tail -n +2 "$out/plain.csv" | cut -d, -f2) <(tail -n +2 "$out/zero1.csv" | cut -d, -f2) |
  awk '{d = $1 - $2; if (d < 0) d = -d; r = d / $1; m = r > m ? r : m} END {printf "train --zero 1 vs plain: max relative difference %.3g %s\n", m, m <= 1e-5 ? "ok" : "FAIL"}'
grep -h "communication\|hidden" "$out"/train_ddp1.txt "$out"/train_zero1.txt

if ((n < 2)); then
  echo "one GPU: the ${n}-GPU scaling runs need a machine with 2 or more GPUs"
  exit 0
fi
# bench_ddp NAME ARGS...: one mpirun job; its CSV rows are labelled NAME in the summary.
bench_ddp() {
  local name=$1
  shift
  local env=(); [[ -n ${NCCL_MAX_NCHANNELS:-} ]] && env=(-x NCCL_MAX_NCHANNELS)
  "${launch[@]}" "${env[@]}" build-gpu/bench/bench_ddp --csv "$out/ddp_$name.csv" "$@" > "$out/ddp_$name.txt" 2>&1 \
    || { echo "FAIL: bench_ddp $name"; tail -20 "$out/ddp_$name.txt"; }
  sed -n '/summary/,$p' "$out/ddp_$name.txt"
}
sweep=(--bucket-mb 10,25,50,100 --grad-dtype fp32,bf16)
bench_ddp bench --config bench --iters 30 "${sweep[@]}"
bench_ddp gpt2s --config gpt2s --iters 20 "${sweep[@]}"
bench_ddp bench_zero1 --config bench --iters 30 --zero 1 --bucket-mb 25,50 --grad-dtype fp32,bf16
bench_ddp gpt2s_zero1 --config gpt2s --iters 20 --zero 1 --bucket-mb 25,50 --grad-dtype fp32,bf16
bench_ddp bench_fp32 --config bench --iters 20 --precision fp32 --grad-dtype fp32,bf16
for ch in 2 4 8; do  # fewer NCCL channels: fewer SMs taken from the backward while it overlaps
  NCCL_MAX_NCHANNELS=$ch bench_ddp "gpt2s_nch$ch" --config gpt2s --iters 20 --bucket-mb 25 --grad-dtype fp32,bf16
done
"${launch[@]}" build-gpu/examples/train --device cuda --steps 300 --batch 16 --check-sync \
  --plot "" -q --log-csv "$out/train_np$n.csv" 2>&1 | tail -12 | tee "$out/train_np$n.txt"

# Every bench_ddp row, labelled by its run, in one table and one CSV.
summary="$out/ddp_summary.csv"
echo "run,config,precision,zero,bucket_mb,grad_dtype,alone_ms,slowest_ms,scaling,comm_ms,exposed_ms,hidden_pct" > "$summary"
for f in "$out"/ddp_*.csv; do
  [[ $f == "$summary" ]] && continue
  name=$(basename "$f" .csv)
  awk -F, -v run="${name#ddp_}" 'NR > 1 {printf "%s,%s,%s,%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f\n",
    run, $1, $3, $5, $6, $7, $8, $10, $12, $13, $14, 100 * $15}' "$f" >> "$summary"
done
echo "== data parallel on $n x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), NCCL_NVLS_ENABLE=0 =="
echo "(scaling = $n x one GPU alone / slowest rank; hidden = share of the collectives behind compute)"
table() { awk -F, '{printf "%-12s %-6s %-9s %4s %9s %-10s %8s %10s %8s %8s %10s %10s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12}'; }
table < "$summary"
echo "best scaling per run:"
tail -n +2 "$summary" | sort -t, -k1,1 -k9,9gr | awk -F, '$1 != last {print; last = $1}' | table

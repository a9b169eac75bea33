#!/usr/bin/env bash
# Data parallelism on the GPU machine (docs/distributed.md), in one command:
#   1. builds into build-gpu/ and runs test_dist (NCCL with one rank) through scripts/gpu_check.sh;
#   2. train on one GPU, plain vs --ddp (NCCL, one rank): the same losses, bit for bit;
#      --zero 1 within a relative 1e-5 (its clipping scales the gradients in a separate pass);
#   3. bench_ddp on one GPU (bench and gpt2s configs), then on every GPU of the
#      host with mpirun (tokens/s scaling, collective time, share hidden), fp32 and
#      ZeRO-1 variants on the bench config.
# Outputs in $OUT (default out/). Needs mpirun and NCCL (CMake: "NCCL ON").
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
HG_TEST_PROGS="test_dist" scripts/gpu_check.sh tests || exit 1
cat "$out/test_summary.txt"
grep -E "handgrad: (MPI|NCCL)" "$out/build.log"
cmake --build build-gpu -j"$(nproc)" --target train bench_ddp > "$out/build_train.log" 2>&1 || { tail -30 "$out/build_train.log"; exit 1; }
root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: the multi-GPU machines measured need it off

t=(--device cuda --steps 300 --eval-every 100 --plot "" -q)
build-gpu/examples/train "${t[@]}" --log-csv "$out/plain.csv" > "$out/train_plain.txt" 2>&1
build-gpu/examples/train "${t[@]}" --ddp --check-sync --log-csv "$out/ddp1.csv" > "$out/train_ddp1.txt" 2>&1
build-gpu/examples/train "${t[@]}" --zero 1 --check-sync --log-csv "$out/zero1.csv" > "$out/train_zero1.txt" 2>&1
cmp -s <(cut -d, -f2 "$out/plain.csv") <(cut -d, -f2 "$out/ddp1.csv") && echo "train --ddp (NCCL, 1 rank) = plain: bitwise" \
  || echo "FAIL: train --ddp differs from plain"
paste -d' ' <(tail -n +2 "$out/plain.csv" | cut -d, -f2) <(tail -n +2 "$out/zero1.csv" | cut -d, -f2) |
  awk '{d = $1 - $2; if (d < 0) d = -d; r = d / $1; m = r > m ? r : m} END {printf "train --zero 1 vs plain: max relative difference %.3g %s\n", m, m <= 1e-5 ? "ok" : "FAIL"}'
grep -h "communication\|hidden" "$out"/train_ddp1.txt "$out"/train_zero1.txt

for cfg in bench gpt2s; do
  build-gpu/bench/bench_ddp --config "$cfg" --ddp --csv "$out/bench_ddp_${cfg}_1.csv" 2>&1 | tee "$out/bench_ddp_${cfg}_1.txt"
done
n=$(nvidia-smi -L | wc -l)
if ((n >= 2)); then
  for cfg in bench gpt2s; do
    mpirun -np "$n" "${root[@]}" -x NCCL_NVLS_ENABLE build-gpu/bench/bench_ddp --config "$cfg" \
      --csv "$out/bench_ddp_${cfg}_$n.csv" 2>&1 | tee "$out/bench_ddp_${cfg}_$n.txt"
  done
  mpirun -np "$n" "${root[@]}" -x NCCL_NVLS_ENABLE build-gpu/bench/bench_ddp --config bench --zero 1 \
    --csv "$out/bench_ddp_bench_${n}_zero1.csv" 2>&1 | tee "$out/bench_ddp_bench_${n}_zero1.txt"
  mpirun -np "$n" "${root[@]}" -x NCCL_NVLS_ENABLE build-gpu/bench/bench_ddp --config bench --precision fp32 \
    --csv "$out/bench_ddp_bench_${n}_fp32.csv" 2>&1 | tee "$out/bench_ddp_bench_${n}_fp32.txt"
  mpirun -np "$n" "${root[@]}" -x NCCL_NVLS_ENABLE build-gpu/examples/train --device cuda --steps 300 --batch 16 \
    --check-sync --plot "" -q --log-csv "$out/train_np$n.csv" 2>&1 | tail -12 | tee "$out/train_np$n.txt"
else
  echo "one GPU: the ${n}-GPU scaling runs need a machine with 2 or more GPUs"
fi

#!/usr/bin/env bash
# Data parallelism on a host with 2 GPUs (docs/distributed.md), in one command
# that ends within HG_DDP_BUDGET_S seconds (default 510, under 9 minutes on
# 2 x H200): a sweep stage that would start after the budget is skipped and
# named, each runs under `timeout` of what is left, and the summary comes last.
#   1. builds test_dist, test_dist_ranks, bench_ddp and train into build-gpu/ (sm_90);
#   2. test_dist (NCCL with one rank) and test_dist_ranks on 2 GPUs (NCCL), HG_REQUIRE_CUDA=1;
#   3. train on one GPU: plain = --ddp bit for bit; --zero 1 within 1e-5 of plain;
#      --zero-gather forward = step bit for bit, on one GPU and on 2 GPUs;
#   4. bench_ddp on 2 GPUs, most needed first: gpt2s and bench, buckets 8/25/50/100 MiB x
#      fp32/bf16 reduction; bench ZeRO-1 (gathers waited in the step or in the next forward);
#      NCCL_MAX_NCHANNELS 4/8/16 on bench (DDP and ZeRO-1) and gpt2s; gpt2s ZeRO-1;
#   5. one table of every run (scaling over one GPU alone, share of the collectives
#      hidden, ms per step, compute slowdown), the targets, and the recommended
#      defaults from the sweep (scripts/ddp_summary.py; also $OUT/ddp_summary.csv).
# Outputs in $OUT (default out/). Needs mpirun, NCCL (CMake: "NCCL ON") and python3.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: the multi-GPU machines measured need it off
out="${OUT:-out}"
budget="${HG_DDP_BUDGET_S:-510}"
mkdir -p "$out"
rm -f "$out"/ddp_*.csv
elapsed() { echo "[${SECONDS}s]"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if ! { cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
         && cmake --build build-gpu -j"$(nproc)" --target test_dist test_dist_ranks bench_ddp train; } \
       > "$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -40
  echo "BUILD FAILED"; exit 1
fi
grep -E "handgrad: (MPI|NCCL)" "$out/build.log"
echo "$(elapsed) built"
n=$(nvidia-smi -L | wc -l)
root=(); [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
launch=(mpirun -np 2 "${root[@]}" -x NCCL_NVLS_ENABLE)
pass() { if "${@:2}"; then echo "$1: PASS"; else echo "FAIL: $1"; fi; }

# ---- 2. tests ----
pass "test_dist (NCCL, one rank)" bash -c "HG_REQUIRE_CUDA=1 timeout 300 build-gpu/tests/test_dist > '$out/test_dist.log' 2>&1"
grep -E "^(All tests passed|test cases:)" "$out/test_dist.log"
if ((n >= 2)); then
  pass "test_dist_ranks (2 GPUs, NCCL)" bash -c \
    "HG_REQUIRE_CUDA=1 timeout 300 tests/mpi/mpirun2.sh mpirun build-gpu/tests/test_dist_ranks > '$out/test_dist_ranks.log' 2>&1"
  grep -E "^(All tests passed|test cases:)|bf16 vs fp32" -A1 "$out/test_dist_ranks.log" | grep -v "^--" | head -12
fi
echo "$(elapsed) tests done"

# ---- 3. train: the same losses ----
losses() { tail -n +2 "$1" | cut -d, -f2; }
same() { [[ -s $1 && -s $2 ]] && cmp -s <(losses "$1") <(losses "$2"); }
t=(--device cuda --steps 200 --eval-every 100 --plot "" -q)
build-gpu/examples/train "${t[@]}" --log-csv "$out/plain.csv" > "$out/train_plain.txt" 2>&1
build-gpu/examples/train "${t[@]}" --ddp --check-sync --log-csv "$out/ddp1.csv" > "$out/train_ddp1.txt" 2>&1
build-gpu/examples/train "${t[@]}" --zero 1 --zero-gather step --log-csv "$out/zero1.csv" > "$out/train_zero1.txt" 2>&1
build-gpu/examples/train "${t[@]}" --zero 1 --zero-gather forward --log-csv "$out/zero1f.csv" \
  > "$out/train_zero1f.txt" 2>&1
pass "train --ddp (NCCL, 1 rank) = plain, bitwise" same "$out/plain.csv" "$out/ddp1.csv"
pass "train --zero 1 --zero-gather forward = step (1 GPU), bitwise" same "$out/zero1.csv" "$out/zero1f.csv"
paste -d' ' <(losses "$out/plain.csv") <(losses "$out/zero1.csv") |
  awk '{d = $1 - $2; if (d < 0) d = -d; r = d / $1; m = r > m ? r : m}
       END {printf "train --zero 1 vs plain: max relative difference %.3g %s\n", m, m <= 1e-5 ? "ok" : "FAIL"}'
if ((n >= 2)); then
  # No --check-sync: it would wait for the gathers after every step, before the
  # forward could; the hashes are compared at each evaluation (steps 50, 100).
  t2=(--device cuda --steps 100 --eval-every 50 --batch 16 --zero 1 --plot "" -q)
  "${launch[@]}" build-gpu/examples/train "${t2[@]}" --zero-gather step --log-csv "$out/np2_zs.csv" \
    > "$out/train_np2_zs.txt" 2>&1
  "${launch[@]}" build-gpu/examples/train "${t2[@]}" --zero-gather forward --log-csv "$out/np2_zf.csv" \
    > "$out/train_np2_zf.txt" 2>&1
  pass "train on 2 GPUs --zero 1: --zero-gather forward = step, bitwise, hashes equal at each evaluation" \
    same "$out/np2_zs.csv" "$out/np2_zf.csv"
fi
echo "$(elapsed) train checks done"
if ((n < 2)); then
  echo "one GPU: the scaling sweep needs a host with 2 GPUs"
  exit 0
fi

# ---- 4. bench_ddp sweeps, within the budget ----
# stage NAME CHANNELS ARGS...: one mpirun job, CSV $out/ddp_NAME_chCHANNELS.csv.
skipped=()
stage() {
  local name=$1 ch=$2
  shift 2
  local left=$((budget - SECONDS - 15))  # 15 s kept for the summary
  if ((left < 30)); then
    skipped+=("$name (channels $ch)")
    return
  fi
  local env=(env -u NCCL_MAX_NCHANNELS) pass_on=()
  [[ $ch != default ]] && env=(env NCCL_MAX_NCHANNELS="$ch") pass_on=(-x NCCL_MAX_NCHANNELS)
  "${env[@]}" timeout "$left" "${launch[@]}" "${pass_on[@]}" build-gpu/bench/bench_ddp \
    --csv "$out/ddp_${name}_ch$ch.csv" "$@" > "$out/ddp_${name}_ch$ch.txt" 2>&1 \
    || { echo "FAIL or out of time: bench_ddp $name channels $ch"; tail -5 "$out/ddp_${name}_ch$ch.txt"; }
  echo "$(elapsed) bench_ddp $name, NCCL_MAX_NCHANNELS $ch"
}
gpt2s=(--config gpt2s --warmup 3 --iters 20)
bench=(--config bench --warmup 3 --iters 40)
both=(--grad-dtype fp32,bf16)
gathers=(--zero-gather step,forward)
stage gpt2s default "${gpt2s[@]}" --bucket-mb 8,25,50,100 "${both[@]}"
stage bench default "${bench[@]}" --bucket-mb 8,25,50,100 "${both[@]}"
stage bench_zero1 default "${bench[@]}" --zero 1 "${gathers[@]}" --bucket-mb 25,50,100 "${both[@]}"
for ch in 4 8 16; do  # fewer NCCL channels: fewer SMs taken from the compute the collectives overlap
  stage bench "$ch" "${bench[@]}" --zero 0,1 "${gathers[@]}" --bucket-mb 25,50 "${both[@]}"
done
for ch in 4 8 16; do
  stage gpt2s "$ch" "${gpt2s[@]}" --bucket-mb 50,100 "${both[@]}"
done
stage gpt2s_zero1 default "${gpt2s[@]}" --zero 1 "${gathers[@]}" --bucket-mb 50 "${both[@]}"
((${#skipped[@]})) && printf 'skipped (budget of %s s reached): %s\n' "$budget" "${skipped[*]}"

# ---- 5. summary ----
echo "== data parallel on $n x $(head -1 "$out/gpu.txt" | cut -d, -f1), NCCL_NVLS_ENABLE=0, $(date -u +%Y-%m-%d) =="
python3 scripts/ddp_summary.py "$out"
echo "$(elapsed) done"

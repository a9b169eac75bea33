#!/usr/bin/env bash
# scripts/ddp_summary.py on made-up bench_ddp CSVs: the table, the targets and
# the recommendations (a clear gain changes a default, one within the noise
# does not, values are compared only at the settings where all were measured).
#   ddp_summary.sh PATH/TO/scripts/ddp_summary.py
set -uo pipefail
summary=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
header="config,device,precision,ranks,zero,bucket_mb,grad_dtype,alone_ms,ddp_ms,slowest_ms,tokens_per_s,scaling,comm_ms,exposed_ms,hidden_share,zero_gather,compute_slowdown"
row() {  # config zero bucket dtype scaling gather
  echo "$1,cuda,bf16,2,$2,$3,$4,10,10.5,10.6,1e6,$5,1,0.1,0.9,$6,0.04"
}
{
  echo "$header"
  row gpt2s 0 25 fp32 1.90 -; row gpt2s 0 50 fp32 1.91 -; row gpt2s 0 100 fp32 1.94 -
  row gpt2s 0 25 bf16 1.89 -; row gpt2s 0 50 bf16 1.90 -; row gpt2s 0 100 bf16 1.93 -
  row gpt2s 0 8 bf16 1.99 -  # 8 MiB at one setting only: not comparable
} > "$dir/ddp_gpt2s_chdefault.csv"
{
  echo "$header"
  row gpt2s 0 25 fp32 1.905 -; row gpt2s 0 50 fp32 1.912 -; row gpt2s 0 100 fp32 1.942 -
  row gpt2s 0 25 bf16 1.891 -; row gpt2s 0 50 bf16 1.902 -; row gpt2s 0 100 bf16 1.931 -
} > "$dir/ddp_gpt2s_ch8.csv"
{
  echo "$header"
  row bench 1 50 fp32 1.80 step; row bench 1 50 fp32 1.92 forward
  row bench 1 50 bf16 1.81 step; row bench 1 50 bf16 1.93 forward
} > "$dir/ddp_bench_zero1_chdefault.csv"
python3 "$summary" "$dir" > "$dir/out.txt" 2>&1 || { cat "$dir/out.txt"; exit 1; }
cat "$dir/out.txt"
failures=0
expect() {  # regex, description
  if grep -Eq -- "$1" "$dir/out.txt"; then echo "ok: $2"; else echo "FAIL: $2"; failures=$((failures + 1)); fi
}
expect "^gpt2s +0 +- +8 +100 fp32 .* 1\.942x" "one table row per run, channels from the file name"
expect "gpt2s: 1\.990x >= 1\.95x: met \(bucket 8 MiB, bf16, channels default\)" "the best row meets the target"
expect "bench ZeRO-1: 1\.930x >= 1\.9x: met .*gather forward" "ZeRO-1's target, with its gather waits"
expect "bench: not measured" "a target without runs"
expect "--bucket-mb: 8 1\.990x, 100 1\.930x, 50 1\.900x, 25 1\.890x \(mean over 1 setting\(s\)\); today 50: change to 8 \(\+4\.7%\)" \
  "a clear gain changes the default, compared only where every value was measured (8 MiB: at bf16 only)"
expect "--grad-dtype: fp32 .*today fp32: keep" "the best value already the default"
expect "--zero-gather: forward 1\.925x, step 1\.805x .*change to forward" "ZeRO-1's gather waits"
expect "NCCL_MAX_NCHANNELS: 8 1\.914x, default 1\.912x .*keep \(8 only \+0\.1%, within the noise of 0\.5%\)" \
  "a gain within the noise keeps the default"
[[ $(wc -l < "$dir/ddp_summary.csv") -eq 18 ]] && echo "ok: ddp_summary.csv has every row" \
  || { echo "FAIL: ddp_summary.csv rows"; failures=$((failures + 1)); }
exit $failures

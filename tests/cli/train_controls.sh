#!/usr/bin/env bash
# train's --grad-accum and --lr-schedule, end to end on a tiny model (seconds on the CPU):
#   1. --grad-accum 4 --batch 2 logs the losses of --batch 8 (the same data;
#      float32 rounding of the micro-batch sums apart: within 1e-5 relative),
#      while --batch 2 alone is far from them.
#   2. The lr column of each --lr-schedule at the steps that define it.
#   3. The kind travels with the checkpoint: a resume with another kind is
#      refused; without the flag the run record's kind continues; --extend-schedule continues
#      linear and constant without a jump.
#   4. --recompute-layernorm logs the losses of the run without it bit for bit
#      (the CPU recomputes LayerNorm with the forward's kernel); with
#      --recompute-gelu too within 1e-5; --unfused --recompute-gelu is refused.
#
#   train_controls.sh PATH/TO/train
set -uo pipefail
train=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
tiny=(--device cpu --d-model 16 --heads 2 --layers 1 --held-out 40 --seed 3 --threads 1 --plot '' -q)
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
# Largest relative difference of column 2 (loss) or 3 (lr) of two logs, row by row.
max_rel_diff() {  # column, file, file
  paste -d, <(tail -n +2 "$2" | cut -d, -f"$1") <(tail -n +2 "$3" | cut -d, -f"$1") |
    awk -F, '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r } END { printf "%.3g\n", m }'
}
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
above() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
# The lr of step $2 (1-based) in log $1 equals $3 within 1e-12 relative.
lr_is() { awk -F, -v s="$2" -v want="$3" '$1 == s { d = $3 - want; if (d < 0) d = -d; ok = d <= 1e-12 * want } END { exit !ok }' "$1"; }

# ---- 1. gradient accumulation = the larger batch
"$train" "${tiny[@]}" --steps 12 --batch 8 --log-csv whole.csv > whole.out 2>&1
check "--batch 8: exit 0" [ $? == 0 ]
"$train" "${tiny[@]}" --steps 12 --batch 2 --grad-accum 4 --log-csv accum.csv > accum.out 2>&1
check "--grad-accum 4 --batch 2: exit 0" [ $? == 0 ]
"$train" "${tiny[@]}" --steps 12 --batch 2 --log-csv small.csv > small.out 2>&1
diff=$(max_rel_diff 2 accum.csv whole.csv)
check "--grad-accum 4 --batch 2 = --batch 8: losses within 1e-5 relative (got $diff)" below "$diff" 1e-5
small=$(max_rel_diff 2 small.csv whole.csv)
check "--batch 2 alone is not --batch 8 (relative difference $small > 1e-3)" above "$small" 1e-3
check "--grad-accum 4 --batch 2: 12 steps logged" [ "$(tail -n +2 accum.csv | wc -l)" == 12 ]

# ---- 2. the schedules' rates: lr 1e-3, 5 warm-up steps, decay over steps 6..20
sched=("${tiny[@]}" --batch 4 --warmup 5 --lr 0.001)
for kind in cosine linear constant; do
  "$train" "${sched[@]}" --steps 20 --lr-schedule $kind --log-csv $kind.csv > $kind.out 2>&1
  check "--lr-schedule $kind: exit 0" [ $? == 0 ]
  check "--lr-schedule $kind: warm-up 2e-4 at step 1, the peak at steps 5 and 6" \
    bash -c "$(declare -f lr_is); lr_is $kind.csv 1 0.0002 && lr_is $kind.csv 5 0.001 && lr_is $kind.csv 6 0.001"
done
# Step 11 is a third of the way down (t = 5/15), step 20 at t = 14/15.
check "--lr-schedule linear: 7e-4 at step 11, 1.6e-4 at step 20" \
  bash -c "$(declare -f lr_is); lr_is linear.csv 11 0.0007 && lr_is linear.csv 20 0.00016"
check "--lr-schedule cosine: 7.75e-4 at step 11" lr_is cosine.csv 11 0.000775
check "--lr-schedule constant: 1e-3 at steps 6..20" \
  awk -F, 'NR > 1 && $1 >= 6 && $3 != 0.001 { bad = 1 } END { exit bad }' constant.csv
"$train" "${sched[@]}" --steps 20 --lr-schedule foo > bad.out 2>&1
check "--lr-schedule foo: exit 2" [ $? == 2 ]
check "--lr-schedule foo: names the allowed kinds" grep -q -- "--lr-schedule: foo not in {cosine,linear,constant}" bad.out

# ---- 3. resume: the kind is the checkpoint's (its run record); extension continues it
for kind in linear constant; do
  "$train" "${sched[@]}" --steps 10 --lr-schedule $kind --checkpoint $kind.ck --log-csv r$kind.csv > /dev/null 2>&1
  "$train" "${sched[@]}" --steps 20 --lr-schedule cosine --checkpoint $kind.ck --log-csv r$kind.csv --resume \
    --extend-schedule > other.out 2>&1
  check "$kind checkpoint resumed with --lr-schedule cosine: exit 2" [ $? == 2 ]
  check "$kind checkpoint resumed with --lr-schedule cosine: names the saved kind" \
    grep -q -- "--lr-schedule cosine: the checkpoint's run used --lr-schedule $kind" other.out
  "$train" "${sched[@]}" --steps 20 --checkpoint $kind.ck --log-csv r$kind.csv --resume --extend-schedule > ext.out 2>&1
  check "$kind: --extend-schedule without --lr-schedule (the record's kind) exits 0" [ $? == 0 ]
done
# The 10-step linear run ended at its floor (1e-4 at step index 10): the
# extension holds it there instead of jumping back up to the 20-step rate.
check "linear extended: steps 11..20 at the floor 1e-4" \
  awk -F, 'NR > 1 && $1 > 10 && $3 != 0.0001 { bad = 1 } END { exit bad }' rlinear.csv
check "constant extended: steps 6..20 at 1e-3" \
  awk -F, 'NR > 1 && $1 >= 6 && $3 != 0.001 { bad = 1 } END { exit bad }' rconstant.csv

# ---- 4. recomputed activations: the same step
"$train" "${tiny[@]}" --steps 12 --batch 8 --recompute-layernorm --log-csv ln.csv > ln.out 2>&1
check "--recompute-layernorm: exit 0" [ $? == 0 ]
check "--recompute-layernorm: the losses of the run without it, bit for bit" \
  cmp -s <(tail -n +2 ln.csv | cut -d, -f2) <(tail -n +2 whole.csv | cut -d, -f2)
"$train" "${tiny[@]}" --steps 12 --batch 8 --recompute-gelu --recompute-layernorm --log-csv both.csv > both.out 2>&1
check "--recompute-gelu --recompute-layernorm: exit 0" [ $? == 0 ]
both=$(max_rel_diff 2 both.csv whole.csv)
check "--recompute-gelu --recompute-layernorm: losses within 1e-5 relative (got $both)" below "$both" 1e-5
"$train" "${tiny[@]}" --steps 2 --unfused --recompute-gelu > unfused.out 2>&1
check "--unfused --recompute-gelu: exit 2" [ $? == 2 ]
check "--unfused --recompute-gelu: says why" grep -q -- "--recompute-gelu recomputes the GELU of fused mode" unfused.out

if ((failures)); then
  for f in *.out; do echo "--- $f"; tail -5 "$f"; done
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

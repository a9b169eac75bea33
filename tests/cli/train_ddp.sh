#!/usr/bin/env bash
# Data-parallel train on the CPU through MPI (docs/distributed.md), tiny model,
# seconds on 2 cores:
#   1. mpirun -np 2 --batch 8 (small buckets, so several are reduced during the
#      backward; parameter hashes compared after every step) gives the loss
#      curve of one process with --batch 16, each step within a relative 1e-5
#      (the guarantee of docs/distributed.md; measured ~1e-7), and a second
#      2-rank run repeats the first bit for bit.
#   1b. --sparse-embedding-grad on (the token embedding's gradient gathered by
#      rows, docs/distributed.md) gives the same curve within the same bound.
#   2. --zero 1 (sharded AdamW) gives the same curve within the same bound; its
#      checkpoint (unsharded format) resumes in ONE process, continuing the curve.
#      --zero-gather forward (the all-gathers waited for in the next forward)
#      repeats --zero-gather step bit for bit.
#   3. A rank killed mid-run (HG_FAULT=kill) stops the job (no hang), and the
#      last checkpoint, written at the evaluation before, resumes.
#   4. A rank whose parameters are nudged (HG_FAULT=perturb) fails --check-sync.
#   5. SIGTERM to mpirun stops every rank after the same step, with the checkpoint saved.
#   6. A rank that hangs (HG_FAULT=hang) makes the other's collective time out:
#      a clear message, every rank stopped within seconds.
#
#   train_ddp.sh PATH/TO/train PATH/TO/mpirun
set -uo pipefail
train=$(realpath "$1")
mpirun=$2
# Open MPI takes an absolute launcher path as --prefix (/bin/mpirun: "/", which
# it refuses): call it by name when PATH finds it.
command -v "$(basename "$mpirun")" >/dev/null && mpirun=$(basename "$mpirun")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
launch=("$mpirun" -np 2 --oversubscribe)
[[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
tiny=(--device cpu --d-model 16 --heads 2 --layers 1 --held-out 40 --eval-every 3 --seed 5 --threads 1 --plot "" -q)
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
losses() { tail -n +2 "$1" | cut -d, -f2; }
# Same number of steps, every loss within a relative `bound`.
close() {  # a.csv b.csv bound
  [[ $(losses "$1" | wc -l) -eq $(losses "$2" | wc -l) && $(losses "$1" | wc -l) -gt 0 ]] || return 1
  paste -d' ' <(losses "$1") <(losses "$2") |
    awk -v b="$3" '{d = $1 - $2; if (d < 0) d = -d; if (d > b * ($1 < 0 ? -$1 : $1)) bad++; m = d > m ? d : m}
                   END {printf "  max |difference| %.3g\n", m; exit bad > 0}'
}

"$train" "${tiny[@]}" --steps 8 --batch 16 --log-csv one.csv >/dev/null
"${launch[@]}" "$train" "${tiny[@]}" --steps 8 --batch 8 --bucket-mb 0.01 --check-sync --log-csv two.csv > two.out 2>&1
check "2 ranks reduced 3 buckets per step, hashes equal after every step" grep -q "3.0 collectives/step" two.out
check "2 ranks x batch 8 = 1 process x batch 16 (relative 1e-5)" close one.csv two.csv 1e-5
"${launch[@]}" "$train" "${tiny[@]}" --steps 8 --batch 8 --bucket-mb 0.01 --check-sync --sparse-embedding-grad on \
  --log-csv sparse.csv > sparse.out 2>&1
check "--sparse-embedding-grad on: 3 buckets and the rows' all-gather per step" grep -q "4.0 collectives/step" sparse.out
check "... 2 ranks x batch 8 = 1 process x batch 16 (relative 1e-5)" close one.csv sparse.csv 1e-5
"${launch[@]}" "$train" "${tiny[@]}" --steps 8 --batch 8 --bucket-mb 0.01 --log-csv again.csv >/dev/null 2>&1
check "2-rank runs repeat bit for bit" cmp -s <(losses two.csv) <(losses again.csv)
check "communication time reported" grep -q "communication: .* ms/step in MPI calls" two.out
# Under mpirun a rank's stdout is the launcher's pseudo-terminal, even with
# mpirun's output in a file: the progress must be plain lines there.
"${launch[@]}" "$train" "${tiny[@]}" --log-level info --steps 8 --batch 8 --log-csv '' > progress.out 2>&1
check "progress under mpirun, output to a file: plain lines, no CR or ESC" \
  bash -c "grep -q 'step 8/8' progress.out && ! grep -q $'\\r' progress.out && ! grep -q $'\\x1b' progress.out"

"${launch[@]}" "$train" "${tiny[@]}" --steps 4 --batch 8 --zero 1 --check-sync --checkpoint z.ck --log-csv z.csv \
  > z.out 2>&1
check "--zero 1: a reduce-scatter and an all-gather per step" grep -q "2.0 collectives/step" z.out
"$train" "${tiny[@]}" --steps 8 --batch 16 --checkpoint z.ck --resume --extend-schedule --log-csv z.csv >/dev/null 2>&1
check "ZeRO-1 on 2 ranks, resumed in 1 process = 1 process throughout" close one.csv z.csv 1e-5

# No --check-sync: it waits for the gathers after each step, before the forward
# could; the hashes are compared at the evaluations (steps 3 and 6).
zero_small=(--steps 6 --batch 8 --zero 1 --bucket-mb 0.01)
"${launch[@]}" "$train" "${tiny[@]}" "${zero_small[@]}" --zero-gather step --log-csv zs.csv > zs.out 2>&1
"${launch[@]}" "$train" "${tiny[@]}" "${zero_small[@]}" --zero-gather forward --log-csv zf.csv > zf.out 2>&1
check "--zero-gather forward = --zero-gather step, bit for bit (several buckets)" \
  bash -c "[[ -s zf.csv ]] && cmp -s <(tail -n +2 zs.csv | cut -d, -f2) <(tail -n +2 zf.csv | cut -d, -f2)"

HG_FAULT=perturb:1:3 "${launch[@]}" "$train" "${tiny[@]}" --steps 4 --batch 8 --check-sync > p.out 2>&1
check "a rank whose parameters diverge is caught by the hash check" \
  grep -q "the parameters differ across ranks after step 3: rank 0 [0-9a-f]*, rank 1 [0-9a-f]*" p.out

# SIGTERM to mpirun: Open MPI forwards it to every rank; they agree to stop
# after the same step (the loss all-reduce carries the signal), save and report.
"${launch[@]}" "$train" "${tiny[@]}" --steps 1000000 --batch 8 --checkpoint s.ck --log-csv s.csv \
  > s.out 2>&1 &
pid=$!
for _ in $(seq 600); do [[ -f s.csv && $(wc -l < s.csv) -gt 20 ]] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
last=$(tail -1 s.csv | cut -d, -f1)
check "SIGTERM to mpirun: every rank stops after step $last and the checkpoint is saved" \
  grep -q "saved s.ck (+ .optim) at step $last" s.out
check "... and it resumes" \
  bash -c "'$train' ${tiny[*]@Q} --steps $((last + 2)) --batch 16 --checkpoint s.ck --resume --extend-schedule --log-csv s.csv > /dev/null 2>&1"

start=$(date +%s)
HG_FAULT=kill:1:5 "${launch[@]}" "$train" "${tiny[@]}" --steps 8 --batch 8 --checkpoint k.ck --log-csv k.csv \
  > k.out 2>&1
rc=$?
check "a killed rank stops the job (exit $rc)" test "$rc" -ne 0
check "... and the checkpoint of step 3 resumes" \
  bash -c "'$train' ${tiny[*]@Q} --steps 8 --batch 16 --checkpoint k.ck --resume --log-csv k.csv > /dev/null 2>&1"
check "... to the same curve" close one.csv k.csv 1e-5

HG_FAULT=hang:1:5 "${launch[@]}" "$train" "${tiny[@]}" --steps 8 --batch 8 --comm-timeout 4 > h.out 2>&1
rc=$?
check "a hung rank: the job stops (exit $rc)" test "$rc" -ne 0
check "... with the timeout message" grep -q "did not complete within 4 s at step 5; another rank has died or hangs" h.out
check "... all within 60 s" test $(($(date +%s) - start)) -lt 60
if ((failures > 0)); then
  for f in two.out sparse.out z.out p.out s.out k.out h.out; do echo "--- $f"; cat $f; done
fi
exit $((failures > 0))

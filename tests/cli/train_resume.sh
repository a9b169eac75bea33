#!/usr/bin/env bash
# train's crash safety, end to end, on a tiny model (seconds on the CPU):
#   1. SIGKILL mid-run, --resume: the CSV log holds every step exactly once
#      under one header, and its losses equal an uninterrupted run's.
#   2. SIGTERM mid-run: exit 143 after saving a checkpoint at the last logged
#      step; SIGINT: exit 130; the resumed run completes the log.
#   3. A model checkpoint and optimizer state from different steps are
#      refused, unless the save was cut between its renames (then the resume
#      completes it); resuming past --steps is a usage error (exit 2).
#   4. The learning-rate schedule travels with the checkpoint: a resume with
#      another --lr or a longer --steps is refused, --extend-schedule
#      continues it without a jump.
#
#   train_resume.sh PATH/TO/train
set -uo pipefail
train=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
tiny=(--device cpu --d-model 16 --heads 2 --layers 1 --held-out 40 --batch 8 --eval-every 25 --seed 3 --threads 1)
N=400  # steps: long enough that a kill lands mid-run, even at ~1 ms per step
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
rows() {  # complete or partial rows in a log (0 when there is none yet)
  local n=0
  [[ -f $1 ]] && n=$(tail -n +2 "$1" | grep -c '^[0-9]')
  echo "${n:-0}"
}
wait_rows() {  # file, count: until the log has that many complete rows (60 s at most)
  for _ in $(seq 3000); do
    (($(rows "$1") >= $2)) && return 0
    sleep 0.02
  done
  return 1
}
# Every step 1..N exactly once, in order, 7 fields each, header first and once.
continuous() {  # file, N
  [[ $(head -1 "$1") == step,loss,lr,ms,tokens_per_s,eval_loss,eval_token_acc ]] || return 1
  [[ $(grep -c '^step,' "$1") == 1 ]] || return 1
  [[ $(tail -n +2 "$1" | cut -d, -f1 | tr '\n' ' ') == "$(seq -s ' ' 1 "$2") " ]] || return 1
  ! tail -n +2 "$1" | awk -F, 'NF != 7 { bad = 1 } END { exit !bad }'
}
# step and loss of every row: what a bit-exact resume reproduces.
losses() { cut -d, -f1,2 "$1"; }

# ---- reference: N steps uninterrupted
"$train" "${tiny[@]}" --steps $N --log-csv ref.csv --plot '' -q > ref.out 2>&1
check "uninterrupted run" continuous ref.csv $N

# ---- 1. SIGKILL after step 60 or a little later (checkpoints every 25 steps), resume
"$train" "${tiny[@]}" --steps $N --log-csv kill.csv --plot kill.png --checkpoint kill.ck -q > kill1.out 2>&1 &
pid=$!
wait_rows kill.csv 60
kill -KILL $pid
wait $pid
check "SIGKILL exit status 137" [ $? == 137 ]
check "SIGKILL landed mid-run (the log stops before step $N)" [ "$(rows kill.csv)" -lt $N ]
"$train" "${tiny[@]}" --steps $N --log-csv kill.csv --plot kill.png --checkpoint kill.ck --resume > kill2.out 2>&1
check "resume after SIGKILL exits 0" [ $? == 0 ]
check "resume after SIGKILL: the log has steps 1..N once each" continuous kill.csv $N
check "resume after SIGKILL: losses equal the uninterrupted run's" diff <(losses ref.csv) <(losses kill.csv)
if grep -q -- "--plot kill.png skipped" kill2.out; then  # a build without cairo says so and writes none
  check "resume after SIGKILL: no plot in a build without plots" [ ! -e kill.png ]
else
  check "resume after SIGKILL: the plot exists, PNG, under 150 KB" \
    bash -c '[[ $(head -c 4 kill.png | tail -c 3) == PNG && $(stat -c %s kill.png) -lt 153600 ]]'
fi

# ---- 2. SIGTERM (exit 143) and SIGINT (exit 130), each resumed
for sig in TERM INT; do
  want=$([[ $sig == TERM ]] && echo 143 || echo 130)
  "$train" "${tiny[@]}" --steps $N --log-csv $sig.csv --plot '' --checkpoint $sig.ck > $sig.1.out 2>&1 &
  pid=$!
  wait_rows $sig.csv 30
  kill -$sig $pid
  wait $pid
  check "SIG$sig: exit status $want" [ $? == "$want" ]
  check "SIG$sig: landed mid-run" [ "$(rows $sig.csv)" -lt $N ]
  check "SIG$sig: says it stopped and saved" grep -q "stopped by SIG$sig after step" $sig.1.out
  check "SIG$sig: summary written" grep -q "==== summary ====" $sig.1.out
  stopped=$(grep -oE 'stopped by SIG[A-Z]+ after step [0-9]+' $sig.1.out | grep -oE '[0-9]+$')
  check "SIG$sig: the log ends at the step it stopped after" [ "$(tail -1 $sig.csv | cut -d, -f1)" == "$stopped" ]
  "$train" "${tiny[@]}" --steps $N --log-csv $sig.csv --plot '' --checkpoint $sig.ck --resume > $sig.2.out 2>&1
  check "SIG$sig: resume continues from step $stopped" grep -q "resumed from $sig.ck (+ .optim) at step $stopped" $sig.2.out
  check "SIG$sig: the log has steps 1..N once each" continuous $sig.csv $N
  check "SIG$sig: losses equal the uninterrupted run's" diff <(losses ref.csv) <(losses $sig.csv)
done

# ---- 3. mismatched checkpoint pair; resume past the end
"$train" "${tiny[@]}" --steps 20 --log-csv a.csv --plot '' --checkpoint a.ck -q > /dev/null 2>&1
cp a.ck.optim a20.optim
"$train" "${tiny[@]}" --steps 30 --log-csv a.csv --plot '' --checkpoint a.ck --resume --extend-schedule -q > /dev/null 2>&1
"$train" "${tiny[@]}" --steps 20 --log-csv b.csv --plot '' --checkpoint a.ck --resume > past.out 2>&1
check "resume past the end: exit 2" [ $? == 2 ]
check "resume past the end: message names --steps and the step" grep -q -- "--steps 20: the checkpoint a.ck is already at step" past.out
cp a.ck.optim a30.optim
cp a20.optim a.ck.optim  # model from step 30, optimizer from step 20
"$train" "${tiny[@]}" --steps 40 --log-csv a.csv --plot '' --checkpoint a.ck --resume --extend-schedule > mismatch.out 2>&1
check "mismatched pair: exit 1" [ $? == 1 ]
check "mismatched pair: message names both steps" grep -q "is from step 30 but a.ck.optim is from step 20" mismatch.out
# A save killed between its two renames: model at 30, optimizer at 20, the
# optimizer's step-30 state still in .optim.next: the resume completes it.
cp a30.optim a.ck.optim.next
"$train" "${tiny[@]}" --steps 40 --log-csv a.csv --plot '' --checkpoint a.ck --resume --extend-schedule > completed.out 2>&1
check "save interrupted between renames: resume completes it and exits 0" [ $? == 0 ]
check "save interrupted between renames: says so" grep -q "completed a checkpoint save that was interrupted (step 30)" completed.out
check "save interrupted between renames: resumed at step 30" grep -q "at step 30" completed.out

# ---- 4. the learning-rate schedule is the checkpoint's: a longer --steps is
# refused unless --extend-schedule, which continues without a jump.
sched=("${tiny[@]}" --warmup 5 --plot '' --checkpoint s.ck)
"$train" "${sched[@]}" --steps 20 --log-csv s.csv -q > /dev/null 2>&1
"$train" "${sched[@]}" --steps 40 --log-csv s.csv --resume > longer.out 2>&1
check "longer --steps on resume without --extend-schedule: exit 2" [ $? == 2 ]
check "longer --steps on resume: message names the schedule's end, the jump and --extend-schedule" \
  grep -q -- "--steps 40: the checkpoint's schedule ends at step 20 .*would jump from 0.0003 to .*--extend-schedule" longer.out
"$train" "${sched[@]}" --steps 40 --lr 0.001 --log-csv s.csv --resume > lr.out 2>&1
check "another --lr on resume: exit 2, names the saved one" grep -q -- "--lr 0.001: the checkpoint's run used --lr 0.003" lr.out
"$train" "${sched[@]}" --steps 40 --log-csv s.csv --resume --extend-schedule -q > extend.out 2>&1
check "--extend-schedule: exit 0" [ $? == 0 ]
check "--extend-schedule: the log has steps 1..40 once each" continuous s.csv 40
# The saved schedule had reached its floor, 10% of --lr, at step 20: the
# extension holds it (without it the rate would have jumped to 1.9e-3).
check "--extend-schedule: lr of steps 21..40 stays at 0.0003" \
  awk -F, 'NR > 1 && $1 > 20 && $3 != 0.0003 { bad = 1 } END { exit bad }' s.csv
# A second resume of the extended run keeps the extended schedule.
"$train" "${sched[@]}" --steps 40 --log-csv s.csv --resume -q > again.out 2>&1
check "resume of an extended run at its end: refused as past the end" grep -q -- "already at step 40" again.out

if ((failures)); then
  for f in *.out; do echo "--- $f"; tail -5 "$f"; done
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

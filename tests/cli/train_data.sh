#!/usr/bin/env bash
# train --data with its tokenizers, the run record and the flags around it,
# end to end on tiny models (seconds on the CPU):
#   1. --tokenizer bpe trains its vocabulary on the training part only: a word
#      that stands only in the held-out last 10% is no piece of CK.tokenizer
#      (and one in the training part is);
#   2. the checkpoint carries CK.json (the resolved flags) and CK.tokenizer;
#      --eval-only prints the run's last held-out loss and accuracy again and
#      changes no file; a flag against the record is refused naming both values;
#   3. --resume takes the model, data and tokenizer from CK.json alone, and
#      continues to the losses of an uninterrupted run; a damaged record or a
#      missing tokenizer file is an error naming the file; a checkpoint without
#      a record (an older train) resumes from the flags, with a warning;
#   4. --config FILE.json sets flags, the command line wins.
#
#   train_data.sh PATH/TO/train [bpe]   (bpe: the build has SentencePiece)
set -uo pipefail
train=$(realpath "$1")
with_bpe=${2:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
# 1200 lines of prose; the last 60 (within the held-out last 10%) also hold "zyzzyva", the first 100 "quokka".
for i in $(seq 1200); do
  line="the quick brown fox $((i % 13)) jumps over the lazy dog and runs home"
  ((i <= 100)) && line="$line quokka quokka"
  ((i > 1140)) && line="$line zyzzyva zyzzyva"
  echo "$line"
done > corpus.txt
tiny=(--device cpu --d-model 16 --heads 2 --layers 1 --seq-len 32 --batch 8 --eval-every 4 --seed 5 --threads 1
      --plot '')

if [[ $with_bpe == bpe ]]; then
  "$train" --data corpus.txt --tokenizer bpe --vocab-size 400 "${tiny[@]}" --steps 4 --checkpoint bpe.ck \
    --log-csv bpe.csv > bpe.out 2>&1
  check "bpe run exits 0" test $? -eq 0
  check "bpe: vocabulary trained on the training part" grep -q "trained a bpe vocabulary of [0-9]* pieces on the training part" bpe.out
  check "bpe: CK.tokenizer written" test -s bpe.ck.tokenizer
  check "bpe: a word of the training part is a piece" grep -q quokka bpe.ck.tokenizer
  check "bpe: a word only in the held-out part is not" bash -c "! grep -q zyzzyva bpe.ck.tokenizer"
  check "bpe: the sample decodes through the tokenizer" grep -A1 -q "^sample (prompt in \[brackets\]" bpe.out
  check "bpe: held-out accuracy in bpe tokens" grep -qE "held-out \(last 10% of corpus.txt, 4 batches of 8 x 32 bpe tokens\): loss [0-9.]+, token accuracy [0-9.]+%" bpe.out
  check "bpe: CK.json records the tokenizer" grep -q '"tokenizer": "bpe"' bpe.ck.json
  "$train" --eval-only --checkpoint bpe.ck > bpe_eval.out 2>&1
  check "bpe: --eval-only exits 0" test $? -eq 0
  check "bpe: --eval-only gives the run's numbers" \
    test "$(grep '^held-out' bpe.out)" == "$(grep '^held-out' bpe_eval.out)"
  mv bpe.ck.tokenizer saved.tokenizer
  "$train" --eval-only --checkpoint bpe.ck > notok.out 2>&1
  check "bpe: a missing CK.tokenizer: exit 1 naming it" \
    bash -c "test $? -eq 1 && grep -q \"bpe.ck.tokenizer' does not exist\" notok.out"
  echo "garbage" > bpe.ck.tokenizer
  "$train" --eval-only --checkpoint bpe.ck > badtok.out 2>&1
  check "bpe: a damaged CK.tokenizer: exit 1 naming it" \
    bash -c "test $? -eq 1 && grep -q 'bpe.ck.tokenizer: .*not a SentencePiece model' badtok.out"
fi

# ---- 2. the record and --eval-only (bytes)
"$train" --data corpus.txt "${tiny[@]}" --steps 8 --log-csv full.csv > full.out 2>&1
check "uninterrupted bytes run exits 0" test $? -eq 0
"$train" --data corpus.txt "${tiny[@]}" --steps 4 --checkpoint ck --log-csv part.csv > first.out 2>&1
check "first half exits 0" test $? -eq 0
check "CK.json written" test -s ck.json
check "CK.json: format, task, tokenizer, model and flags" \
  bash -c "grep -q '\"format\": \"handgrad-run\"' ck.json && grep -q '\"task\": \"data\"' ck.json &&
           grep -q '\"tokenizer\": \"bytes\"' ck.json && grep -q '\"d_model\": 16' ck.json &&
           grep -q '\"seq-len\": 32' ck.json && grep -q '\"data\": \"corpus.txt\"' ck.json"
check "bytes: no CK.tokenizer" test ! -e ck.tokenizer
check "held-out token accuracy logged for --data" grep -qE "^4,([^,]*,){4}[0-9.]+,[0-9.]+$" part.csv
files() { ls -l --time-style=full-iso --ignore='*.out'; md5sum ck ck.* part.csv; }
before=$(files)
"$train" --eval-only --checkpoint ck > eval.out 2>&1
check "--eval-only exits 0" test $? -eq 0
check "--eval-only: the model comes from CK.json" grep -q "d_model 16, heads 2, layers 1, seq 32, batch 8" eval.out
check "--eval-only: the run's last held-out loss and accuracy" \
  test "$(grep '^held-out' first.out)" == "$(grep '^held-out' eval.out)"
check "--eval-only: no training" bash -c "! grep -qE '^step |==== summary' eval.out"
check "--eval-only: no file written or changed" test "$before" == "$(files)"
"$train" --eval-only --checkpoint ck --d-model 32 > contra.out 2>&1
check "--eval-only --d-model 32: exit 2" test $? -eq 2
check "--eval-only --d-model 32: names both values and the record" \
  grep -q -- "--d-model 32: the checkpoint's run used --d-model 16 (ck.json)" contra.out
"$train" --eval-only --checkpoint ck --data bpe.out > contra2.out 2>&1
check "--eval-only with another --data: exit 2 naming both files" \
  bash -c "test $? -eq 2 && grep -q -- '--data bpe.out: the checkpoint.s run used --data corpus.txt' contra2.out"

# ---- 3. --resume from the record alone
"$train" --checkpoint ck --resume --steps 8 --extend-schedule --threads 1 > resume.out 2>&1
check "--resume with the record alone exits 0" test $? -eq 0
check "--resume: continued at step 4" grep -q "resumed from ck (+ .optim) at step 4" resume.out
check "--resume: the log named in the record continues" test "$(cut -d, -f1,2 full.csv)" == "$(cut -d, -f1,2 part.csv)"
"$train" --checkpoint ck --resume --steps 12 --extend-schedule --seed 6 > seed.out 2>&1
check "--resume --seed 6: exit 2, names both values" \
  bash -c "test $? -eq 2 && grep -q -- '--seed 6: the checkpoint.s run used --seed 5 (ck.json)' seed.out"
"$train" --checkpoint ck --resume --steps 12 --extend-schedule --tokenizer bytes --device cpu -q > same.out 2>&1
check "--resume with the recorded value given, and a per-run flag changed: exit 0" test $? -eq 0
cp ck.json good.json
head -c 100 good.json > ck.json
"$train" --checkpoint ck --resume --steps 16 --extend-schedule > damaged.out 2>&1
check "a damaged CK.json: exit 1 naming it" bash -c "test $? -eq 1 && grep -q 'ck.json: not JSON' damaged.out"
sed 's/"d_model": 16/"d_model": 32/' good.json > ck.json
"$train" --checkpoint ck --resume --steps 16 --extend-schedule > edited.out 2>&1
check "a CK.json whose model differs from its flags: exit 1" \
  bash -c "test $? -eq 1 && grep -q 'ck.json: records task data, tokenizer bytes, model vocab 256 seq 32 d_model 32' edited.out"
rm ck.json
"$train" --data corpus.txt "${tiny[@]}" --checkpoint ck --resume --steps 16 --extend-schedule --log-csv '' > old.out 2>&1
check "a checkpoint without CK.json resumes from the flags, with a warning" \
  bash -c "test $? -eq 0 && grep -q 'ck.json does not exist (the checkpoint was written by an older train)' old.out"
check "... and writes CK.json" test -s ck.json

# ---- 4. --config
cat > run.json <<'JSON'
{"data": "corpus.txt", "d-model": 24, "heads": 2, "layers": 1, "seq-len": 16, "batch": 4, "steps": 2,
 "device": "cpu", "plot": "", "log-csv": "", "threads": 1}
JSON
"$train" --config run.json --d-model 8 > config.out 2>&1
check "--config run: exit 0" test $? -eq 0
check "--config: the command line wins, the file sets the rest" \
  grep -q "d_model 8, heads 2, layers 1, seq 16, batch 4" config.out
check "--config: --data from the file" grep -q "language model on corpus.txt" config.out

if ((failures)); then
  for f in *.out; do echo "--- $f"; tail -5 "$f"; done
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"

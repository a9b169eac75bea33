#!/usr/bin/env bash
# train --task translate and translate, end to end on 40 pairs (seconds on the CPU):
#   0. --valid/--test files are used as given;
#   1. a run with --checkpoint writes CK, CK.optim and CK.vocab, logs valid
#      BLEU in the CSV, reports the malformed line and prints test BLEU;
#   2. --resume continues from CK.vocab's vocabulary (no new one is trained)
#      to the same losses as an uninterrupted run; --eval-only reports valid
#      and test BLEU from the checkpoint and its CK.json alone, writing nothing;
#   3. translate reads stdin and prints one line per input line, greedy and
#      beam, and beam 1 prints what greedy prints; a line longer than the
#      model's context is cut, with a warning.
#
#   translate_roundtrip.sh PATH/TO/train PATH/TO/translate PATH/TO/pairs.tsv
set -uo pipefail
train=$(realpath "$1")
translate=$(realpath "$2")
pairs=$(realpath "$3")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
base=(--task translate --pairs "$pairs" --valid-pairs 4 --test-pairs 4 --vocab-size 120 --device cpu --d-model 16
      --heads 2 --layers 1 --batch 8 --eval-every 4 --seed 3 --threads 1)
tiny=("${base[@]}" --plot '')
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

"$train" "${tiny[@]}" --seq-len 64 --steps 8 --log-csv full.csv > full.out 2>&1
check "uninterrupted run exits 0" test $? -eq 0
"$train" "${tiny[@]}" --seq-len 64 --steps 4 --checkpoint ck --log-csv part.csv > first.out 2>&1
check "first half exits 0" test $? -eq 0
check "checkpoint, optimizer state and vocabulary written" test -s ck -a -s ck.optim -a -s ck.vocab
check "malformed line reported with its number" grep -q "tiny_pairs.tsv line 41: no tab" first.out
check "test BLEU in the summary" grep -qE "^test BLEU [0-9.]+ \([0-9]+ pairs, greedy" first.out
check "valid_bleu column in the log" grep -q "^step,loss,lr,ms,tokens_per_s,eval_loss,eval_token_acc,valid_bleu$" part.csv
check "valid BLEU logged at step 4" grep -qE "^4,([^,]*,){6}[0-9.]+$" part.csv
vocab_before=$(md5sum < ck.vocab)
"$train" "${tiny[@]}" --seq-len 64 --steps 8 --checkpoint ck --log-csv part.csv --resume --extend-schedule > resume.out 2>&1
check "resumed run exits 0" test $? -eq 0
check "resume trains no new vocabulary" bash -c "! grep -q 'trained a bpe vocabulary' resume.out"
check "CK.vocab unchanged by the resume" test "$vocab_before" == "$(md5sum < ck.vocab)"
check "resumed losses equal the uninterrupted run's" test "$(cut -d, -f1,2 full.csv)" == "$(cut -d, -f1,2 part.csv)"
before=$(md5sum ck ck.* part.csv)
"$train" --eval-only --checkpoint ck > evalonly.out 2>&1
check "--eval-only (flags from ck.json) exits 0" test $? -eq 0
check "--eval-only: valid loss and BLEU, test BLEU" \
  bash -c "grep -qE '^valid: loss [0-9.]+, BLEU [0-9.]+ \(greedy\)' evalonly.out && grep -qE '^test BLEU [0-9.]+' evalonly.out"
check "--eval-only: trains no vocabulary, changes no file" \
  bash -c "! grep -q 'trained a' evalonly.out && test \"\$1\" == \"\$(md5sum ck ck.* part.csv)\"" _ "$before"

# --valid/--test given as files: nothing is cut from --pairs (the corpus has 40 valid pairs).
head -5 "$pairs" > valid.tsv
"$train" "${tiny[@]}" --seq-len 200 --steps 2 --valid valid.tsv --test "$pairs" --log-csv '' > files.out 2>&1
check "--valid and --test files replace the split" grep -qF "train 40, valid 5, test 40 pairs" files.out
check "--plot '' and --log-csv '': no plot and no log written, the summary says so" \
  bash -c "test -z \"\$(ls *.png *.svg train_log.csv 2>/dev/null)\" && grep -q '^log: none$' files.out"

# --log-csv and --plot write the files they name (the plot when plots are
# available, else a warning says why); --profile-steps prints its breakdown.
mkdir named && (cd named && "$train" "${base[@]}" --seq-len 64 --steps 14 --log-csv l.csv --plot p.svg \
  --profile-steps 2 > ../named.out 2>&1)
check "named run exits 0" test $? -eq 0
check "--log-csv l.csv: header and 14 rows, nothing else written but the plots" \
  bash -c "test \$(wc -l < named/l.csv) -eq 15 && test -z \"\$(ls named | grep -v -x -e l.csv -e p.svg -e p_bleu.svg)\""
check "--plot p.svg: the loss and BLEU plots, or the reason they were skipped" \
  bash -c "test -s named/p.svg -a -s named/p_bleu.svg || grep -q -- '--plot p.svg skipped' named.out"
check "--profile-steps 2: the breakdown of 2 steps" \
  bash -c "grep -qE '^profile of 2 steps .*upload .*optimizer' named.out && grep -qE 'outside them' named.out"

printf 'Open file\nunknown option\n' > in.txt
"$translate" --checkpoint ck --device cpu < in.txt > greedy.txt 2> translate.err
check "translate exits 0" test $? -eq 0
check "one output line per input line" test "$(wc -l < greedy.txt)" -eq 2
"$translate" --checkpoint ck --device cpu --beam 1 < in.txt > beam1.txt 2>/dev/null
check "beam 1 prints what greedy prints" cmp -s greedy.txt beam1.txt
"$translate" --checkpoint ck --device cpu --beam 3 < in.txt > beam3.txt 2>/dev/null
check "beam 3 exits 0 with two lines" test $? -eq 0 -a "$(wc -l < beam3.txt)" -eq 2
long=$(printf 'word%d ' $(seq 200))
printf 'Open file\n%s\n' "$long" | "$translate" --checkpoint ck --device cpu > long.txt 2> long.err
check "a line longer than the context: translated in part, with a warning naming it" \
  bash -c "test \$(wc -l < long.txt) -eq 2 && grep -q 'line 2: longer than the model.s context of 64 pieces' long.err"
"$translate" --checkpoint full.csv --device cpu < in.txt > /dev/null 2> bad.err
check "a checkpoint without .vocab is a runtime error naming it" \
  bash -c "test $? -eq 1 && grep -q 'full.csv.vocab' bad.err"
exit $((failures > 0))

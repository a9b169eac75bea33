#!/usr/bin/env bash
# train --data and generate, end to end on 3 KB of text (seconds on the CPU):
#   1. a tiny byte-level model trained for a few steps with --checkpoint
#      writes CK and CK.json;
#   2. generate prints the prompt and its continuation on stdout and the
#      speed on stderr; the same seed gives the same text, another seed
#      other text; temperature 0 runs and repeats itself; --samples 2 prints
#      two continuations; a prompt longer than the context is cut, with a
#      note; bad flags exit 2.
#
#   3. with "bpe" as the fourth argument (a build with SentencePiece), the
#      same with a bpe vocabulary (CK.tokenizer): the text comes back whole.
#
#   generate_roundtrip.sh PATH/TO/train PATH/TO/generate PATH/TO/text [bpe]
set -uo pipefail
train=$(realpath "$1")
generate=$(realpath "$2")
text=$(realpath "$3")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
failures=0
check() {  # description, condition...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

"$train" --data "$text" --device cpu --d-model 32 --heads 2 --layers 1 --seq-len 32 --batch 8 --steps 20 --seed 1 \
  --threads 1 --checkpoint ck --log-csv '' --plot '' > train.out 2>&1
check "train --data --checkpoint exits 0" test $? -eq 0
check "checkpoint and run record written" test -s ck -a -s ck.json

gen=("$generate" --checkpoint ck --device cpu --threads 1 --max-new-tokens 40)
"${gen[@]}" --prompt "Open the " --seed 3 > a.txt 2> a.err
check "generate exits 0" test $? -eq 0
check "stdout starts with the prompt" test "$(head -c 9 a.txt)" == "Open the "
check "stdout holds the prompt and 40 new bytes (and a newline)" test "$(wc -c < a.txt)" -eq 50
check "stderr reports tokens/s" grep -qE "40 new tokens x 1 samples in [0-9.]+ s: [0-9.]+ tokens/s" a.err
"${gen[@]}" --prompt "Open the " --seed 3 > b.txt 2>/dev/null
check "the same seed gives the same text" cmp -s a.txt b.txt
"${gen[@]}" --prompt "Open the " --seed 4 > c.txt 2>/dev/null
check "another seed gives other text" bash -c "! cmp -s a.txt c.txt"
"${gen[@]}" --prompt "Open the " --temperature 0 > g1.txt 2>/dev/null
check "temperature 0 exits 0" test $? -eq 0
"${gen[@]}" --prompt "Open the " --temperature 0 --seed 9 > g2.txt 2>/dev/null
check "temperature 0 is greedy: the seed does not matter" cmp -s g1.txt g2.txt
"${gen[@]}" --prompt "Open the " --top-k 1 --seed 5 > k1.txt 2>/dev/null
check "top-k 1 prints what temperature 0 prints" cmp -s g1.txt k1.txt
"${gen[@]}" --prompt "Open the " --kernels unfused --top-p 0.9 --top-k 20 --seed 3 > u.txt 2>/dev/null
check "unfused kernels with top-k and top-p exit 0" test $? -eq 0
"${gen[@]}" --prompt "Open the " --samples 2 > s.txt 2>/dev/null
check "--samples 2 prints two continuations" test "$(grep -c '^---------------$' s.txt)" -eq 1
long=$(printf 'word%d ' $(seq 20))
"${gen[@]}" --prompt "$long" > long.txt 2> long.err
check "a prompt longer than the context: exit 0 and a note" \
  bash -c "test $? -eq 0 && grep -qE 'the prompt has [0-9]+ tokens; the model sees its last 32 ' long.err"
"${gen[@]}" --prompt "" > empty.txt 2> empty.err
check "an empty prompt is a usage error" bash -c "test $? -eq 2 && grep -q 'encodes to no tokens' empty.err"
"${gen[@]}" --temperature -1 > /dev/null 2> bad.err
check "a negative temperature is a usage error" bash -c "test $? -eq 2 && grep -q -- '--temperature' bad.err"
if [[ ${4:-} == bpe ]]; then
  "$train" --data "$text" --device cpu --d-model 32 --heads 2 --layers 1 --seq-len 32 --batch 8 --steps 20 --seed 1 \
    --threads 1 --tokenizer bpe --vocab-size 400 --checkpoint bpe --log-csv '' --plot '' > bpe_train.out 2>&1
  check "train --tokenizer bpe writes CK.tokenizer" test $? -eq 0 -a -s bpe.tokenizer
  "$generate" --checkpoint bpe --device cpu --threads 1 --prompt "Open the file" --max-new-tokens 12 --seed 2 \
    > bpe.txt 2> bpe.err
  check "generate with a bpe vocabulary exits 0 and says so" \
    bash -c "test $? -eq 0 && grep -q 'bpe tokenizer of [0-9]* ids' bpe.err"
  check "the prompt comes back whole" test "$(head -c 13 bpe.txt)" == "Open the file"
fi
exit $((failures > 0))

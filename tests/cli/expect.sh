#!/usr/bin/env bash
# One command-line check: runs a program in a fresh temporary directory and
# checks its exit code and its output (stdout and stderr together).
#
#   expect.sh RC REGEX [--not REGEX] [--env NAME=VALUE]... -- PROGRAM ARGS...
#
# REGEX (grep -E) must match the output; --not REGEX must not.
set -uo pipefail
want_rc=$1 want_re=$2
shift 2
not_re="" envs=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --not) not_re=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    *) echo "expect.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
shift  # --
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
out=$(env "${envs[@]}" timeout 120 "$@" 2>&1)
rc=$?
fail=0
[[ $rc == "$want_rc" ]] || { echo "FAIL: exit code $rc, expected $want_rc"; fail=1; }
grep -qE -- "$want_re" <<<"$out" || { echo "FAIL: output does not match /$want_re/"; fail=1; }
if [[ -n $not_re ]] && grep -qE -- "$not_re" <<<"$out"; then echo "FAIL: output matches /$not_re/"; fail=1; fi
echo "--- command: $*"
echo "--- output (exit code $rc):"
echo "$out" | tail -20
exit $fail

#!/usr/bin/env bash
# Formats the tracked C++ and CUDA files (*.cpp *.hpp *.h *.cu *.cuh) with
# clang-format and the repository's .clang-format.
#
#   scripts/format.sh           format them in place
#   scripts/format.sh --check   change nothing; list the files whose formatting
#                               differs and exit 1 if there is any (CTest's
#                               `format` test runs this)
#
# The style is defined by clang-format 14 (Debian 12's, what CI installs);
# other versions may format some lines differently, so another version gets a
# warning. CLANG_FORMAT=/path/to/clang-format picks the binary.
# Paths matching a pattern in .clang-format-ignore (shell globs from the
# repository root, # comments) are left alone.
# Without clang-format the check exits 77 (CTest: skipped), except under CI
# (CI=true), where a missing formatter is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "format.sh: unknown argument '$arg' (allowed: --check, --help)" >&2; exit 2 ;;
  esac
done

clang_format="${CLANG_FORMAT:-}"
if [[ -z $clang_format ]]; then
  for c in clang-format-14 clang-format; do
    if command -v "$c" >/dev/null 2>&1; then clang_format=$c; break; fi
  done
fi
if [[ -z $clang_format ]] || ! command -v "$clang_format" >/dev/null 2>&1; then
  if [[ ${CI:-} == true ]]; then
    echo "format.sh: clang-format not found, and CI=true: scripts/install_deps.sh installs it" >&2
    exit 1
  fi
  echo "format.sh: SKIPPED: clang-format not found (apt-get install clang-format, or scripts/install_deps.sh)"
  exit 77
fi
version=$("$clang_format" --version)
if [[ ! $version =~ version\ 14\. ]]; then
  echo "format.sh: warning: the style is checked with clang-format 14; '$version' may format some lines differently" >&2
fi

ignore=()
if [[ -f .clang-format-ignore ]]; then
  while IFS= read -r line; do
    line="${line%%#*}"
    line="${line//[[:space:]]/}"
    [[ -n $line ]] && ignore+=("$line")
  done < .clang-format-ignore
fi

files=()
while IFS= read -r f; do
  skip=0
  for pattern in "${ignore[@]+"${ignore[@]}"}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    [[ $f == $pattern ]] && { skip=1; break; }
  done
  ((skip)) || files+=("$f")
done < <(git ls-files -- '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
if ((${#files[@]} == 0)); then
  echo "format.sh: no C++/CUDA files found (run it inside the git checkout)" >&2
  exit 2
fi

if ((check == 0)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "$(nproc)" "$clang_format" -i
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi

# Every file that clang-format would change, with the count of its lines that differ.
differ=$(printf '%s\0' "${files[@]}" | xargs -0 -n 1 -P "$(nproc)" sh -c '
  n=$("$0" "$1" | diff -- "$1" - | grep -c "^<" || true)
  [ "$n" -gt 0 ] && echo "$1 ($n lines)"; true' "$clang_format" | sort)
if [[ -n $differ ]]; then
  n_files=$(wc -l <<<"$differ")
  echo "format.sh: $n_files of ${#files[@]} files are not formatted as .clang-format says (scripts/format.sh fixes them):"
  echo "$differ" | sed 's/^/  /'
  exit 1
fi
echo "format.sh: ${#files[@]} files formatted as .clang-format says"

#!/usr/bin/env python3
"""Does a change to a .cu file change its device code? Compiles FILE at two git
revisions to PTX (sm_90, the Release flags) and compares every kernel's PTX.
Before the comparison, names that only encode the file's path or the order of
the kernels are normalised: anonymous-namespace tags, local shared-memory
symbols, branch labels and .loc lines.

Identical PTX gives identical machine code (ptxas is deterministic), so a
kernel reported identical needs no new GPU run after a refactor. The runs
that checked the old revision still hold for it: its tests and
compute-sanitizer. Host code, and which kernel runs at which size, are not
compared.

Usage: scripts/ptx_compare.py REV_A REV_B [--file F] [--rename-a REGEX REPL]
  REV_B may be WORKTREE (the files as they are on disk); F defaults to
  cuda/layernorm.cu. --rename-a rewrites REV_A's demangled kernel names
  before matching, for a change that drops a template argument, e.g.
  --rename-a '(layernorm_forward_kernel<[^>]*), false>' '\1>'
Exit status: 0 if every kernel of both revisions is identical, 1 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                      check=True).stdout.strip()
NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")


def checkout(rev, into):
    """The repository's tracked files at `rev` (or as on disk) under `into`."""
    if rev == "WORKTREE":
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        subprocess.run(["tar", "cf", into + ".tar", *files], cwd=ROOT, check=True)
    else:
        subprocess.run(["git", "archive", "-o", into + ".tar", rev], cwd=ROOT, check=True)
    os.makedirs(into)
    subprocess.run(["tar", "xf", into + ".tar", "-C", into], check=True)


def kernels(ptx_path):
    """{demangled kernel name: normalised PTX body}."""
    text = open(ptx_path).read()
    bodies = {}
    for match in re.finditer(r"\.entry (\S+)\(.*?^\}", text, re.S | re.M):
        name, body = match.group(1), match.group(0)
        body = body.replace(name, "KERNEL")
        body = re.sub(r"\.loc.*\n", "", body)
        body = re.sub(r"_ZZ\w*E\d+([A-Za-z_]\w*)", r"LOCAL_\1", body)  # function-local statics
        body = re.sub(r"\d*_GLOBAL__N__\w+?_cu_[0-9a-f]+", "ANON", body)  # path-derived namespace tag
        body = re.sub(r"\$L__BB\d+_", "BB_", body)  # labels carry the kernel's index in the file
        bodies[name] = body
    names = list(bodies)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    return {d: bodies[n] for d, n in zip(demangled, names)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--file", default="cuda/layernorm.cu")
    parser.add_argument("--rename-a", nargs=2, metavar=("REGEX", "REPL"))
    args = parser.parse_args()
    rev_a, rev_b, path = args.rev_a, args.rev_b, args.file
    with tempfile.TemporaryDirectory() as tmp:
        found = []
        for tag, rev in (("a", rev_a), ("b", rev_b)):
            tree = os.path.join(tmp, tag)
            checkout(rev, tree)
            ptx = os.path.join(tmp, tag + ".ptx")
            subprocess.run([NVCC, "-ptx", "-O3", "-DNDEBUG", "-DHG_WITH_CUDA=1", "-arch=sm_90",
                            "--expt-relaxed-constexpr", "-std=c++17", "-I" + tree, "-I" + os.path.join(ROOT, ".deps/include"),
                            "-o", ptx, os.path.join(tree, path)], check=True)
            found.append(kernels(ptx))
    a, b = found
    if args.rename_a:
        a = {re.sub(args.rename_a[0], args.rename_a[1], k): v for k, v in a.items()}
    same = sorted(k for k in a.keys() & b.keys() if a[k] == b[k])
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    for k in changed:
        print("changed:    ", k)
    for k in sorted(a.keys() - b.keys()):
        print("only in", rev_a + ":", k)
    for k in sorted(b.keys() - a.keys()):
        print("only in", rev_b + ":", k)
    print(f"{path}: {len(same)} kernels identical, {len(changed)} changed, "
          f"{len(a.keys() - b.keys())} only in {rev_a}, {len(b.keys() - a.keys())} only in {rev_b}")
    sys.exit(0 if len(same) == len(a) == len(b) else 1)


if __name__ == "__main__":
    main()

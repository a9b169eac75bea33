#!/usr/bin/env python3
"""Does a change to a .cu file change its device code? Compiles FILE at two git
revisions to PTX (sm_90, the Release flags) and compares every kernel's PTX.
Before the comparison, names that only encode the file's path, the compile or
the order of the kernels are normalised: anonymous-namespace tags, the tags of
internal-linkage globals (`_INTERNAL_<hex>_`, new at every compile), local
shared-memory symbols, branch labels and .loc lines.

Identical PTX gives identical machine code (ptxas is deterministic), so a
kernel reported identical needs no new GPU run after a refactor. The runs
that checked the old revision still hold for it: its tests and
compute-sanitizer. Host code, and which kernel runs at which size, are not
compared.

Usage: scripts/ptx_compare.py REV_A REV_B [--file F]... [--rename-a REGEX REPL]... [--diff SUBSTRING]
                              [--match-bodies] [--cubin] [--arch sm_90a]
  REV_B may be WORKTREE (the files as they are on disk); F defaults to
  cuda/layernorm.cu. --rename-a rewrites REV_A's demangled kernel names
  before matching, for a change that drops a template argument, e.g.
  --rename-a '(layernorm_forward_kernel<[^>]*), false>' '\1>'
  (may be given several times; applied in order).
A changed kernel is reported as "identical up to register names" (the same
program, its virtual registers numbered differently), "same float/memory
ops" (its floating-point, memory and barrier instructions are the same
opcodes in the same order; the difference lies in integer instructions or
operands, to be read with --diff SUBSTRING, which prints the normalised PTX
diff of the changed kernels whose name contains it), or "float/memory ops
differ". Changed kernels need their GPU tests again.
--cubin compares the machine code instead (each kernel's .text section in
an sm_90 cubin): for kernels whose PTX differs only in how the front end
numbered or ordered its virtual registers (ptxas can allocate such PTX
differently). --arch sm_90a compiles for sm_90a instead, for the files
built for it (cuda/attention_wgmma.cu: its kernel is empty at sm_90).
Exit status: 0 if every kernel of both revisions is identical, 1 otherwise.
nvcc 13.0 is not deterministic for every kernel: up to four of the twelve
F32 attention kernels (cuda/attention_f32.cu) and the lab's copies of them
come out with other PTX from run to run, also when REV_A and REV_B are the
same (register numbering and the order of moves); compare again, and HEAD
against HEAD, before taking such a change as the change's. An "identical"
verdict always holds.

--match-bodies compares by body instead of by name, for a change that
renames kernels or their template arguments and drops kernels: every kernel
of REV_B must have a kernel of REV_A with the identical normalised body.
It prints the kernel counts of both revisions, each REV_B kernel without
such a twin, and exits 0 if there is none. --file may be given several
times (each file is compared on its own).
"""
import argparse
import difflib
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


def cubin_functions(tree, path, arch):
    """{demangled kernel name: its machine code (the bytes of its .text section)}
    of `path` compiled by ptxas for `arch` under `tree`."""
    import struct
    cubin = os.path.join(tree, "out.cubin")
    subprocess.run([NVCC, "-cubin", "-O3", "-DNDEBUG", "-DHG_WITH_CUDA=1", "-arch=" + arch, "--expt-relaxed-constexpr",
                    "-std=c++17", "-I" + tree, "-o", cubin, os.path.join(tree, path)], check=True)
    elf = open(cubin, "rb").read()
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + k * shentsize) for k in range(shnum)]
    names_at = sections[shstrndx][4]
    functions = {}
    for name_off, _, _, _, offset, size, *_ in sections:
        name = elf[names_at + name_off:elf.index(b"\0", names_at + name_off)].decode()
        if name.startswith(".text."):
            functions[name[len(".text."):]] = elf[offset:offset + size].hex()
    names = list(functions)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    return {d: functions[n] for d, n in zip(demangled, names)}


def strip_anonymous_tags(text):
    """Mangled anonymous-namespace tags (<length>_GLOBAL__N_...) replaced by ANON,
    cut by their length prefix: the tag's tail (it varies with the file's
    contents) would otherwise be left fused to the next name's length digits."""
    out, pos = [], 0
    for m in re.finditer(r"(\d+)_GLOBAL__N_", text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()] + "ANON")
        pos = m.start() + len(m.group(1)) + int(m.group(1))
    return "".join(out) + text[pos:]


def kernels(ptx_path):
    """{demangled kernel name: normalised PTX body}."""
    text = open(ptx_path).read()
    bodies = {}
    for match in re.finditer(r"\.entry (\S+)\(.*?^\}", text, re.S | re.M):
        name, body = match.group(1), match.group(0)
        body = body.replace(name, "KERNEL")
        body = strip_anonymous_tags(body)
        body = re.sub(r"\.loc.*\n", "", body)
        body = re.sub(r"_ZZ\w*E\d+([A-Za-z_]\w*)", r"LOCAL_\1", body)  # function-local statics
        body = re.sub(r"\d*_GLOBAL__N__\w+?_cu_[0-9a-f]+", "ANON", body)  # path-derived namespace tag
        body = re.sub(r"_INTERNAL_[0-9a-f]+_", "_INTERNAL_", body)  # a per-compile tag of internal-linkage globals
        body = re.sub(r"\$L__BB\d+_", "BB_", body)  # labels carry the kernel's index in the file
        bodies[name] = body
    names = list(bodies)
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    return {d: bodies[n] for d, n in zip(demangled, names)}


OP = re.compile(r"^\s*(?:\{\s*)?(?:@!?%p\d+\s+)?([a-z][\w.]*)", re.M)
KEEP = re.compile(r"\.(f16|bf16|f32|f64|bf16x2)\b|^(ld|st|bar|barrier|prefetch|shfl|atom|red|fence|membar|mapa)\.")


def renamed_registers(body):
    """The body with its virtual registers renumbered in order of first use:
    equal for two kernels that differ only in register names."""
    names = {}
    def rename(m):
        return names.setdefault(m.group(0), f"%{m.group(1)}_{len(names)}")
    return re.sub(r"%(rd|rs|r|f|fd|p|h|hh)\d+", rename, re.sub(r"^\s*\.reg .*\n", "", body, flags=re.M))


def float_memory_ops(body):
    """The opcodes of a kernel's floating-point, memory and barrier instructions, in order."""
    return [op for op in OP.findall(body.split("{", 1)[1]) if KEEP.search(op)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev_a")
    parser.add_argument("rev_b")
    parser.add_argument("--file", action="append", help="the .cu file (default cuda/layernorm.cu); repeatable")
    parser.add_argument("--match-bodies", action="store_true",
                        help="match every REV_B kernel to a REV_A kernel of identical body, whatever the names")
    parser.add_argument("--diff", metavar="SUBSTRING", help="print the PTX diff of changed kernels matching this")
    parser.add_argument("--rename-a", nargs=2, metavar=("REGEX", "REPL"), action="append", default=[])
    parser.add_argument("--cubin", action="store_true",
                        help="compare the machine code (each kernel's .text in an sm_90 cubin) instead of the PTX")
    parser.add_argument("--arch", default="sm_90", help="the target (default sm_90; sm_90a for files built for it)")
    args = parser.parse_args()
    rev_a, rev_b = args.rev_a, args.rev_b
    paths = args.file or ["cuda/layernorm.cu"]
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for tag, rev in (("a", rev_a), ("b", rev_b)):
            checkout(rev, os.path.join(tmp, tag))
        for path in paths:
            found = []
            for tag in ("a", "b"):
                tree = os.path.join(tmp, tag)
                if args.cubin:
                    found.append(cubin_functions(tree, path, args.arch))
                    continue
                ptx = os.path.join(tmp, tag + ".ptx")
                subprocess.run([NVCC, "-ptx", "-O3", "-DNDEBUG", "-DHG_WITH_CUDA=1", "-arch=" + args.arch,
                                "--expt-relaxed-constexpr", "-std=c++17", "-I" + tree,
                                "-I" + os.path.join(ROOT, ".deps/include"), "-o", ptx, os.path.join(tree, path)],
                               check=True)
                found.append(kernels(ptx))
            compare = match_bodies if args.match_bodies else compare_names
            status |= compare(args, path, *found)
    sys.exit(status)


def match_bodies(args, path, a, b):
    """Every kernel of b against the bodies of a; 0 if each has a twin."""
    by_body = {}
    for name, body in a.items():
        by_body.setdefault(body, name)
    unmatched = sorted(k for k in b if b[k] not in by_body)
    used = {by_body[b[k]] for k in b if b[k] in by_body}
    for k in unmatched:
        print("no twin in", args.rev_a + ":", k)
    print(f"{path}: {len(a)} kernels in {args.rev_a}, {len(b)} in {args.rev_b}; "
          f"{len(b) - len(unmatched)} of {len(b)} identical to a kernel of {args.rev_a} "
          f"({len(used)} distinct), {len(unmatched)} without a twin; "
          f"{len(a) - len(used)} kernels of {args.rev_a} not compiled in {args.rev_b}")
    return 1 if unmatched else 0


def compare_names(args, path, a, b):
    """Kernels of the same name in a and b; 0 if all are identical."""
    rev_a, rev_b = args.rev_a, args.rev_b
    for regex, repl in args.rename_a:
        a = {re.sub(regex, repl, k): v for k, v in a.items()}
    same = sorted(k for k in a.keys() & b.keys() if a[k] == b[k])
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    for k in changed:
        if args.cubin:
            how = "(machine code differs)"
        elif renamed_registers(a[k]) == renamed_registers(b[k]):
            how = "(identical up to register names)"
        elif float_memory_ops(a[k]) == float_memory_ops(b[k]):
            how = "(same float/memory ops)"
        else:
            how = "(float/memory ops differ)"
        print("changed:    ", k, how)
        if args.diff and args.diff in k:
            sys.stdout.writelines(difflib.unified_diff(a[k].splitlines(True), b[k].splitlines(True), rev_a, rev_b))
    for k in sorted(a.keys() - b.keys()):
        print("only in", rev_a + ":", k)
    for k in sorted(b.keys() - a.keys()):
        print("only in", rev_b + ":", k)
    print(f"{path}: {len(same)} kernels identical, {len(changed)} changed, "
          f"{len(a.keys() - b.keys())} only in {rev_a}, {len(b.keys() - a.keys())} only in {rev_b}")
    return 0 if len(same) == len(a) == len(b) else 1


if __name__ == "__main__":
    main()

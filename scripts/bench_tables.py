#!/usr/bin/env python3
"""Markdown tables from benchmark outputs.

The README's results table (handgrad beside PyTorch, same run):

  scripts/bench_tables.py results docs/data/results.csv               # print it
  scripts/bench_tables.py results docs/data/results.csv --check README.md   # exit 1 if README's copy differs

Rows of docs/data/results.csv from the files the benchmarks and the PyTorch
reference scripts write (scripts/gpu_compare.sh puts them in $OUT); append
the printed rows to the results file:

  scripts/bench_tables.py collect train BENCH_TRAIN.csv TORCH_TRAIN_STEP.json --date D --command C
  scripts/bench_tables.py collect attention BENCH_ATTENTION.csv TORCH_SDPA.json --date D --command C
  scripts/bench_tables.py collect cpu BENCH_TRAIN_CPU.csv TORCH_CPU.json --threads N --hardware H --date D --command C

Kernel tables of one bench_layernorm / bench_softmax CSV:

  scripts/bench_tables.py layernorm out/bench_layernorm.csv
  scripts/bench_tables.py softmax out/bench_softmax.csv
"""
import argparse
import csv
import io
import json
import sys

RESULT_FIELDS = ["hardware", "date", "benchmark", "unit", "handgrad", "handgrad_note",
                 "pytorch_version", "pytorch_variant", "pytorch", "command"]
BEGIN = "<!-- results table: scripts/bench_tables.py results docs/data/results.csv -->"
END = "<!-- end of results table -->"

# torch_train_step.py's variant names, as the table prints them.
TORCH_VARIANTS = {"eager-fp32": "eager", "eager-fp32-sdpa": "eager + SDPA", "eager-bf16-sdpa": "eager + SDPA",
                  "compile-fp32": "torch.compile", "compile-bf16-sdpa": "torch.compile",
                  "compilecg-bf16-sdpa": "torch.compile + CUDA graphs"}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def numbers(cell):
    """'304 / 244' -> [304.0, 244.0]"""
    return [float(v) for v in cell.split("/")]


def speed_ratio(unit, handgrad, pytorch):
    """handgrad's speed over PyTorch's, per component: above 1 means handgrad is faster."""
    mine, theirs = numbers(handgrad), numbers(pytorch)
    if len(mine) != len(theirs):
        sys.exit(f"bench_tables.py: '{handgrad}' and '{pytorch}' have different numbers of figures")
    is_time = unit.split()[0] == "ms"
    return " / ".join(f"{(t / m if is_time else m / t):.2f}x" for m, t in zip(mine, theirs))


def results_table(data):
    """One line per (hardware, date, benchmark); each PyTorch variant of it joined with '; '."""
    out = io.StringIO()
    out.write("| hardware | date | benchmark | handgrad | PyTorch | PyTorch, same run | handgrad speed / PyTorch's "
              "| command |\n")
    out.write("|---|---|---|---|---|---|---|---|\n")
    groups = []
    for r in data:
        key = (r["hardware"], r["date"], r["benchmark"])
        if groups and groups[-1][0] == key:
            groups[-1][1].append(r)
        else:
            groups.append((key, [r]))
    for (hardware, date, benchmark), group in groups:
        first = group[0]
        mine = f"{first['handgrad']} {first['unit']}" + (f" ({first['handgrad_note']})" if first["handgrad_note"] else "")
        theirs = "; ".join(f"{r['pytorch_variant']} {r['pytorch']} {r['unit'].split()[0]}" for r in group)
        ratios = "; ".join(speed_ratio(r["unit"], r["handgrad"], r["pytorch"]) for r in group)
        out.write(f"| {hardware} | {date} | {benchmark} | {mine} | {first['pytorch_version']} | {theirs} "
                  f"| {ratios} | `{first['command']}` |\n")
    return out.getvalue()


def results(args):
    table = results_table(rows(args.path))
    if not args.check:
        sys.stdout.write(table)
        return 0
    with open(args.check) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        print(f"{args.check}: no results table between '{BEGIN}' and '{END}'", file=sys.stderr)
        return 1
    current = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    if current != table:
        print(f"{args.check}: the results table differs from `scripts/bench_tables.py results {args.path}`",
              file=sys.stderr)
        return 1
    return 0


def hardware_of(gpu_name):
    """'NVIDIA H200' -> 'H200', 'NVIDIA H100 80GB HBM3' -> 'H100'"""
    words = gpu_name.replace("NVIDIA", "").split()
    return words[0] if words else gpu_name


def collect_train(args):
    """bench_train's CSV (fused rows) beside torch_train_step.py's --json list of the same config."""
    torch_runs = json.load(open(args.pytorch_output))
    out = []
    for r in rows(args.bench_output):
        if r["mode"] != "fused":
            continue
        shape = f"d{r['d_model']} h{r['heads']} L{r['layers']} T{r['seq']} B{r['batch']} V{r['vocab']}"
        mfu = float(r["mfu"])
        for t in torch_runs:
            if r["precision"] not in t["variant"]:
                continue
            out.append(dict(hardware=args.hardware or hardware_of(r["gpu"]), date=args.date,
                            benchmark=f"training step, {r['precision']}, {shape}", unit="ms",
                            handgrad=f"{float(r['median_ms']):.2f}",
                            handgrad_note=f"MFU {100 * mfu:.1f}%" if mfu > 0 else "",
                            pytorch_version=args.pytorch_version,
                            pytorch_variant=TORCH_VARIANTS.get(t["variant"], t["variant"]),
                            pytorch=f"{t['step_ms']:.2f}", command=args.command))
    return out


def collect_attention(args):
    """bench_attention's --csv (fused rows) beside torch_sdpa.py's --json at the same dtype, dh, T, causal."""
    dtypes = {"bfloat16": "bf16", "float32": "f32"}
    sdpa = {(dtypes[s["dtype"]], str(s["dh"]), str(s["T"]), "1" if s["causal"] else "0"): s
            for s in json.load(open(args.pytorch_output))}
    out = []
    for r in rows(args.bench_output):
        if r["path"] != "fused" or (r["causal"] == "1") != args.causal:
            continue
        s = sdpa.get((r["dtype"], r["dh"], r["T"], r["causal"]))
        if s is None:
            continue
        tokens = int(r["B"]) * int(r["T"])
        out.append(dict(hardware=args.hardware, date=args.date,
                        benchmark=f"attention, {r['dtype']}, dh {r['dh']}, T {r['T']}"
                                  f"{', causal' if args.causal else ''}, {tokens} tokens",
                        unit="TFLOP/s fwd / bwd",
                        handgrad=f"{float(r['fwd_tflops']):.0f} / {float(r['bwd_tflops']):.0f}", handgrad_note="",
                        pytorch_version=args.pytorch_version, pytorch_variant="SDPA",
                        pytorch=f"{s['fwd_TFLOPs']:.0f} / {s['bwd_TFLOPs']:.0f}", command=args.command))
    return out


def collect_cpu(args):
    """bench_train --device cpu --threads N (fused row) beside torch_cpu.py's train step at N threads."""
    torch_step = [t for t in json.load(open(args.pytorch_output))
                  if t["op"] == "train_step_cpu" and t["threads"] == args.threads]
    if not torch_step:
        sys.exit(f"bench_tables.py: {args.pytorch_output} has no train_step_cpu row at {args.threads} thread(s)")
    out = []
    for r in rows(args.bench_output):
        if r["device"] != "cpu" or r["mode"] != "fused":
            continue
        shape = f"d{r['d_model']} h{r['heads']} L{r['layers']} T{r['seq']} B{r['batch']} V{r['vocab']}"
        out.append(dict(hardware=args.hardware, date=args.date,
                        benchmark=f"CPU training step, {r['precision']}, {shape}, {args.threads} thread{'' if args.threads == 1 else 's'}",
                        unit="ms", handgrad=f"{float(r['median_ms']):.2f}", handgrad_note="",
                        pytorch_version=args.pytorch_version, pytorch_variant="eager",
                        pytorch=f"{torch_step[0]['step_ms']:.2f}", command=args.command))
    return out


def collect(args):
    got = {"train": collect_train, "attention": collect_attention, "cpu": collect_cpu}[args.kind](args)
    if not got:
        sys.exit(f"bench_tables.py: no row of {args.bench_output} matched {args.pytorch_output}")
    w = csv.DictWriter(sys.stdout, fieldnames=RESULT_FIELDS, lineterminator="\n")
    if args.header:
        w.writeheader()
    w.writerows(got)
    return 0


def layernorm(args):
    data = rows(args.path)
    print("| dtype | M x N | fwd fused GB/s | fwd unfused GB/s | fwd speedup | bwd fused GB/s | bwd unfused GB/s "
          "| bwd speedup | copy GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = []
    for r in data:
        k = (r["device"], r["dtype"], r["M"], r["N"])
        if k not in keys:
            keys.append(k)
    get = {(r["device"], r["dtype"], r["M"], r["N"], r["pass"], r["impl"]): r for r in data}
    for dev, dt, m, n in keys:
        f = lambda p, i, c="gbps": get.get((dev, dt, m, n, p, i), {}).get(c, "-")
        num = lambda v: f"{float(v):.0f}" if v not in ("-", "") else "-"
        sp = lambda v: f"{float(v):.1f}x" if v not in ("-", "") else "-"
        print(f"| {dev} {dt} | {m} x {n} | {num(f('forward','fused'))} | {num(f('forward','unfused'))} "
              f"| {sp(f('forward','fused','speedup_vs_unfused'))} | {num(f('backward','fused'))} "
              f"| {num(f('backward','unfused'))} | {sp(f('backward','fused','speedup_vs_unfused'))} "
              f"| {num(f('copy','memcpy'))} |")
    return 0


def softmax(args):
    print("| dtype | (B, H, T) | pass | variant | fused GB/s | unfused GB/s | speedup | % of copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows(args.path):
        if r["impl"] != "fused":
            continue
        print(f"| {r['device']} {r['dtype']} | ({r['B']}, {r['H']}, {r['T']}) | {r['pass']} | {r['variant']} "
              f"| {float(r['gbps']):.0f} | {float(r['gbps']) / float(r['speedup_vs_unfused']):.0f} "
              f"| {float(r['speedup_vs_unfused']):.1f}x | {float(r['pct_of_copy']):.0f} |")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("results", help="the README's results table from docs/data/results.csv")
    p.add_argument("path")
    p.add_argument("--check", metavar="README", help="exit 1 unless this file holds exactly that table")
    p.set_defaults(run=results)
    p = sub.add_parser("collect", help="rows for docs/data/results.csv from a benchmark and its PyTorch reference")
    p.add_argument("kind", choices=["train", "attention", "cpu"])
    p.add_argument("bench_output", help="bench_train / bench_attention CSV")
    p.add_argument("pytorch_output", help="torch_train_step.py / torch_sdpa.py / torch_cpu.py JSON")
    p.add_argument("--date", required=True, help="YYYY-MM-DD of the run")
    p.add_argument("--command", required=True, help="what ran, as the table should name it")
    p.add_argument("--hardware", default="", help="default: the GPU named in the bench CSV (train)")
    p.add_argument("--pytorch-version", default="2.11")
    p.add_argument("--threads", type=int, default=1, help="cpu: the thread count of both runs")
    p.add_argument("--causal", action="store_true", help="attention: the causal rows instead")
    p.add_argument("--header", action="store_true", help="print the CSV header first")
    p.set_defaults(run=collect)
    for name, fn in (("layernorm", layernorm), ("softmax", softmax)):
        p = sub.add_parser(name, help=f"the kernel table of a bench_{name} CSV")
        p.add_argument("path")
        p.set_defaults(run=fn)
    args = ap.parse_args()
    if args.mode == "collect" and args.kind in ("attention", "cpu") and not args.hardware:
        ap.error(f"collect {args.kind} needs --hardware (its CSV does not name the machine)")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turn bench_layernorm / bench_softmax CSVs into the Markdown tables of docs/benchmarks.md.

  scripts/bench_tables.py layernorm out/bench_layernorm.csv
  scripts/bench_tables.py softmax out/bench_softmax.csv
"""
import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def layernorm(data):
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


def softmax(data):
    print("| dtype | (B, H, T) | pass | variant | fused GB/s | unfused GB/s | speedup | % of copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in data:
        if r["impl"] != "fused":
            continue
        print(f"| {r['device']} {r['dtype']} | ({r['B']}, {r['H']}, {r['T']}) | {r['pass']} | {r['variant']} "
              f"| {float(r['gbps']):.0f} | {float(r['gbps']) / float(r['speedup_vs_unfused']):.0f} "
              f"| {float(r['speedup_vs_unfused']):.1f}x | {float(r['pct_of_copy']):.0f} |")


if __name__ == "__main__":
    kind, path = sys.argv[1], sys.argv[2]
    {"layernorm": layernorm, "softmax": softmax}[kind](rows(path))

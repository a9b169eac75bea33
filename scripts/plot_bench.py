#!/usr/bin/env python3
"""Plot a benchmark CSV: one line per series, y against x.

Generic over the bench programs' CSVs (bench_layernorm, bench_softmax, ...):
the x column, the y column and the columns that name a series are flags.

  scripts/plot_bench.py ln.csv -o ln.png                       # GB/s vs N per (pass, dtype, impl)
  scripts/plot_bench.py ln.csv -o ln_cuda.png --where device=cuda --where M=4096 \
      --series pass,dtype,impl --title "LayerNorm on H100"
  scripts/plot_bench.py sm.csv -o sm.png --x Tk --y gbps --series dtype,impl

Rows with the same series key and x (e.g. several M for one N) are averaged
unless --where picks one. Writes a PNG with matplotlib's Agg backend (no display).
"""
import argparse
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="benchmark CSV with a header row")
    p.add_argument("-o", "--out", required=True, help="output PNG path")
    p.add_argument("--x", default="N", help="x-axis column (numeric), default N")
    p.add_argument("--y", default="gbps", help="y-axis column (numeric), default gbps")
    p.add_argument("--series", default="pass,dtype,impl",
                   help="comma-separated columns whose values name one line (default pass,dtype,impl)")
    p.add_argument("--where", action="append", default=[], metavar="COL=VALUE",
                   help="keep only rows where COL equals VALUE (repeatable; VALUE may be a|b|c)")
    p.add_argument("--title", default="", help="plot title")
    p.add_argument("--ylabel", default=None, help="y-axis label (default: the y column)")
    p.add_argument("--linear-x", action="store_true", help="linear x axis (default log2)")
    p.add_argument("--log-y", action="store_true", help="logarithmic y axis (loss curves)")
    p.add_argument("--lines", action="store_true", help="lines without point markers (long curves)")
    p.add_argument("--hline", action="append", default=[], metavar="VALUE[:LABEL]",
                   help="horizontal reference line, e.g. 2950:copy rate (repeatable)")
    return p.parse_args(argv)


def load_rows(path, where):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no data rows")
    filters = []
    for w in where:
        col, sep, value = w.partition("=")
        if not sep:
            sys.exit(f"--where {w!r}: expected COL=VALUE")
        if col not in rows[0]:
            sys.exit(f"--where {w!r}: no column {col!r} in {path} (columns: {', '.join(rows[0])})")
        filters.append((col, set(value.split("|"))))
    return [r for r in rows if all(r[c] in allowed for c, allowed in filters)]


def main(argv):
    args = parse_args(argv)
    rows = load_rows(args.csv, args.where)
    if not rows:
        sys.exit("no rows left after --where filters")
    series_cols = [c for c in args.series.split(",") if c]
    for col in [args.x, args.y] + series_cols:
        if col not in rows[0]:
            sys.exit(f"no column {col!r} in {args.csv} (columns: {', '.join(rows[0])})")

    # series key -> x -> list of y (averaged if several rows share an x)
    lines = defaultdict(lambda: defaultdict(list))
    for r in rows:
        try:
            x, y = float(r[args.x]), float(r[args.y])
        except ValueError:
            continue  # a non-numeric cell (e.g. an empty speedup) is not plotted
        key = " ".join(r[c] for c in series_cols)
        lines[key][x].append(y)

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key in sorted(lines):
        xs = sorted(lines[key])
        ys = [sum(lines[key][x]) / len(lines[key][x]) for x in xs]
        ax.plot(xs, ys, marker=None if args.lines else "o", linewidth=1 if args.lines else 1.5,
                label=key or args.y)
    for h in args.hline:
        value, _, label = h.partition(":")
        ax.axhline(float(value), linestyle="--", color="gray", linewidth=1)
        if label:
            ax.annotate(label, xy=(0.01, float(value)), xycoords=("axes fraction", "data"),
                        va="bottom", fontsize=8, color="gray")
    if not args.linear_x:
        ax.set_xscale("log", base=2)
    if args.log_y:
        ax.set_yscale("log")
    ax.set_xlabel(args.x)
    ax.set_ylabel(args.ylabel or args.y)
    ax.set_title(args.title or f"{args.y} vs {args.x} ({args.csv})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out} ({len(lines)} series, {len(rows)} rows)")


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""One table of every bench_ddp CSV of a scripts/gpu_ddp_check.sh run, the
targets, and the values the sweep recommends for the knobs whose best value
only a multi-GPU run shows (bucket size, reduction dtype, ZeRO-1's gather
waits, NCCL_MAX_NCHANNELS).

    ddp_summary.py OUT_DIR [--ranks N]

Reads OUT_DIR/ddp_<stage>_ch<channels>.csv (bench_ddp --csv; <channels> is
NCCL_MAX_NCHANNELS or "default"), writes OUT_DIR/ddp_summary.csv and prints.
"""
import argparse
import csv
import glob
import os
import re
import statistics
import sys

# Today's defaults (examples/common/data_parallel.hpp, dist/grad_reducer.hpp).
DEFAULTS = {"bucket_mb": "50", "grad_dtype": "fp32", "zero_gather": "step", "channels": "default"}
NOISE = 0.005  # relative scaling difference below which a default stays
TARGETS = [("bench", "0", 1.95), ("gpt2s", "0", 1.95), ("bench", "1", 1.90)]  # config, zero, scaling


def read_rows(out):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "ddp_*_ch*.csv"))):
        m = re.match(r"ddp_(.+)_ch([0-9a-z]+)\.csv$", os.path.basename(path))
        if not m:
            continue
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                r["stage"], r["channels"] = m.group(1), m.group(2)
                r["bucket_mb"] = f"{float(r['bucket_mb']):g}"
                rows.append(r)
    return rows


def key(r, *fields):
    return tuple(r[f] for f in fields)


def mean_scaling(rows, knob, fixed):
    """Mean scaling per value of `knob` over the settings of the other
    fields that every value was measured at (a fair comparison)."""
    by_setting = {}
    for r in rows:
        by_setting.setdefault(key(r, *fixed), {})[r[knob]] = float(r["scaling"])
    values = sorted({r[knob] for r in rows})
    common = [s for s in by_setting.values() if all(v in s for v in values)]
    if len(values) < 2 or not common:
        return None
    return {v: statistics.mean(s[v] for s in common) for v in values}, len(common)


def recommend(rows, knob, fixed, flag, where):
    result = mean_scaling(rows, knob, fixed)
    if result is None:
        print(f"  {flag}: not enough runs to compare")
        return
    means, n = result
    best = max(means, key=means.get)
    listed = ", ".join(f"{v} {means[v]:.3f}x" for v in sorted(means, key=means.get, reverse=True))
    today = DEFAULTS[knob]
    gain = means[best] / means[today] - 1 if today in means else float("inf")
    # Below NOISE the medians of 20-40 steps do not separate two settings.
    if best == today:
        verdict = "keep"
    elif gain < NOISE:
        verdict = f"keep ({best} only {100 * gain:+.1f}%, within the noise of {100 * NOISE:.1f}%)"
    else:
        verdict = f"change to {best} ({100 * gain:+.1f}%)"
    print(f"  {flag}: {listed} (mean over {n} setting(s)); today {today}: {verdict} ({where})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    args = ap.parse_args()
    rows = read_rows(args.out)
    if not rows:
        print(f"no bench_ddp CSVs (ddp_*_ch*.csv) in {args.out}")
        return 1
    cols = ["config", "zero", "zero_gather", "channels", "bucket_mb", "grad_dtype", "alone_ms", "slowest_ms",
            "scaling", "comm_ms", "exposed_ms", "hidden_pct", "compute_pct"]
    with open(os.path.join(args.out, "ddp_summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            r["hidden_pct"] = f"{100 * float(r['hidden_share']):.1f}"
            r["compute_pct"] = f"{100 * float(r['compute_slowdown']):+.1f}"
            w.writerow([r[c] for c in cols])
    fmt = "{:<6} {:>4} {:<7} {:>8} {:>6} {:<5} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>8}"
    print(fmt.format("config", "zero", "gather", "channels", "bucket", "dtype", "alone", "slowest", "scaling", "comm",
                     "exposed", "hidden", "compute"))
    for r in sorted(rows, key=lambda r: (r["config"], r["zero"], r["zero_gather"], r["channels"], r["grad_dtype"],
                                         float(r["bucket_mb"]))):
        print(fmt.format(r["config"], r["zero"], r["zero_gather"], r["channels"], r["bucket_mb"], r["grad_dtype"],
                         f"{float(r['alone_ms']):.2f}", f"{float(r['slowest_ms']):.2f}", f"{float(r['scaling']):.3f}x",
                         f"{float(r['comm_ms']):.3f}", f"{float(r['exposed_ms']):.3f}", r["hidden_pct"] + "%",
                         r["compute_pct"] + "%"))
    print("(ms per step; scaling = ranks x one GPU alone / slowest rank; hidden = share of the collectives' time the "
          "compute stream did not wait for; compute = step time the exposed communication does not explain, over the "
          "step alone)")

    print("targets (best row of each):")
    for config, zero, target in TARGETS:
        cand = [r for r in rows if r["config"] == config and r["zero"] == zero]
        label = config + (" ZeRO-1" if zero == "1" else "")
        if not cand:
            print(f"  {label}: not measured")
            continue
        b = max(cand, key=lambda r: float(r["scaling"]))
        s = float(b["scaling"])
        print(f"  {label}: {s:.3f}x >= {target}x: {'met' if s >= target else 'NOT met'}"
              f" (bucket {b['bucket_mb']} MiB, {b['grad_dtype']}, channels {b['channels']}"
              f"{', gather ' + b['zero_gather'] if zero == '1' else ''})")

    print("recommended defaults (mean scaling of each value where all were measured):")
    default_ch = [r for r in rows if r["channels"] == "default"]
    ddp = [r for r in default_ch if r["zero"] == "0"]
    recommend(ddp, "bucket_mb", ("config", "grad_dtype"), "--bucket-mb",
              "DataParallelFlags::bucket_mb, examples/common/data_parallel.hpp")
    recommend(ddp, "grad_dtype", ("config", "bucket_mb"), "--grad-dtype",
              "dist::kDefaultGradDType, dist/grad_reducer.hpp")
    recommend([r for r in default_ch if r["zero"] == "1"], "zero_gather", ("config", "bucket_mb", "grad_dtype"),
              "--zero-gather", "dist::kDefaultForwardWaits, dist/grad_reducer.hpp")
    recommend(rows, "channels", ("config", "zero", "zero_gather", "bucket_mb", "grad_dtype"), "NCCL_MAX_NCHANNELS",
              "an environment variable of the launch: mpirun -x NCCL_MAX_NCHANNELS=N; docs/distributed.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

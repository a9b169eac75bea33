#!/usr/bin/env python3
"""PyTorch CPU reference for `bench_train --device cpu --cpu-model NAME`: one
training step (forward, cross-entropy, backward, clip_grad_norm_ 1.0, AdamW)
of the pre-LN decoder LM of shared/anchors/torch_cpu.py (same Block and LM),
in float32 on the CPU, at each thread count asked for.

  python3 bench/torch_cpu_step.py [--config small,medium] [--threads 1,all]
      [--warmup 3] [--reps 20] [--json PATH] [--profile N]
  python3 bench/torch_cpu_step.py --summary OUT_FOLDER OTHER_LEVEL   (scripts/gpu_compare.sh cpu-step's table)

configs (the same as bench_train's --cpu-model presets; vocabulary 256):
  small  = d_model 128, 4 heads, 2 layers, seq 64, batch 8
  medium = d_model 256, 4 heads, 4 layers, seq 128, batch 16
--threads: comma list of counts, "all" = os.cpu_count(). Each (config,
threads) point runs `warmup` untimed steps, then `reps` timed steps; the
median and the minimum (wall ms) are printed and written as JSON to --json,
default $OUT/torch_cpu_step.json (or ./torch_cpu_step.json without $OUT).
Two batches rotate, drawn before timing, as bench_train does. --profile N:
after timing, N more steps under torch.profiler, and its table of operators
by self CPU time (per step), to set beside bench_train's per-op-kind breakdown."""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {"small": dict(d=128, h=4, L=2, T=64, B=8, V=256),
           "medium": dict(d=256, h=4, L=4, T=128, B=16, V=256)}


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc1 = nn.Linear(d, 4 * d); s.fc2 = nn.Linear(4 * d, d)

    def forward(s, x, mask):
        B, T, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, -1)
        q, k, v = [t.view(B, T, s.h, D // s.h).transpose(1, 2) for t in (q, k, v)]
        a = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(D // s.h) + mask, -1) @ v
        x = x + s.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class LM(nn.Module):
    def __init__(s, V, d, h, L, T):
        super().__init__()
        s.tok = nn.Embedding(V, d); s.pos = nn.Embedding(T, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(L)]); s.lnf = nn.LayerNorm(d); s.head = nn.Linear(d, V)

    def forward(s, idx, mask):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1]))
        for b in s.blocks: x = b(x, mask)
        return s.head(s.lnf(x))


def measure(name, threads, warmup, reps, profile_steps):
    c = CONFIGS[name]
    V, d, h, L, T, B = c["V"], c["d"], c["h"], c["L"], c["T"], c["B"]
    torch.set_num_threads(threads); torch.manual_seed(0)
    m = LM(V, d, h, L, T); opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    mask = torch.full((T, T), float("-inf")).triu(1)
    batches = [(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))) for _ in range(2)]

    def step(i):
        idx, tgt = batches[i % 2]
        loss = F.cross_entropy(m(idx, mask).view(-1, V), tgt.view(-1))
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()

    for i in range(warmup): step(i)
    ms = []
    for i in range(reps):
        t0 = time.perf_counter(); step(i); ms.append((time.perf_counter() - t0) * 1e3)
    if profile_steps > 0:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for i in range(profile_steps): step(i)
        print(f"torch.profiler, {name}, {threads} thread(s), {profile_steps} steps (times are totals):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return dict(op="train_step_cpu", config=name, model=f"d{d} h{h} L{L} T{T} B{B} V{V}", threads=threads,
                median_ms=statistics.median(ms), min_ms=min(ms), tok_s=B * T / statistics.median(ms) * 1e3,
                reps=reps, torch=torch.__version__)


def summary(folder, other):
    """The table of scripts/gpu_compare.sh cpu-step: per model and thread count,
    the median over rounds of each side's median step, and handgrad / PyTorch."""
    import csv, glob
    def med(xs): return statistics.median(xs) if xs else float("nan")
    print(f"{'model':7s} {'threads':>7s} {'handgrad ms':>12s} {other + ' ms':>22s} {'PyTorch ms':>11s} {'ratio':>6s}")
    for m in CONFIGS:
        for path in sorted(glob.glob(os.path.join(folder, f"torch_cpu_step_{m}_t*_r1.json")),
                           key=lambda q: int(q.split("_t")[-1].split("_")[0])):
            t = path.split("_t")[-1].split("_")[0]
            def hg(level):
                return med([float(row["median_ms"]) for f in glob.glob(os.path.join(folder, f"bt_{m}_t{t}_{level}_r*.csv"))
                            for row in csv.DictReader(open(f))])
            pt = med([json.load(open(f))[0]["median_ms"]
                      for f in glob.glob(os.path.join(folder, f"torch_cpu_step_{m}_t{t}_r*.json"))])
            h = hg("default")
            print(f"{m:7s} {t:>7s} {h:12.2f} {hg(other):22.2f} {pt:11.2f} {h / pt:6.2f}")
    print("ratio = handgrad (default kernel) / PyTorch: below 1, handgrad is faster")


def main():
    import sys
    if len(sys.argv) == 4 and sys.argv[1] == "--summary":
        return summary(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="small,medium", help="comma list of: " + ", ".join(CONFIGS))
    ap.add_argument("--threads", default="1,all", help='comma list of thread counts; "all" = every core')
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, help="steps under torch.profiler (0: none)")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "torch_cpu_step.json"))
    a = ap.parse_args()
    configs = a.config.split(",")
    for name in configs:
        if name not in CONFIGS: ap.error(f"--config {name}: allowed {', '.join(CONFIGS)}")
    threads = []
    for t in a.threads.split(","):
        if t == "all": threads.append(os.cpu_count())
        elif t.isdigit() and int(t) >= 1: threads.append(int(t))
        else: ap.error(f"--threads {t}: a count >= 1 or all")
    if a.warmup < 0 or a.reps < 1 or a.profile < 0: ap.error("--warmup and --profile must be >= 0, --reps >= 1")
    res = []
    for name in configs:
        for t in threads:
            r = measure(name, t, a.warmup, a.reps, a.profile)
            res.append(r)
            print(f"torch {r['torch']} cpu step {name:6s} ({r['model']}) threads {t:3d}: "
                  f"median {r['median_ms']:8.2f} ms (min {r['min_ms']:8.2f})  {r['tok_s']:9.0f} tokens/s", flush=True)
    with open(a.json, "w") as fh: json.dump(res, fh, indent=1)
    print("wrote", a.json)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch reference for `bench_cpu_gemm`: the same Linear GEMMs of one
bench_train --cpu-model step (qkv, proj, fc1, fc2; forward y = x W^T, input
gradient dx = dy W, weight gradient dW = dy^T x), in float32 through
torch.mm (MKL / oneDNN in PyTorch's x86 wheels), at each thread count asked
for: GFLOP/s of each product and of all of them together, by wall time,
the median of --iters calls after one warm-up call.

  python3 bench/torch_cpu_gemm.py [--cpu-model small|medium] [--threads 1,16] [--iters 15]
"""
import argparse
import statistics
import time

import torch


def products(model):
    d, tokens = (128, 512) if model == "small" else (256, 2048)
    out = []
    for layer, fin, fout in (("qkv", d, 3 * d), ("proj", d, d), ("fc1", d, 4 * d), ("fc2", 4 * d, d)):
        # (name, m, n, k, a transposed, b transposed), as bench_cpu_gemm lists them.
        out += [(layer + " fwd", tokens, fout, fin, False, True), (layer + " dx", tokens, fin, fout, False, False),
                (layer + " dW", fout, fin, tokens, True, False)]
    return out


def operand(rows, cols, transposed):
    # op(X) is rows x cols; a transposed operand is stored cols x rows, as the C++ program stores it.
    return torch.randn(cols, rows).t() if transposed else torch.randn(rows, cols)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-model", choices=["small", "medium"], default="small")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(1)
    print(f"model {args.cpu_model}; torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}; GFLOP/s by wall")
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        print(f"\n== {n} thread(s)")
        flops = seconds = 0.0
        for name, m, nn, k, ta, tb in products(args.cpu_model):
            a, b = operand(m, k, ta), operand(k, nn, tb)
            torch.mm(a, b)
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                torch.mm(a, b)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            f = 2.0 * m * nn * k
            flops, seconds = flops + f, seconds + t
            print(f"{name:10s} {m:5d}x{nn:5d}x{k:5d} {f / t / 1e9:10.1f}")
        print(f"{'all':28s} {flops / seconds / 1e9:10.1f}")


if __name__ == "__main__":
    main()

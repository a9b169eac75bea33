#!/usr/bin/env python3
"""Per-call cost of calling a handgrad op from Python, over the same call made
from C++ (target: < 10 us). Tiny CPU tensors, so the op itself costs little and
the difference is the binding: argument conversion, the result tuple, the
Saved object. Medians over repeats after a warm-up. With PyTorch present it
also times handgrad.torch.layer_norm (DLPack both ways + autograd.Function)
against torch.nn.functional.layer_norm on the same tiny tensor.

  PYTHONPATH=build/python python3 bench/python_overhead.py [--calls 20000] [--repeats 7]
"""
import argparse
import statistics
import time

import handgrad as hg


def per_call(fn, calls, repeats):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    x, g, b = hg.ones((1, 8)), hg.ones(8), hg.zeros(8)
    us = 1e6
    print(f"tiny tensors (1, 8) float32 on the CPU, {a.calls} calls x {a.repeats} repeats, medians")
    for op, call in [("layernorm_forward", lambda: hg.layernorm_forward(x, g, b, 1e-5)),
                     ("softmax_forward", lambda: hg.softmax_forward(x))]:
        cpp = statistics.median(hg._C._seconds_per_call_cpp(op, x, g, b, a.calls) for _ in range(a.repeats))
        py = per_call(call, a.calls, a.repeats)
        print(f"{op:18s} C++ {cpp * us:7.2f} us   Python {py * us:7.2f} us   overhead {(py - cpp) * us:6.2f} us")
    try:
        import torch
        import torch.nn.functional as F
        import handgrad.torch as hgt
    except ImportError:
        print("torch not installed: handgrad.torch overhead not measured")
        return
    t, w, bias = torch.ones(1, 8), torch.ones(8), torch.zeros(8)
    with torch.no_grad():
        ours = per_call(lambda: hgt.layer_norm(t, w, bias), a.calls // 4, a.repeats)
        theirs = per_call(lambda: F.layer_norm(t, (8,), w, bias), a.calls // 4, a.repeats)
    print(f"torch {torch.__version__}, no_grad: handgrad.torch.layer_norm {ours * us:6.2f} us   "
          f"F.layer_norm {theirs * us:6.2f} us")
    t.requires_grad_()  # forward + backward through autograd (the backward's Python call included)
    ours = per_call(lambda: hgt.layer_norm(t, w, bias).sum().backward(), a.calls // 4, a.repeats)
    theirs = per_call(lambda: F.layer_norm(t, (8,), w, bias).sum().backward(), a.calls // 4, a.repeats)
    print(f"torch {torch.__version__}, forward + backward (+ sum): handgrad.torch.layer_norm {ours * us:6.2f} us   "
          f"F.layer_norm {theirs * us:6.2f} us")


if __name__ == "__main__":
    main()

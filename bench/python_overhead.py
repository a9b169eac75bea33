#!/usr/bin/env python3
"""Per-call cost of calling a handgrad op from Python, over the same call made
from C++ (target: < 10 us). Tiny CPU tensors, so the op itself costs little and
the difference is the binding: argument conversion, the result tuple, the
Saved object. Medians over repeats after a warm-up. With PyTorch present it
also times each handgrad.torch drop-in (layer_norm, causal attention_softmax,
softmax, cross_entropy) against the PyTorch op it replaces on tiny tensors:
forward, forward recording the graph, forward + backward; with handgrad._torch_ext
in use, both its C++ autograd Functions and the Python ones.

  PYTHONPATH=build/python python3 bench/python_overhead.py [--calls 20000] [--repeats 7] [--device cuda]
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
    ap.add_argument("--device", default="cpu", help="cuda: the drop-ins on CUDA tensors (host time to queue)")
    ap.add_argument("--module", default="handgrad.torch", help="the drop-in module to time (e.g. an older copy)")
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
    except ImportError:
        print("torch not installed: handgrad.torch overhead not measured")
        return
    torch_dropins(a)


def torch_dropins(a):
    """Each handgrad.torch drop-in against the PyTorch op it replaces, on tensors so small that
    the host's work is all there is: forward under no_grad, forward recording the graph, and
    forward + backward (torch.autograd.backward with a ready gradient, so no .sum()). Where
    handgrad._torch_ext is in use, its C++ autograd Functions and the Python ones are both timed."""
    import torch
    import torch.nn.functional as F
    import importlib
    hgt = importlib.import_module(a.module)
    dev = a.device
    torch.set_num_threads(1)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    x = torch.randn(2, 8, device=dev)
    w, b = torch.ones(8, device=dev), torch.zeros(8, device=dev)
    s = torch.randn(1, 2, 4, 4, device=dev)
    causal = torch.full((4, 4), float("-inf"), device=dev).triu(1)
    z, t = torch.randn(4, 8, device=dev), torch.tensor([1, 2, 3, 0], device=dev)
    # The drop-in implementations timed: the module's own (an older copy has no BACKEND), and the
    # Python Functions next to the C++ ones when handgrad.torch runs on the extension.
    impls = [(getattr(hgt, "BACKEND", a.module), hgt)]
    if getattr(hgt, "BACKEND", None) == "c++":
        impls.append(("python", hgt.python_functions))
    ops = [  # name, handgrad.torch call, PyTorch call (same math), input that gets a gradient
        ("layer_norm", lambda m: m.layer_norm(x, w, b), lambda: F.layer_norm(x, (8,), w, b), x),
        ("attention_softmax causal", lambda m: m.attention_softmax(s, causal=True, scale=0.5),
         lambda: torch.softmax(s * 0.5 + causal, -1), s),
        ("softmax", lambda m: m.softmax(x), lambda: torch.softmax(x, -1), x),
        ("cross_entropy", lambda m: m.cross_entropy(z, t), lambda: F.cross_entropy(z, t), z),
    ]
    us, calls, repeats = 1e6, max(a.calls // 40, 10), 3 * a.repeats

    def interleaved(fns):
        """Median seconds per call of each fn, timed in turns (ours, theirs, ours, ...) so that
        load from other processes falls on all alike."""
        samples = [[] for _ in fns]
        for fn in fns:
            fn()
        for _ in range(repeats):
            for fn, out in zip(fns, samples):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                out.append((time.perf_counter() - t0) / calls * us)
        return [statistics.median(x) for x in samples]

    if hasattr(hg._C, "_seconds_per_torch_view") and a.module == "handgrad.torch":
        view = statistics.median(hg._C._seconds_per_torch_view(x, 20000) for _ in range(a.repeats))
        print(f"reading one torch.Tensor in C++ (handgrad.torch's Python crossing): {view * us:.3f} us")
    names = " / ".join([n for n, _ in impls] + ["PyTorch"])
    print(f"torch {torch.__version__} on {dev}, {a.module}, {repeats} x {calls} calls in turns, medians "
          f"(us per call: {names}; then each handgrad drop-in / PyTorch)")
    width = 9 * (len(impls) + 1)
    print(f"{'op':26s} {'fwd no_grad':>{width}s} {'fwd (graph)':>{width}s} {'fwd + bwd':>{width}s}")
    for name, ours, theirs, leaf in ops:
        fns = [(lambda m=m: ours(m)) for _, m in impls] + [theirs]
        leaf.requires_grad_(False)
        with torch.no_grad():
            nog = interleaved(fns)
        leaf.requires_grad_(True)
        fwd = interleaved(fns)
        grads = [torch.ones_like(fn()) for fn in fns]
        both = interleaved([(lambda fn=fn, g=g: torch.autograd.backward(fn(), g)) for fn, g in zip(fns, grads)])
        leaf.requires_grad_(False)
        leaf.grad = None
        cols = ["/".join(f"{v:.2f}" for v in m) for m in (nog, fwd, both)]
        ratios = "  ".join(",".join(f"{v / m[-1]:.2f}x" for v in m[:-1]) for m in (nog, fwd, both))
        print(f"{name:26s} " + " ".join(f"{c:>{width}s}" for c in cols) + "   " + ratios)


if __name__ == "__main__":
    main()

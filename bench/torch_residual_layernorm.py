"""PyTorch's residual add + LayerNorm on the GPU, for bench_layernorm --residual.

h = x + r, y = layer_norm(h); backward: dx = dr = dh_in + d layer_norm / dh (dy),
plus dgamma, dbeta. Bytes as bench_layernorm counts them for res_forward and
res_backward: 4 * M * N * element size (x, r read, h, y written; dy, h, dh_in
read, dh written). CUDA events, warm-up, median, inputs rotated over 4 sets.

  python3 bench/torch_residual_layernorm.py [--providers eager,compile] [--json out.json]
"""
import argparse
import json

try:
    import torch
    import torch._functorch.config as functorch_config
    import torch.nn.functional as F
except ImportError as e:
    raise SystemExit(f"torch_residual_layernorm.py needs PyTorch ({e}); run it where PyTorch with CUDA is installed")

functorch_config.donated_buffer = False  # the compiled backward runs again on the same graph (retain_graph)

SIZES = ((16384, 768), (4096, 1024), (4096, 4096), (4096, 8192), (4096, 16384))
SETS = 4


def median_ms(fn, warm=5, rep=30):
    for i in range(warm):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def residual_layernorm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, 1e-5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--providers", default="eager", help="comma-separated: eager, compile")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    providers = args.providers.split(",")
    for p in providers:
        if p not in ("eager", "compile"):
            raise SystemExit(f"--providers: unknown '{p}' (allowed: eager, compile)")
    if not torch.cuda.is_available():
        raise SystemExit("torch_residual_layernorm.py needs a CUDA GPU; torch.cuda.is_available() is False")
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for M, N in SIZES:
            gen = lambda: torch.randn(M, N, device="cuda", dtype=dtype)  # noqa: E731
            xs = [gen().requires_grad_(True) for _ in range(SETS)]
            rs = [gen().requires_grad_(True) for _ in range(SETS)]
            dys, dhs = [gen() for _ in range(SETS)], [gen() for _ in range(SETS)]
            w = torch.rand(N, device="cuda", dtype=dtype, requires_grad=True)
            b = torch.rand(N, device="cuda", dtype=dtype, requires_grad=True)
            nbytes = 4 * M * N * xs[0].element_size()
            for p in providers:
                fn = residual_layernorm
                if p == "compile":
                    # A fresh compile per case: one function over 10 shapes and dtypes, with and
                    # without grad, passes dynamo's recompile limit (8) and would run eager after it.
                    torch._dynamo.reset()
                    fn = torch.compile(residual_layernorm)
                with torch.no_grad():
                    fwd = median_ms(lambda i: fn(xs[i % SETS], rs[i % SETS], w, b))
                outs = [fn(xs[i], rs[i], w, b) for i in range(SETS)]
                bwd = median_ms(lambda i: torch.autograd.grad(
                    outs[i % SETS], (xs[i % SETS], rs[i % SETS], w, b), (dhs[i % SETS], dys[i % SETS]),
                    retain_graph=True))
                row = dict(dtype=str(dtype).replace("torch.", ""), M=M, N=N, prov=p, fwd_ms=fwd, bwd_ms=bwd,
                           fwd_GBps=nbytes / fwd * 1e-6, bwd_GBps=nbytes / bwd * 1e-6)
                rows.append(row)
                print(f"{row['dtype']:9s} {M:6d}x{N:<6d} {p:8s} fwd {fwd:.4f} ms {row['fwd_GBps']:7.1f} GB/s"
                      f"   bwd {bwd:.4f} ms {row['bwd_GBps']:7.1f} GB/s", flush=True)
                del outs
            del xs, rs, dys, dhs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

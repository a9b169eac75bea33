"""PyTorch's softmax over whole rows on the GPU, for bench_softmax's "plain" forward.

y = softmax(scale * x, dim=-1) on scores (B, H, T, T), no mask, not causal.
Bytes as bench_softmax counts them: 2 * numel * element size (x read, y
written). CUDA events, warm-up, median; inputs rotated over sets whose sum
passes the L2 several times, each timed sample ~1 ms of calls.

  python3 bench/torch_softmax_plain.py [--sizes 8x12x512,4x16x1024] [--providers eager,compile]
"""
import argparse

try:
    import torch
except ImportError as e:
    raise SystemExit(f"torch_softmax_plain.py needs PyTorch ({e}); run it where PyTorch with CUDA is installed")

SCALE = 0.125


def median_ms_per_call(fn, sets, calls, warm=5, rep=30):
    for i in range(warm * calls):
        fn(i % sets)
    torch.cuda.synchronize()
    times = []
    for r in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for c in range(calls):
            fn((r * calls + c) % sets)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]


def softmax_rows(x):
    return torch.softmax(x * SCALE, dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8x12x512,4x16x1024,2x16x2048,1x16x4096", help="comma-separated BxHxT")
    ap.add_argument("--providers", default="eager", help="comma-separated: eager, compile")
    args = ap.parse_args()
    sizes = []
    for s in args.sizes.split(","):
        parts = s.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--sizes: '{s}' is not BxHxT with positive integers")
        sizes.append(tuple(int(p) for p in parts))
    providers = args.providers.split(",")
    for p in providers:
        if p not in ("eager", "compile"):
            raise SystemExit(f"--providers: unknown '{p}' (allowed: eager, compile)")
    if not torch.cuda.is_available():
        raise SystemExit("torch_softmax_plain.py needs a CUDA GPU; torch.cuda.is_available() is False")
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    for dtype in (torch.float32, torch.bfloat16):
        for B, H, T in sizes:
            numel = B * H * T * T
            nbytes = 2 * numel * torch.tensor([], dtype=dtype).element_size()
            sets = max(2, min(16, -(-4 * l2 // nbytes)))
            xs = [torch.randn(B, H, T, T, device="cuda", dtype=dtype) for _ in range(sets)]
            calls = max(1, min(64, int(1e-3 / (nbytes / 3e12))))
            for p in providers:
                fn = softmax_rows
                if p == "compile":
                    torch._dynamo.reset()
                    fn = torch.compile(softmax_rows)
                with torch.no_grad():
                    ms = median_ms_per_call(lambda i: fn(xs[i]), sets, calls)
                print(f"softmax plain {str(dtype)[6:]:8s} ({B}, {H}, {T}) {p:7s} {ms * 1e3:9.1f} us "
                      f"{nbytes / ms * 1e-6:7.0f} GB/s", flush=True)
            del xs


if __name__ == "__main__":
    main()

"""PyTorch's scaled_dot_product_attention with a padding mask, for
bench_attention --key-mask: the same sizes (B * T = tokens, H * dh = width),
bf16, and the same additive mask (B, 1, 1, T): batch b removes its last
(b % 4) * T / 8 keys (-inf), the rest 0. Not causal: SDPA takes attn_mask or
is_causal, not both. FLOPs count every key, as bench_attention does: forward
4 * B * H * T^2 * dh, backward 2.5x. CUDA events, warm-up, median of 30.

  python3 bench/torch_sdpa_mask.py [--tokens 16384] [--width 2048] [--seq 1024,4096] [--json out.json]
"""
import argparse
import json

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    raise SystemExit(f"torch_sdpa_mask.py needs PyTorch ({e}); run it where PyTorch with CUDA is installed")


def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def padding_mask(batch, t):
    m = torch.zeros(batch, 1, 1, t, device="cuda", dtype=torch.bfloat16)
    for b in range(batch):
        pad = (b % 4) * t // 8
        if pad:
            m[b, :, :, t - pad:] = float("-inf")
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--seq", default="1024,4096")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    for dh in (64, 128):
        for t in (int(s) for s in a.seq.split(",")):
            batch, heads = a.tokens // t, a.width // dh
            q, k, v = (torch.randn(batch, heads, t, dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            mask = padding_mask(batch, t)
            flops = 4 * batch * heads * t * t * dh
            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
            row = dict(T=t, dh=dh, fwd_ms=round(fwd, 4), bwd_ms=round(bwd, 4),
                       fwd_TFLOPs=round(flops / fwd * 1e-9, 1), bwd_TFLOPs=round(2.5 * flops / bwd * 1e-9, 1))
            print(row, flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()

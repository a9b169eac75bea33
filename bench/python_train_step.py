#!/usr/bin/env python3
"""shared/anchors/torch_train_step.py's model and step, stock PyTorch eager vs the
same model with handgrad's LayerNorm, attention softmax and cross-entropy
swapped in (handgrad.torch). Same timing as the anchor: CUDA events, median of
30 steps after 5 warm-up steps. Peak memory: torch's allocator plus handgrad's
(handgrad's outputs and gradients live in its own caching allocator, which
torch does not count; the sum is an upper bound on the combined peak). Then
both train the same number of steps on the same learnable batches (next token = token + 1)
and the final losses are printed side by side.

  PYTHONPATH=build-gpu/python python3 bench/python_train_step.py [--config bench] \
      [--anchor shared/anchors/torch_train_step.py] [--train-steps 100] [--json OUT]

handgrad.torch runs its C++ autograd Functions (handgrad._torch_ext) where they were
built; HG_TORCH_EXT=0 times the Python ones. The backend is printed and in the JSON.

Variants: eager-fp32 / eager-bf16 (torch.autocast), each stock (the anchor's
non-SDPA attention: softmax(q k^T / sqrt(d) + mask)) and handgrad. Then the
two again, both alive, their steps interleaved in rounds (paired_ratio): the
ratio to read when the step is host-bound, since the host's speed drifts.
"""
import argparse
import importlib.util
import json
import math
import os
import time
import types

import torch
import torch.nn.functional as F

import handgrad
import handgrad.torch as hgt


DEV = "cuda"  # --smoke: "cpu"


def load_anchor(path):
    spec = importlib.util.spec_from_file_location("torch_train_step", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def handgrad_block_forward(s, x, mask):
    """The anchor's Block.forward with the softmax line replaced by handgrad's causal softmax."""
    B, T, D = x.shape
    q, k, v = s.qkv(s.ln1(x)).split(D, -1)
    q, k, v = [t.view(B, T, s.h, D // s.h).transpose(1, 2) for t in (q, k, v)]
    a = hgt.attention_softmax(q @ k.transpose(-1, -2), causal=True, scale=1 / math.sqrt(D // s.h)) @ v
    x = x + s.proj(a.transpose(1, 2).reshape(B, T, D))
    return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


def build(anchor, cfg, use_hg):
    torch.manual_seed(0)
    c = anchor.CONFIGS[cfg]
    m = anchor.LM(c["V"], c["d"], c["h"], c["L"], c["T"], False).to(DEV)
    if use_hg:
        hgt.swap_layernorms(m)
        for blk in m.blocks:
            blk.forward = types.MethodType(handgrad_block_forward, blk)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, **({"fused": True} if DEV == "cuda" else {}))
    return m, opt, c


def make_step(m, opt, c, bf16, use_hg):
    V, T = c["V"], c["T"]
    mask = torch.full((T, T), float("-inf"), device=DEV).triu(1)
    loss_fn = hgt.cross_entropy if use_hg else F.cross_entropy

    def step(idx, tgt):
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(m(idx, mask).view(-1, V), tgt.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def time_variant(anchor, cfg, bf16, use_hg):
    m, opt, c = build(anchor, cfg, use_hg)
    step = make_step(m, opt, c, bf16, use_hg)
    V, B, T = c["V"], c["B"], c["T"]

    def random_step():
        step(torch.randint(0, V, (B, T), device=DEV), torch.randint(0, V, (B, T), device=DEV))
    for _ in range(5):
        random_step()
    if DEV == "cpu":  # --smoke: only checks that the script runs
        t0 = time.perf_counter()
        random_step()
        return dict(step_ms=round((time.perf_counter() - t0) * 1e3, 3))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    handgrad.cuda_reset_peak_memory()
    ts, host = [], []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t0 = time.perf_counter()
        random_step()
        host.append((time.perf_counter() - t0) * 1e3)  # the host's time to queue the step
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    ms = ts[len(ts) // 2]
    host_ms = sorted(host)[len(host) // 2]
    # Tensors handgrad creates (LayerNorm/softmax outputs, gradients) live in handgrad's own
    # allocator, which torch's counters do not see: report both, and their sum as an upper bound.
    torch_peak = torch.cuda.max_memory_allocated() / 2**20
    hg_peak = handgrad.cuda_memory_stats()["peak_in_use"] / 2**20
    # host_ms close to step_ms: the step is bound by the host (Python, launches), not the GPU.
    return dict(step_ms=round(ms, 3), host_ms=round(host_ms, 3), tokens_per_s=round(B * T / ms * 1e3),
                peak_mem_MiB=round(torch_peak + hg_peak, 1), torch_peak_MiB=round(torch_peak, 1),
                handgrad_peak_MiB=round(hg_peak, 1))


def paired_ratio(anchor, cfg, bf16, rounds=12, per_round=4):
    """handgrad / stock step time with both models alive and their steps interleaved:
    rounds of `per_round` steps of each, the first alternating, and the median of the
    rounds' ratios. A host-bound step moves with the host's state (on the H100 machine
    the same stock step measured 10.4 and 18.9 ms minutes apart), which separate
    timings see as a difference between the variants and this pairing cancels."""
    steps, shape = {}, None
    for use_hg in (False, True):
        m, opt, c = build(anchor, cfg, use_hg)
        steps[use_hg] = make_step(m, opt, c, bf16, use_hg)
        shape = (c["V"], c["B"], c["T"])
    V, B, T = shape

    def timed(use_hg):
        idx, tgt = torch.randint(0, V, (B, T), device=DEV), torch.randint(0, V, (B, T), device=DEV)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        steps[use_hg](idx, tgt)
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e)
    for use_hg in (False, True):
        for _ in range(5):
            timed(use_hg)
    ratios, all_ms = [], {False: [], True: []}
    for r in range(rounds):
        med = {}
        for use_hg in ((False, True) if r % 2 == 0 else (True, False)):
            ms = sorted(timed(use_hg) for _ in range(per_round))
            all_ms[use_hg] += ms
            med[use_hg] = ms[len(ms) // 2]
        ratios.append(med[True] / med[False])
    ratios.sort()
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return dict(paired_ratio=round(ratios[len(ratios) // 2], 3), ratio_min=round(ratios[0], 3),
                ratio_max=round(ratios[-1], 3), stock_ms=round(median(all_ms[False]), 3),
                handgrad_ms=round(median(all_ms[True]), 3))


def train_loss(anchor, cfg, bf16, use_hg, steps):
    m, opt, c = build(anchor, cfg, use_hg)
    step = make_step(m, opt, c, bf16, use_hg)
    V, B, T = c["V"], c["B"], c["T"]
    g = torch.Generator(device=DEV).manual_seed(0)
    losses = []
    for _ in range(steps):
        start = torch.randint(0, V, (B, 1), device=DEV, generator=g)
        seq = (start + torch.arange(T + 1, device=DEV)) % V
        losses.append(step(seq[:, :-1].contiguous(), seq[:, 1:].contiguous()).detach())
    return [round(x.item(), 4) for x in losses]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    default_anchor = os.path.join(here, "..", "shared", "anchors", "torch_train_step.py")
    if not os.path.exists(default_anchor):
        default_anchor = "/work/shared/anchors/torch_train_step.py"
    ap.add_argument("--anchor", default=default_anchor)
    ap.add_argument("--config", default="bench")
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: checks the script, times nothing")
    a = ap.parse_args()
    if a.smoke and not hasattr(torch, "_functorch"):  # Debian's torch 1.13 lacks what the anchor configures
        import sys
        sys.modules["torch._functorch"] = types.ModuleType("torch._functorch")
        sys.modules["torch._functorch.config"] = types.ModuleType("torch._functorch.config")
    anchor = load_anchor(a.anchor)
    if a.smoke:
        global DEV
        DEV, a.config, a.train_steps = "cpu", "smoke", 3
        anchor.CONFIGS["smoke"] = dict(d=32, h=2, L=1, T=16, B=4, V=32)
    print(torch.__version__, torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "tf32:", torch.backends.cuda.matmul.allow_tf32,
          "config:", a.config, anchor.CONFIGS[a.config], "handgrad.torch backend:", hgt.BACKEND, flush=True)
    results = []
    for bf16 in ((False,) if a.smoke else (False, True)):  # handgrad has no bf16 CPU kernels
        row = {}
        for use_hg in (False, True):
            name = f"eager-{'bf16' if bf16 else 'fp32'}-{'handgrad' if use_hg else 'stock'}"
            r = dict(variant=name, **time_variant(anchor, a.config, bf16, use_hg))
            if use_hg:
                r["backend"] = hgt.BACKEND  # c++: handgrad._torch_ext; python: HG_TORCH_EXT=0 or not built
            losses = train_loss(anchor, a.config, bf16, use_hg, a.train_steps)
            r.update(loss_first=losses[0], loss_last=losses[-1])
            row[use_hg] = r
            results.append(r)
            print(r, flush=True)
        if a.smoke:
            continue
        pr = dict(variant=f"eager-{'bf16' if bf16 else 'fp32'}-paired", backend=hgt.BACKEND,
                  **paired_ratio(anchor, a.config, bf16))
        results.append(pr)
        print(pr, flush=True)
        print(f"  {'bf16' if bf16 else 'fp32'}: handgrad / stock step time = "
              f"{row[True]['step_ms'] / row[False]['step_ms']:.3f}, peak memory "
              f"{row[True]['peak_mem_MiB']} vs {row[False]['peak_mem_MiB']} MiB, final loss "
              f"{row[True]['loss_last']} vs {row[False]['loss_last']}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A small PyTorch language model with handgrad's LayerNorm, attention softmax and
cross-entropy swapped in, trained side by side with the stock model from the
same initial weights. Runs on the GPU when PyTorch and handgrad see one, else
on the CPU (a few seconds).

  PYTHONPATH=build/python python3 examples/python/torch_swap.py
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import handgrad
import handgrad.torch as hgt


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d=64, heads=4, seq=16, use_handgrad=False):
        super().__init__()
        self.heads, self.use_handgrad = heads, use_handgrad
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2, self.head = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, vocab)

    def attention(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(D, -1))
        scores = q @ k.transpose(-1, -2)
        if self.use_handgrad:  # the one swapped line: scale and causal mask folded into handgrad's kernel
            p = hgt.attention_softmax(scores, causal=True, scale=1 / math.sqrt(D // self.heads))
        else:
            mask = torch.full((T, T), float("-inf"), device=x.device).triu(1)
            p = torch.softmax(scores / math.sqrt(D // self.heads) + mask, -1)
        return self.proj((p @ v).transpose(1, 2).reshape(B, T, D))

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        x = x + self.attention(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(self.lnf(x))


def train(model, device, steps=60):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = hgt.cross_entropy if model.use_handgrad else F.cross_entropy
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        start = torch.randint(0, 32, (16, 1), generator=g)
        seq = ((start + torch.arange(17)) % 32).to(device)  # next token = token + 1
        loss = loss_fn(model(seq[:, :-1]).reshape(-1, 32), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            yield step, loss.item()


def main():
    device = "cuda" if torch.cuda.is_available() and handgrad.cuda_available() else "cpu"
    torch.manual_seed(0)
    stock = TinyLM().to(device)
    swapped = TinyLM(use_handgrad=True).to(device)
    swapped.load_state_dict(stock.state_dict())
    hgt.swap_layernorms(swapped)  # every nn.LayerNorm -> handgrad.torch.LayerNorm, same parameters
    print(f"device {device}; swapped modules: {[n for n, m in swapped.named_modules() if isinstance(m, hgt.LayerNorm)]}")
    for (step, a), (_, b) in zip(train(stock, device), train(swapped, device)):
        print(f"step {step:3d}  loss stock {a:.5f}  handgrad {b:.5f}")


if __name__ == "__main__":
    main()

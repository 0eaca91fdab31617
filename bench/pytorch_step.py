#!/usr/bin/env python3
"""GPT-2-small training steps in PyTorch on this CPU, the reference figure
next to `loom bench step`: the same shape (12 layers, hidden 768, 12 heads,
vocab 50257, tied LM head), micro-batch 4, AdamW, fp32 and bf16 autocast,
the same model-FLOPs formula and the same threads.

Usage: bench/pytorch_step.py [--threads N] [--seq 64,256] [--bf16-seq 64] [--steps 3]
(--bf16-seq: where PyTorch's CPU bf16 GEMM has no fast kernel, as on an AVX2
machine, a bf16 step takes minutes; time it at these lengths only.)
Needs Debian's python3-torch (run it with /usr/bin/python3)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

L, H, HEADS, V, B = 12, 768, 12, 50257, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.c_attn, self.c_proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.c_fc, self.mlp_proj = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = self.c_attn(self.ln_1(x)).split(H, dim=2)
        q, k, v = (z.view(B, t, HEADS, H // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (H // HEADS) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, t, H))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(seq, H)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(H)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))


def model_flops(seq):
    matmul = L * (4 * H * H + 2 * H * 4 * H) + V * H
    tokens = B * seq
    return 6.0 * matmul * tokens + 12.0 * L * H * seq * tokens


def step_seconds(seq, bf16, steps):
    torch.manual_seed(0)
    model = GPT(seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, V, (B, seq))
    best = float("inf")
    for _ in range(steps + 1):  # the first step warms up
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_gflops(dtype, n=2048, reps=3):
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2.0 * n**3 / best / 1e9


def _timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", default="64,256")
    ap.add_argument("--bf16-seq", default="64")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"pytorch {torch.__version__}, {a.threads} threads, GPT-2-small, micro-batch {B}")
    peaks = {"fp32": gemm_gflops(torch.float32), "bf16": gemm_gflops(torch.bfloat16)}
    print("GEMM 2048^3: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s" % (peaks["fp32"], peaks["bf16"]))
    bf16_seqs = {int(s) for s in a.bf16_seq.split(",") if s}
    for seq in (int(s) for s in a.seq.split(",")):
        for name, bf16 in (("fp32", False), ("bf16", True)):
            if bf16 and seq not in bf16_seqs:
                continue
            dt = step_seconds(seq, bf16, a.steps)
            g = model_flops(seq) / dt / 1e9
            print(f"seq {seq:4d} {name}: step {dt * 1e3:8.1f} ms | {B * seq / dt:6.0f} tok/s | model {g:6.1f} GFLOP/s "
                  f"| {100 * g / peaks[name]:5.1f}% of its {name} GEMM")


if __name__ == "__main__":
    main()

"""An independent reference training loop: the plain GPT-2 script anyone would write.

`bench --plain` times our Trainer against this, so it shares nothing with our code: its
own model (pre-norm blocks, SDPA causal attention, tanh-GELU MLP, tied wte/lm_head,
normal(0.02) init, loss = F.cross_entropy on the full logits), its own batches, AdamW with
weight decay on matrices, and the usual loop (accumulate, clip at 1.0, step, synchronize).
Nothing here imports from `engine`; a test checks it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ReferenceShape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int  # already padded, if the caller wants padding
    batch_size: int
    grad_accum: int = 1
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, s: ReferenceShape):
        super().__init__()
        self.n_head = s.n_head
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd, bias=s.bias)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=s.bias)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, s: ReferenceShape):
        super().__init__()
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=s.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=s.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, s: ReferenceShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.n_embd, bias=s.bias)
        self.attn = CausalSelfAttention(s)
        self.ln_2 = nn.LayerNorm(s.n_embd, bias=s.bias)
        self.mlp = MLP(s)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, s: ReferenceShape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.h = nn.ModuleList([Block(s) for _ in range(s.n_layer)])
        self.ln_f = nn.LayerNorm(s.n_embd, bias=s.bias)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        _, T = idx.size()
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def reference_step_times(
    tokens: np.ndarray,
    shape: ReferenceShape,
    steps: int,
    *,
    device: str = "cpu",
    precision: str = "fp32",
    compile: bool = False,
    seed: int = 0,
    lr: float = 6e-4,
    losses: list[float] | None = None,
) -> list[float]:
    """Wall seconds of each of `steps` optimizer steps, device-synchronized.

    precision: 'fp32' | 'tf32' | 'bf16' | 'fp16' (fp16 with a GradScaler). If `losses` is
    given, each step's last micro-batch loss is appended, read after the step is timed.
    The float32 matmul precision is restored afterwards, so a paired run is not affected.
    """
    assert precision in ("fp32", "tf32", "bf16", "fp16"), precision
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    B, T = shape.batch_size, shape.block_size
    data = torch.from_numpy(tokens.astype(np.int64))

    def get_batch():
        ix = rng.integers(0, len(tokens) - T - 1, size=B)
        x = torch.stack([data[i : i + T] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        if dev_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    model = GPT(shape).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=dev_type == "cuda")
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(dev_type, enabled=precision == "fp16")
    step_model = torch.compile(model) if compile else model

    def sync():
        if dev_type == "cuda":
            torch.cuda.synchronize()

    old_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    times: list[float] = []
    try:
        for _ in range(steps):
            sync()
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for _ in range(shape.grad_accum):
                x, y = get_batch()
                with torch.autocast(dev_type, dtype=low, enabled=low is not None):
                    loss = step_model(x, y)
                scaler.scale(loss / shape.grad_accum).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            sync()
            times.append(time.perf_counter() - t0)
            if losses is not None:
                losses.append(loss.item())
    finally:
        torch.set_float32_matmul_precision(old_precision)
    return times

"""GPT-2 as published (pre-LN, GELU-tanh, tied embeddings, scaled residual init).

Switches from ModelConfig: attention kernel (`flash` = SDPA, `manual` = explicit masked
softmax), vocab padding to a multiple of 64, bias, dropout, per-block gradient
checkpointing, and the loss (`plain` = cross-entropy on the full logits, `chunked` = lm_head
and loss fused over row chunks; engine/train/losses.py).

Padded ids: the training loss runs on the padded logits as they come (no slice, no copy).
Padded ids are never targets, so they only sit in the softmax normalizer, where training
drives their logits down. The logits returned for inference (no targets) are sliced to the
real vocab, so padded ids are never sampled nor predicted (tests/train/test_model.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from engine.config import ModelConfig
from engine.train.losses import chunked_linear_cross_entropy, cross_entropy


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.dropout, self.flash = cfg.n_head, cfg.dropout, cfg.attention == "flash"
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scaled = True  # GPT-2 init: std / sqrt(2 * n_layer)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # the unoptimized path: a full T x T score matrix
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = self.attn_dropout(F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1))
            y = att @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scaled = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.vocab_size is not None, "resolve vocab_size from the dataset first"
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size  # real ids: [0, vocab_size); the rest is padding
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.padded_vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02
            if getattr(module, "residual_scaled", False):
                std /= math.sqrt(2 * self.cfg.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Unique parameters: the tied embedding counts once."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Without targets: the last position's logits over the real vocab (padding sliced
        off, so never sampled). With targets: (the padded logits, or None; the mean CE loss,
        over the padded vocab). The logits come back in eval mode, not in training (nothing
        outside then holds the (B, T, V) tensor through backward) unless `return_logits`
        says otherwise; never under the chunked loss, which makes none."""
        T = idx.size(1)
        assert T <= self.cfg.block_size, f"sequence of {T} exceeds context {self.cfg.block_size}"
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            if self.cfg.grad_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if targets is None:  # generation: only the last position is needed
            return self.lm_head(self.transformer.ln_f(x[:, [-1], :]))[..., : self.vocab_size], None
        return self.loss_head(x, targets, (not self.training) if return_logits is None else return_logits)

    def loss_head(
        self, x: torch.Tensor, targets: torch.Tensor, return_logits: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Final norm, lm_head and the loss on the last block's output (B, T, C): a function of
        its own so the `blocks` compile scope compiles it as one more region."""
        x = self.transformer.ln_f(x)
        if self.cfg.loss == "chunked":  # never holds the B x T x V logits
            loss = chunked_linear_cross_entropy(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1))
            return None, loss
        logits = self.lm_head(x)  # (B, T, Vp): CE straight on it; autocast runs CE in fp32
        loss = cross_entropy(logits, targets)
        return (logits if return_logits else None), loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Autoregressive sampling; the context window slides once it is full."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.cfg.block_size :])
            logits = logits[:, -1, :] / max(temperature, 1e-6)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits.float(), dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
        return idx

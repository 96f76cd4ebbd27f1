"""GPT-2 as published (pre-LN, GELU-tanh, tied embeddings, scaled residual init), and the
speedrun's recipe switches (modded-nanogpt), each off by default and acting in a few lines here.

Switches from ModelConfig: attention kernel (`flash` = SDPA, `manual` = explicit masked
softmax), vocab padding to a multiple of 64, bias, dropout, per-block gradient
checkpointing, and the loss (`plain` = cross-entropy on the full logits, `chunked` = lm_head
and loss fused over row chunks; engine/train/losses.py).

Recipe switches (all off = GPT-2, bit-identical; tests/train/test_recipe_model.py):
- `mlp = relu2`: relu(x)^2 in place of GELU (MLP.forward);
- `qk_norm`: q and k RMS-normed over the head size, no weight (CausalSelfAttention.forward);
- `positions = rotary`: q and k rotated per head (base 10000, after qk_norm); no wpe table;
- `tie_head = false`: lm_head its own matrix (std 0.02; zero with zero_init_proj, as modded);
- `zero_init_proj`: attention's and MLP's c_proj start at 0 (GPT._init_weights);
- `logit_softcap = c`: logits = c * tanh(logits / c) in fp32, before the loss (GPT.logits; the
  chunked loss caps inside its chunks);
- `value_embeds`: one more (Vp x C) table, its lookup added into v of the first and last
  layer with a learned gate (init 0.5);
- `unet_skips`: n_layer // 2 learned weights (init 1); the first half's block outputs are
  pushed, and popped into the last half's inputs in reverse order (GPT.forward);
- `value_residual`: every layer after the first mixes its v with the first layer's,
  v = l * v + (1 - l) * v1, l learned per layer (init 0.5);
- `attn_window = w`: each token sees itself and at most w tokens before it (a banded mask:
  SDPA with an explicit boolean mask, the manual path's mask banded too; in compiled code on
  CUDA FlexAttention's block mask, which skips the blocks outside the band: GPT.use_flex);
- `fp8_head`: not built (engine/switch_matrix.py refuses it everywhere, with the reason).

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
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint

from engine.config import ModelConfig
from engine.train.attention import band
from engine.train.losses import chunked_linear_cross_entropy, cross_entropy


Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (T, 1, head_size / 2) each


def rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x (B, T, H, D) with each pair (x[..., i], x[..., i + D/2]) rotated by its position's angle."""
    cos, sin = (t.to(x.dtype) for t in rope)
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, H, D/2) each
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def scalar(value: float) -> nn.Parameter:
    """A learned mixing weight: shape (1,), not (), so FSDP2 can shard it like any tensor."""
    return nn.Parameter(torch.full((1,), value))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.n_head, self.dropout, self.flash = cfg.n_head, cfg.dropout, cfg.attention == "flash"
        self.qk_norm, self.window = cfg.qk_norm, cfg.attn_window
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scaled = True  # GPT-2 init: std / sqrt(2 * n_layer)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.ve_gate = scalar(0.5) if layer in cfg.value_embed_layers else None  # value embeddings' weight in v
        self.v_mix = scalar(0.5) if layer in cfg.value_residual_layers else None  # value residual's lambda
        self.block_mask: BlockMask | None = None  # the window's, for FlexAttention (GPT.use_flex)

    def forward(
        self, x: torch.Tensor, rope: Rope | None = None, ve: torch.Tensor | None = None, v1: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the attention's output, this layer's v (B, T, C): the value residual's v1 when first)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        if self.ve_gate is not None:  # value embedding (B, T, C), per head as v is; in v's dtype (autocast)
            v = v + self.ve_gate.type_as(v) * ve.type_as(v)
        if self.v_mix is not None:  # value residual: mixed with the first layer's v
            mix = self.v_mix.type_as(v)
            v = mix * v + (1 - mix) * v1
        v_out = v
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head) for t in (q, k, v))  # (B, T, H, D)
        if self.qk_norm:  # in (B, T, H, D), as rotary: SDPA's output then needs no copy back to (B, T, C)
            q, k = F.rms_norm(q, (q.size(-1),)).type_as(v), F.rms_norm(k, (k.size(-1),)).type_as(v)
        if rope is not None:
            q, k = rotary(q, rope), rotary(k, rope)
        flex = self.block_mask
        flex = flex if flex is not None and torch.compiler.is_compiling() and flex.seq_lengths == (T, T) else None
        if flex is not None and not q.stride() == k.stride() == v.stride():  # one layout for flex (GPT.use_flex)
            q, k, v = (t.contiguous() for t in (q, k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        mask = band(T, self.window, x.device)  # the sliding window's; None: plain causal
        if flex is not None:
            y = flex_attention(q, k, v, block_mask=flex)  # the band's blocks only; eager calls take SDPA's
        elif self.flash:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None)
        else:  # the unoptimized path: a full T x T score matrix
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if mask is None:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = self.attn_dropout(F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1))
            y = att @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))), v_out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.relu2 = cfg.mlp == "relu2"
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.c_proj.residual_scaled = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, 4C)
        h = F.relu(h).square() if self.relu2 else F.gelu(h, approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, rope: Rope | None = None, ve: torch.Tensor | None = None, v1: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the block's output, its attention's v: the first layer's is every later one's v1)."""
        y, v = self.attn(self.ln_1(x), rope, ve, v1)
        x = x + y
        return x + self.mlp(self.ln_2(x)), v


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.vocab_size is not None, "resolve vocab_size from the dataset first"
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size  # real ids: [0, vocab_size); the rest is padding
        Vp, C, L = cfg.padded_vocab_size, cfg.n_embd, cfg.n_layer
        learned = cfg.positions == "learned"  # rotary: no position table
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(Vp, C),
                **({"wpe": nn.Embedding(cfg.block_size, C)} if learned else {}),
                **({"ve": nn.Embedding(Vp, C)} if cfg.value_embeds else {}),  # value embeddings
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg, i) for i in range(L)),
                ln_f=nn.LayerNorm(C, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(C, Vp, bias=False)
        if cfg.tie_head:
            self.lm_head.weight = self.transformer.wte.weight  # tied
        self.skip_weights = nn.Parameter(torch.ones(cfg.unet_skip_count)) if cfg.unet_skip_count else None
        self.apply(self._init_weights)
        if cfg.zero_init_proj and not cfg.tie_head:
            nn.init.zeros_(self.lm_head.weight)  # modded-nanogpt's untied head starts at 0 too

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02
            if getattr(module, "residual_scaled", False):
                std = 0.0 if self.cfg.zero_init_proj else std / math.sqrt(2 * self.cfg.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)  # std 0: zero_init_proj
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Unique parameters: the tied embedding counts once."""
        return sum(p.numel() for p in self.parameters())

    def use_flex(self, mask: BlockMask | None) -> None:
        """The window's block mask every layer's attention runs through FlexAttention where the
        code is compiled (None: SDPA's dense band everywhere); engine/train/window.py says
        where flex runs. Flex gets q, k and v in one layout (all views of c_attn's output, or all
        tensors of their own: the odd ones copied): torch 2.13's compiled flex on CPU answers
        wrong for own q, k with a view v and fails to build for a view q with own k, v
        (docs/benchmarks.md), flex's kernels have had silent stride bugs before
        (pytorch#146377), and one layout is what modded-nanogpt and torchtitan pass it."""
        for block in self.transformer.h:
            block.attn.block_mask = mask

    def rope(self, T: int, device: torch.device) -> Rope | None:
        """Rotary's cos and sin (T, 1, D/2) at base 10000, or None with learned positions."""
        if self.cfg.positions != "rotary":
            return None
        D = self.cfg.n_embd // self.cfg.n_head
        inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
        angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)[:, None, :]
        return angles.cos(), angles.sin()

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Without targets: the last position's logits over the real vocab (padding sliced
        off, so never sampled). With targets: (the padded logits, or None; the mean CE loss,
        over the padded vocab). The logits come back in eval mode, not in training (nothing
        outside then holds the (B, T, V) tensor through backward) unless `return_logits`
        says otherwise; never under the chunked loss, which makes none."""
        T, L = idx.size(1), self.cfg.n_layer
        assert T <= self.cfg.block_size, f"sequence of {T} exceeds context {self.cfg.block_size}"
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        rope, ve = self.rope(T, idx.device), self.transformer.ve(idx) if "ve" in self.transformer else None
        v1, skips, n_skip = None, [], 0 if self.skip_weights is None else len(self.skip_weights)
        for i, block in enumerate(self.transformer.h):
            if i >= L - n_skip:  # U-net: the second half takes the first half's outputs, last in first
                x = x + self.skip_weights[i - (L - n_skip)] * skips.pop()
            args = (x, rope, ve if i in self.cfg.value_embed_layers else None, v1)
            if self.cfg.grad_checkpointing and self.training:
                x, v = checkpoint(block, *args, use_reentrant=False)
            else:
                x, v = block(*args)
            v1 = v if v1 is None and self.cfg.value_residual else v1  # the first layer's v
            if i < n_skip:
                skips.append(x)
        if targets is None:  # generation: only the last position is needed
            return self.logits(self.transformer.ln_f(x[:, [-1], :]))[..., : self.vocab_size], None
        return self.loss_head(x, targets, (not self.training) if return_logits is None else return_logits)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """lm_head, then the tanh softcap where set (in fp32: c * tanh(z / c) near c needs it)."""
        z = self.lm_head(x)  # (B, T, Vp)
        cap = self.cfg.logit_softcap
        return z if cap is None else cap * torch.tanh(z.float() / cap)

    def loss_head(
        self, x: torch.Tensor, targets: torch.Tensor, return_logits: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Final norm, lm_head and the loss on the last block's output (B, T, C): a function of
        its own so the `blocks` compile scope compiles it as one more region."""
        x = self.transformer.ln_f(x)
        if self.cfg.loss == "chunked":  # never holds the B x T x V logits
            loss = chunked_linear_cross_entropy(
                x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), softcap=self.cfg.logit_softcap
            )
            return None, loss
        logits = self.logits(x)  # (B, T, Vp): CE straight on it; autocast runs CE in fp32
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

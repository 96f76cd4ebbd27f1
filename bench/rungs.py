"""The ladder's rungs, as one table: what `gpt2-tui bench` climbs (bench/ladder.py) and what
`bench --to-loss` adds on top (bench/to_loss.py). The engine only says which settings exist
and which a live run may change; where each sits on the ladder is the benchmark's business.

Kept free of torch: bench/names.py reads it to build `--help`. tests/bench/test_rungs.py checks
that every live switch is a rung or in EXEMPT, and that every rung names a real setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

AMP = "amp"  # not a precision: bench/ladder.py's applicable() makes it the device's half precision


@dataclass(frozen=True)
class Rung:
    """One step up the ladder: the settings it changes over the rung below, together."""

    name: str  # what --skip takes
    label: str  # what the tables print
    changes: dict[str, Any]  # dotted setting -> value
    why: str


# Every climbed switch's value on the ladder's first rung (fp32, eager, manual attention, file
# read per batch, per-row batch loop, unpadded vocab, unfused AdamW), in the settings' order.
BASELINE: dict[str, Any] = {
    "speed.precision": "fp32",
    "speed.compile": False,
    "model.pad_vocab": False,
    "model.attention": "manual",
    "model.loss": "plain",
    "optim.fused": False,
    "data.preload": False,
    "data.vectorized": False,
    "data.pin_memory": False,
    "data.prefetch": False,
}

# The speed ladder, bottom to top; each rung keeps every change of the rungs below it.
RUNGS: tuple[Rung, ...] = (
    Rung("preload", "+ RAM preload", {"data.preload": True},
         "token files read into RAM instead of read from disk per batch"),
    Rung("vectorized", "+ vectorized batches", {"data.vectorized": True},
         "one numpy gather per batch instead of a Python loop"),
    Rung("tf32", "+ TF32", {"speed.precision": "tf32"},
         "TF32 tensor-core matmuls (Ampere+)"),
    Rung("amp", "+ AMP", {"speed.precision": AMP},
         "bf16 autocast (fp16 + GradScaler where bf16 is missing)"),
    Rung("compile", "+ torch.compile", {"speed.compile": True},
         "torch.compile of the model (first step compiles)"),
    Rung("flash", "+ flash attention", {"model.attention": "flash"},
         "F.scaled_dot_product_attention, causal"),
    Rung("pad_vocab", "+ padded vocab", {"model.pad_vocab": True},
         "embedding and LM head padded to a multiple of 64"),
    Rung("fused", "+ fused AdamW, pinned, prefetch",
         {"optim.fused": True, "data.pin_memory": True, "data.prefetch": True},
         "fused AdamW kernel, pinned host memory + async copies, batch built on a thread"),
    Rung("chunked_loss", "+ chunked loss", {"model.loss": "chunked"},
         "lm_head + cross-entropy over row chunks: never the whole B x T x V logits "
         "(a memory rung: the saving is in its peak memory column; docs/memory.md)"),
)  # fmt: skip

# `bench --to-loss`: settings that change what a run computes, not its speed, climbed after
# the speed ladder's rungs (each on top of the one before).
LOSS_RUNGS: tuple[Rung, ...] = (
    Rung("muon", "+ Muon", {"optim.optimizer": "muon"},
         "Muon for the blocks' matrices at muon-lr, AdamW for the rest"),
    Rung("wsd", "+ WSD schedule", {"optim.schedule": "wsd"},
         "warmup, stable at the peak lr, linear decay over the last decay-fraction"),
)  # fmt: skip


@dataclass(frozen=True)
class Share:
    """A trick's value that scales with the run it is measured on: this share of the run's steps
    (a warm-up, a ramp) or of its context (a window), at least 1; bench/recipe_ladder.py sets it."""

    of: Literal["steps", "context"]
    fraction: float

    def at(self, steps: int, context: int) -> int:
        return max(1, round(self.fraction * (steps if self.of == "steps" else context)))


# `bench --recipe-ladder` (bench/recipe_ladder.py): the speedrun's tricks (modded-nanogpt's
# record log, issue 40), each added in turn on top of the ones before it, then each left out of the
# whole recipe; the baseline is every setting named here at its default (GPT-2 as published).
RECIPE: tuple[Rung, ...] = (
    *LOSS_RUNGS,
    Rung("rotary", "+ rotary", {"model.positions": "rotary"},
         "rotary position embeddings, no learned position table (modded-nanogpt, with tuned lr: -30%)"),
    Rung("relu2", "+ ReLU^2", {"model.mlp": "relu2"},
         "ReLU squared in the MLP instead of GELU (with QK-norm and zero-init: -32%)"),
    Rung("qk_norm", "+ QK-norm", {"model.qk_norm": True},
         "q and k RMS-normed per head before attention"),
    Rung("zero_init", "+ zero-init projections", {"model.zero_init_proj": True},
         "attention's and the MLP's output projections start at zero"),
    Rung("untied", "+ untied head", {"model.tie_head": False},
         "lm_head its own matrix, not the token embedding's (-10%)"),
    Rung("value_residual", "+ value residual", {"model.value_residual": True},
         "each layer's values mixed with the first layer's by a learned lambda (with the next two: -24%)"),
    Rung("muon_warmup", "+ Muon momentum warm-up", {"optim.muon_momentum_warmup": Share("steps", 0.17)},
         "Muon's momentum ramps from 0.85 over the first sixth of the steps (modded-nanogpt: 300 of ~1750)"),
    Rung("softcap", "+ logit softcap", {"model.logit_softcap": 30.0},
         "logits = 30 tanh(logits / 30)"),
    Rung("unet", "+ U-net skips", {"model.unet_skips": True},
         "the first half's block outputs added, with learned weights, to the second half's inputs (-8%)"),
    Rung("window", "+ sliding window", {"model.attn_window": Share("context", 0.5)},
         "each token attends to at most half the context before it (with document masking: -30%)"),
    Rung("value_embeds", "+ value embeddings", {"model.value_embeds": True},
         "extra embedding tables mixed into some layers' values (-15%)"),
    Rung("align_docs", "+ aligned documents", {"data.align_docs": True},
         "each batch row starts at a document start"),
    Rung("batch_ramp", "+ batch ramp", {"train.batch_ramp": Share("steps", 0.2)},
         "tokens per step ramp up to the full batch over the first fifth of the steps (-2%)"),
    Rung("fp8_head", "+ FP8 head", {"model.fp8_head": True},
         "lm_head matmul in FP8 (Hopper only; -8%)"),
)  # fmt: skip

# Live switches (engine.settings.switches()) the ladder does not climb, and why not.
EXEMPT: dict[str, str] = {
    "speed.compile_mode": "a variant of the compile rung, not a rung of its own: `bench best` "
    "(bench/best.py) compares the modes",
    "speed.compile_scope": "how much the compile rung compiles (blocks by default): its cold-compile "
    "cost is bench/compile_warmup.py's figure, not a step-time rung",
    "model.grad_checkpointing": "trades speed for memory (~30% more compute): a step down, never a "
    "speedup to climb; its memory is measured by bench/memory_check.py",
    "train.batch_size": "batch geometry every rung shares (BenchConfig), not an optimization",
    "train.grad_accum": "batch geometry every rung shares (BenchConfig), not an optimization",
}

"""The ladder's rungs, as one table: what `gpt2-tui bench` climbs (bench/ladder.py) and what
`bench --to-loss` adds on top (bench/to_loss.py). The engine only says which settings exist
and which a live run may change; where each sits on the ladder is the benchmark's business.

Kept free of torch: bench/names.py reads it to build `--help`. tests/bench/test_rungs.py checks
that every live switch is a rung or in EXEMPT, and that every rung names a real setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

"""The GPU report's headline: one config with every optimization on, and its memory against the estimator.

    python -m bench.headline --out DIR                  gpt2 T1024 B16 bf16, compile, flash, fused AdamW (CUDA)
    python -m bench.headline --dry-run --out DIR        the same plumbing on CPU: micro, fp32, eager, 2 steps
    python -m bench.headline --recipe --out DIR         the speedrun preset's recipe at gpt2's shape
    python -m bench.headline --recipe --window 256 ...   the same with a sliding window (FlexAttention on CUDA)

Trains with the real Trainer (bench.common.time_config) and writes DIR/headline.json: ms/step
(median of the timed steps), tok/s, MFU, and torch.cuda.max_memory_allocated and
max_memory_reserved beside the estimator's allocated peak and that peak plus its allocator
margin (engine/train/memory.py). The first figure a short GPU window brings back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from engine import console

# The MFU convention, named wherever the figure is shown (engine/train/flops.py computes it).
MFU_CONVENTION = ("MFU = tok/s x (6N + 12*L*H*Q*T) FLOPs per token / the device's dense datasheet peak in the "
                  "run's precision (engine/train/flops.py: H100 SXM bf16 989 TFLOP/s); N = every parameter, the tied "
                  "embedding once; no recompute counted (PaLM's, as nanoGPT's estimate_mfu); with a sliding window "
                  "w, T in the attention term is min(T, w + 1): the model's FLOPs, while a dense masked kernel still "
                  "computes all T, so the hardware does more than this MFU counts")  # fmt: skip


class Headline(BaseModel):
    """What the headline run measured (None where this device has no such figure)."""

    config: str  # the shape and switches, in words
    device_name: str = ""
    precision: str = ""
    status: str = "pending"  # ran | out of memory: ... | failed: ...
    steps: int = 0
    warmup: int = 0
    median_step_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    mfu_convention: str = MFU_CONVENTION
    startup_s: float | None = None  # trainer start to first step done: build, compile, first step
    compile_s: float | None = None
    attention: str | None = None
    max_allocated_bytes: int | None = None
    max_reserved_bytes: int | None = None
    estimated_allocated_bytes: int | None = None
    estimated_reserved_bytes: int | None = None  # the estimator's allocated peak plus its allocator margin


# The speedrun's recipe at GPT-2's shape (`--recipe`): what its tricks cost a step where they are meant to run.
GPT2_SHAPE = {"model.n_layer": 12, "model.n_head": 12, "model.n_embd": 768, "model.block_size": 1024}


def overrides(dry_run: bool, batch: int, block: int, steps: int, warmup: int, data: str | None,
              vocab: int | None, recipe: bool = False,
              window: int | None = None) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """(the preset, its overrides): gpt2 with every speed switch on; on CPU micro, eager and fp32.
    `recipe`: the speedrun preset (its tricks, Muon, its device-chosen loss) at gpt2's shape; on
    CPU at its own small shape. `window`: a sliding window of that many tokens (on a dry run a
    quarter of the block: the window must be shorter than the sequence to be one)."""
    total = steps + warmup
    over: dict[str, Any] = {
        "speed.device": "cpu" if dry_run else "cuda", "speed.precision": "fp32" if dry_run else "bf16",
        "speed.compile": not dry_run, "model.attention": "flash", "model.pad_vocab": True, "optim.fused": not dry_run,
        "data.preload": True, "data.vectorized": True, "data.pin_memory": not dry_run, "data.prefetch": True,
        "train.batch_size": batch, "train.block_size": block, "train.grad_accum": 1, "train.max_steps": total,
        "train.log_interval": 1, "train.eval_interval": total + 1, "train.ckpt_interval": total + 1,
        "model.vocab_size": vocab or 50257, "optim.warmup_steps": 0,
    }  # fmt: skip
    if data:
        over["data.path"] = data
    if window:
        over["model.attn_window"] = max(1, block // 4) if dry_run else window
    if recipe:
        return "speedrun", over | ({} if dry_run else GPT2_SHAPE)
    return ("micro" if dry_run else "gpt2"), over


def measure(preset: str, over: dict[str, Any], warmup: int) -> Headline:
    import torch

    from bench.common import OUT_OF_MEMORY, out_of_memory, time_config
    from engine.config import resolve
    from engine.run.preflight import prepared
    from engine.train import memory

    config, dataset = prepared(resolve(preset, None, over), memory=False)
    c = config
    switches = [c.speed.precision, *(["compile"] if c.speed.compile else []), c.model.attention,
                *(["muon"] if c.optim.optimizer == "muon" else ["fused AdamW"] if c.optim.fused else []),
                *([f"{c.model.loss} loss"] if c.model.loss != "plain" else []),
                *([f"window {c.model.attn_window}"] if c.model.attn_window else [])]  # fmt: skip
    shape = f" L{c.model.n_layer} C{c.model.n_embd}" if preset == "speedrun" else ""
    h = Headline(config=f"{preset}{shape} T{c.seq_len} B{c.train.batch_size} {' '.join(switches)}",
                 steps=c.train.max_steps - warmup, warmup=warmup)  # fmt: skip
    est = memory.estimate(config)
    h.estimated_allocated_bytes = est.allocated_peak_bytes
    h.estimated_reserved_bytes = est.allocated_peak_bytes + est.breakdown.get("allocator margin", 0)
    cuda = config.speed.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory(prefix="gpt2-tui-headline-") as tmp:
        try:
            t = time_config(config, dataset, Path(tmp) / "run")
        except OUT_OF_MEMORY:
            h.status = out_of_memory(config)
            return h
    if cuda:
        h.max_allocated_bytes = torch.cuda.max_memory_allocated()
        h.max_reserved_bytes = torch.cuda.max_memory_reserved()
    median = statistics.median(t.settled(h.warmup))
    h.status, h.device_name, h.precision, h.median_step_s = "ran", t.device_name, t.precision, median
    h.tokens_per_s = config.tokens_per_step / median
    h.mfu = h.tokens_per_s * t.flops_per_token / t.peak_flops if t.peak_flops else None
    h.startup_s, h.compile_s, h.attention = t.startup_s, t.compile_s, t.attention
    return h


def line(h: Headline) -> str:
    """The headline in one line, as the report opens with it."""
    from engine.text import human

    if h.status != "ran" or h.median_step_s is None:
        return f"{h.config}: {h.status}"
    mfu = "unknown (no datasheet peak for this device)" if h.mfu is None else f"{100 * h.mfu:.1f}%"

    def vs(real: int | None, est: int | None) -> str:
        if real is None:
            return f"n/a here (estimated {human(est)})"
        return f"{human(real)} (estimated {human(est)}, {(est or 0) / real - 1:+.1%})" if real else "0"

    kernel = f"attention {h.attention}; " if h.attention else ""  # what ran: flex, cuDNN, ...
    return (f"{h.config}: {1000 * h.median_step_s:.1f} ms/step, {h.tokens_per_s:,.0f} tok/s, MFU {mfu}; {kernel}"
            f"peak max_memory_allocated {vs(h.max_allocated_bytes, h.estimated_allocated_bytes)}, "
            f"max_memory_reserved {vs(h.max_reserved_bytes, h.estimated_reserved_bytes)}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.headline", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for headline.json")
    p.add_argument("--dry-run", action="store_true", help="CPU, micro, fp32, eager: the plumbing only")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile happens here)")
    p.add_argument("--data", help="dataset directory (default: the stdlib corpus)")
    p.add_argument("--vocab-size", type=int, help="model vocab (default 50257, GPT-2's)")
    p.add_argument("--recipe", action="store_true", help="the speedrun preset's recipe at gpt2's shape")
    p.add_argument("--window", type=int, help="a sliding window of this many tokens (model.attn_window)")
    args = p.parse_args(argv)
    preset, over = overrides(args.dry_run, args.batch_size, args.block_size, args.steps, args.warmup, args.data,
                             args.vocab_size, args.recipe, args.window)  # fmt: skip
    from engine import files

    files.make_dir(args.out)
    h = measure(preset, over, args.warmup)
    files.atomic_write_bytes(args.out / "headline.json", json.dumps(h.model_dump(mode="json"), indent=1).encode())
    console.out.line(line(h), flush=True)
    return 0 if h.status == "ran" else 1


if __name__ == "__main__":
    sys.exit(main())

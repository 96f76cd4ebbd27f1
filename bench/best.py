"""The fastest configuration: every optimization on, then a sweep of micro-batch x compile mode.

    gpt2-tui bench --best --preset gpt2 [--batch-sizes 8,16,32] [--compile-modes default,max-autotune]

Each candidate trains with the real Trainer (bf16/fp16 autocast, flash attention, padded
vocab, fused AdamW, pinned memory, prefetch, and a host sync only every --log-interval
steps), and the table ranks them by tokens/s. A candidate that runs out of memory is
listed as such. `eager` in --compile-modes means no torch.compile.
"""

from __future__ import annotations

import datetime
import json
import statistics
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from engine import console
from engine import rundir
from bench.common import OUT_OF_MEMORY, BenchOptions, default_out, load_average, out_of_memory, time_config
from engine.files import atomic_write_bytes
from engine.text import human, path_text
from engine import switch_matrix
from engine.config import resolve
from engine.errors import UserError
from engine.run.preflight import prepared

COMPILE_MODES = ["eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class Candidate(BaseModel):
    batch_size: int
    compile_mode: str
    status: str = "pending"  # ran | out of memory | failed: ...
    median_step_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    startup_s: float | None = None


class BestResult(BaseModel):
    preset: str
    device_name: str = ""
    precision: str = ""
    torch_version: str = torch.__version__
    date: str
    load: str
    block_size: int
    vocab_size: int
    log_interval: int
    steps: int
    warmup: int
    command: str
    candidates: list[Candidate] = []

    @property
    def best(self) -> Candidate | None:
        ran = [c for c in self.candidates if c.tokens_per_s]
        return max(ran, key=lambda c: c.tokens_per_s or 0.0) if ran else None


def _list(text: str, kind: type, what: str) -> list[Any]:
    try:
        items = [kind(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--{what} takes a comma-separated list (got {text!r})") from None
    if not items:
        raise UserError(f"--{what} is empty; give at least one value")
    return items


def sweep(preset: str, base: dict[str, Any], batches: list[int], modes: list[str], steps: int, warmup: int,
          out: Path, command: str) -> BestResult:  # fmt: skip
    """Time every (batch, mode) candidate; bad input is found before anything is written."""
    planned = []
    for b in batches:
        for mode in modes:
            over = base | {"train.batch_size": b, "speed.compile": mode != "eager"}
            if mode != "eager":
                over["speed.compile_mode"] = mode
                for rule in switch_matrix.refusals(over, switch_matrix.Target("cuda")):
                    if "speed.compile_scope" in rule.settings:  # CUDA graphs refuse scope blocks: the whole model
                        over |= rule.fixes[0]
            planned.append((b, mode, resolve(preset, None, over)))
    config0, dataset = prepared(planned[0][2], memory=False)
    rundir.check_new(out)
    result = BestResult(
        preset=preset, date=datetime.date.today().isoformat(), load=load_average(), block_size=config0.seq_len,
        vocab_size=config0.model.vocab_size or 0, log_interval=config0.train.log_interval, steps=steps,
        warmup=warmup, command=command,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    warm = -(-warmup // config0.train.log_interval)
    for i, (b, mode, config) in enumerate(planned):
        c = Candidate(batch_size=b, compile_mode=mode)
        result.candidates.append(c)
        config, ds = prepared(config, memory=False)
        try:
            t = time_config(config, ds, out / f"{i}-b{b}-{mode}")
        except OUT_OF_MEMORY:
            c.status = out_of_memory(config)
        except Exception as err:  # a compile mode missing here: record it, go on
            line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            c.status = f"failed: {type(err).__name__}: {line}"[:200]
        else:
            c.status = "ran"
            c.median_step_s = statistics.median(t.settled(warm))
            c.tokens_per_s = config.tokens_per_step / c.median_step_s
            c.mfu = c.tokens_per_s * t.flops_per_token / t.peak_flops if t.peak_flops else None
            c.peak_mem_bytes, c.startup_s = t.mem_bytes, t.startup_s
            result.device_name, result.precision = t.device_name, t.precision
        console.out.line(f"  B={b} {mode}: {c.status}" + (f", {c.tokens_per_s:,.0f} tok/s" if c.tokens_per_s else ""),
                         flush=True)  # fmt: skip
        save(result, out)
    return result


def to_markdown(r: BestResult) -> str:
    lines = [
        f"preset {r.preset}, T={r.block_size}, vocab {r.vocab_size}, {r.precision}; {r.device_name}, "
        f"torch {r.torch_version}, {r.date}, load average {r.load}  ",
        f"median of {r.steps} timed steps after {r.warmup} warm-up steps, a host sync every {r.log_interval}  ",
        f"Command: `{r.command}`",
        "",
        "| batch | compile | ms/step | tok/s | MFU | peak mem | startup s | status |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    best = r.best
    for c in r.candidates:
        if c.status != "ran":
            lines.append(f"| {c.batch_size} | {c.compile_mode} | - | - | - | - | - | {c.status} |")
            continue
        mfu = "unknown" if c.mfu is None else f"{100 * c.mfu:.1f}%"
        mark = " **best**" if c is best else ""
        lines.append(
            f"| {c.batch_size} | {c.compile_mode} | {1000 * (c.median_step_s or 0):.1f} | {c.tokens_per_s:,.0f}{mark} "
            f"| {mfu} | {human(c.peak_mem_bytes)} | {c.startup_s:.1f} | ran |"
        )
    return "\n".join(lines) + "\n"


def save(r: BestResult, out: Path) -> None:
    atomic_write_bytes(out / "best.json", json.dumps(r.model_dump(mode="json"), indent=1).encode())
    atomic_write_bytes(out / "best.md", to_markdown(r).encode())


def run(args: BenchOptions, command: str) -> int:
    preset = args.preset or "gpt2"
    batches = _list(args.batch_sizes or "8,16,32", int, "batch-sizes")
    if min(batches) < 1:
        raise UserError("--batch-sizes must all be at least 1")
    modes = _list(args.compile_modes or "default,max-autotune-no-cudagraphs", str, "compile-modes")
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise UserError(f"unknown compile mode {bad[0]!r}; choose from: {', '.join(COMPILE_MODES)}")
    steps, warmup, every = args.steps or 30, args.warmup, args.log_interval or 10
    total = warmup + steps
    base: dict[str, Any] = {
        "speed.device": args.device, "speed.precision": "auto", "model.attention": "flash",
        "model.pad_vocab": True, "data.preload": True, "data.vectorized": True, "data.pin_memory": True,
        "data.prefetch": True, "train.grad_accum": args.grad_accum, "train.max_steps": total,
        "train.log_interval": every, "train.eval_interval": total + 1, "train.ckpt_interval": total + 1,
        "model.vocab_size": args.vocab_size or 50257,
        "optim.warmup_steps": 0,  # a timing run: the lr schedule does not change the speed
    }  # fmt: skip
    for key, value in (("data.path", args.data), ("train.block_size", args.block_size)):
        if value is not None:
            base[key] = value
    out = args.out or default_out(f"best-{preset}")
    console.out.line(f"best configuration sweep: preset {preset}, batches {batches}, modes {modes} -> {path_text(out)}",
                     flush=True)  # fmt: skip
    result = sweep(preset, base, batches, modes, steps, warmup, out, command)
    console.out.line()
    console.out.line(to_markdown(result))
    console.out.line(f"wrote {path_text(out / 'best.md')} and {path_text(out / 'best.json')}")
    return 0

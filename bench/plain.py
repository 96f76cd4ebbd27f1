"""Our training loop against an independent reference loop, on the same data and shape.

    gpt2-tui bench --plain --preset nano [--steps 30] [--rounds 3]

The reference is `bench.reference`: the plain GPT-2 script anyone would write, with
its own model, batches and loop (AdamW, clip at 1.0), sharing nothing with our GPT or
Trainer, so a cost in our model or loop shows up here (a comparison with ourselves proves
only that we did not get slower). Both train the same token file at the same shape
(layers, heads, width, sequence, micro-batch, the padded vocab our model uses), fp32 eager.

The loops run in alternating paired rounds (ours, reference, reference, ours, ...: the order
flips each round) so drift on a shared machine hits them alike and neither always runs
first; each figure is the median over the timed steps of all rounds, and "x reference"
is our median step time over the reference's (<= 1.0 means we are as fast or faster).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel

from engine import console
from engine import rundir
from bench.common import BenchOptions, default_out, load_average, time_config
from bench.reference import ReferenceShape, reference_step_times
from engine.files import atomic_write_bytes
from engine.config import RunConfig, resolve
from engine.dataset import Dataset
from engine.device import describe as device_name
from engine.device import pick as pick_device
from engine.run.preflight import prepared

# The reference reads one int64 copy of its tokens: a window of the first shard is plenty
# for random batches, and keeps a multi-GB train.bin from being copied whole.
REFERENCE_TOKENS = 4_000_000


def reference_shape(config: RunConfig) -> ReferenceShape:
    """Our config's shape for the reference: same layers, width, heads, sequence, batch,
    accumulation, bias, and the vocab our lm_head really has (padded when we pad)."""
    m = config.model
    return ReferenceShape(
        n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, block_size=config.seq_len,
        vocab_size=m.padded_vocab_size, batch_size=config.train.batch_size,
        grad_accum=config.train.grad_accum, bias=m.bias,
    )  # fmt: skip


def reference_tokens(dataset: Dataset) -> np.ndarray:
    """The train tokens the reference samples from: the first shard, at most REFERENCE_TOKENS."""
    shard = dataset.train.shards[0]
    return np.asarray(shard.read(0, min(shard.count, REFERENCE_TOKENS)))


def reference_loop(
    config: RunConfig, dataset: Dataset, steps: int, losses: list[float] | None = None
) -> list[float]:
    """Seconds per step of the independent reference loop at `config`'s shape (fp32, eager)."""
    device = pick_device(config.speed.device)
    return reference_step_times(
        reference_tokens(dataset), reference_shape(config), steps, device=str(device), precision="fp32",
        compile=False, seed=config.train.seed, lr=config.optim.lr, losses=losses,
    )  # fmt: skip


class PlainResult(BaseModel):
    preset: str
    device_name: str
    torch_version: str = torch.__version__
    date: str
    load_before: str
    load_after: str = ""
    batch_size: int
    block_size: int
    vocab_size: int
    steps: int
    warmup: int
    rounds: int
    command: str
    ms: dict[str, float] = {}  # variant -> median ms/step
    per_round_ms: dict[str, list[float]] = {}
    cpu_ms: dict[str, float] = {}  # process CPU time per step, model build and warm-up included


VARIANTS = {
    "ours": "gpt2-tui Trainer (the preset's config, fp32, eager, log every step)",
    "reference": "independent reference loop (bench/reference.py: its own GPT-2, AdamW, clip 1.0)",
    "nanogpt": "nanoGPT's own train.py (--nanogpt: its model, AdamW, clip 1.0, at our shape)",
}


def nanogpt_loop(checkout: Path, config: RunConfig, dataset: Dataset, steps: int) -> list[float]:
    """Seconds per step of nanoGPT's own train.py at `config`'s shape (bench/nanogpt.py)."""
    from bench import nanogpt

    val = dataset.val.shards[0]
    return nanogpt.step_times(checkout, reference_tokens(dataset), np.asarray(val.read(0, min(val.count, 100_000))),
                              reference_shape(config), steps, config.optim.lr)  # fmt: skip


def compare(config: RunConfig, dataset: Dataset, out: Path, steps: int, warmup: int, rounds: int,
            command: str, preset: str, nanogpt: Path | None = None) -> PlainResult:  # fmt: skip
    import datetime

    result = PlainResult(
        preset=preset, device_name=device_name(pick_device(config.speed.device)),
        date=datetime.date.today().isoformat(), load_before=load_average(), batch_size=config.train.batch_size,
        block_size=config.seq_len, vocab_size=config.model.vocab_size or 0, steps=steps, warmup=warmup,
        rounds=rounds, command=command,
    )  # fmt: skip
    names = [k for k in VARIANTS if k != "nanogpt" or nanogpt is not None]
    settled: dict[str, list[float]] = {k: [] for k in names}
    total = warmup + steps
    ours = config.model_copy(deep=True)
    ours.train.max_steps = total
    ours.train.eval_interval = ours.train.ckpt_interval = total + 1
    ours.train.log_interval = 1
    cpu: dict[str, float] = {k: 0.0 for k in names}
    for n in range(rounds):
        for name in names if n % 2 == 0 else names[::-1]:  # paired: the order flips each round
            c0 = time.process_time()
            if name == "ours":
                times = time_config(ours, dataset, out / f"round{n}-ours").step_times_s
            elif name == "nanogpt" and nanogpt is not None:  # its CPU time is its child's, not counted here
                times = nanogpt_loop(nanogpt, config, dataset, total)
            else:
                times = reference_loop(config, dataset, total)
            cpu[name] += time.process_time() - c0
            timed = times[warmup:]
            settled[name] += timed
            result.per_round_ms.setdefault(name, []).append(1000 * statistics.median(timed))
            console.out.line(f"  round {n + 1}/{rounds} {name}: {1000 * statistics.median(timed):.1f} ms/step",
                             flush=True)  # fmt: skip
    result.ms = {k: 1000 * statistics.median(v) for k, v in settled.items()}
    result.cpu_ms = {k: 1000 * v / (rounds * total) for k, v in cpu.items()}
    result.load_after = load_average()
    return result


def to_markdown(r: PlainResult) -> str:
    lines = [
        f"preset {r.preset}, vocab {r.vocab_size}, B={r.batch_size} T={r.block_size}, fp32 eager, "
        f"{r.device_name}, torch {r.torch_version}, {r.date}  ",
        f"{r.rounds} alternating rounds x ({r.warmup} warm-up + {r.steps} timed steps) per loop; "
        f"load average before {r.load_before}, after {r.load_after}  ",
        f"Command: `{r.command}`",
        "",
        "| loop | median ms/step | per-round medians (ms) | x reference | x nanoGPT | CPU ms/step (all steps + build) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, what in VARIANTS.items():
        if name not in r.ms:
            continue
        rounds = ", ".join(f"{m:.1f}" for m in r.per_round_ms.get(name, []))
        vs_nano = f"{r.ms[name] / r.ms['nanogpt']:.3f}x" if "nanogpt" in r.ms else "-"
        cpu = "-" if name == "nanogpt" else f"{r.cpu_ms[name]:.1f}"  # a child process: its CPU is not ours to read
        lines.append(f"| {what} | {r.ms[name]:.1f} | {rounds} | {r.ms[name] / r.ms['reference']:.3f}x | {vs_nano} | {cpu} |")
    if "nanogpt" in r.ms:  # the per-round pairs: drift between rounds cancels within each
        pairs = [o / g for o, g in zip(r.per_round_ms["ours"], r.per_round_ms["nanogpt"], strict=True)]
        lines += ["", "ours / nanoGPT per round: " + ", ".join(f"{p:.3f}x" for p in pairs)]
    return "\n".join(lines) + "\n"


def run(args: BenchOptions, command: str) -> int:
    preset = args.preset or "nano"
    overrides = {"speed.device": args.device, "speed.precision": "fp32", "speed.compile": False,
                 "train.grad_accum": 1}  # fmt: skip
    for key, value in (("data.path", args.data), ("model.vocab_size", args.vocab_size),
                       ("train.batch_size", args.batch_size), ("train.block_size", args.block_size)):  # fmt: skip
        if value is not None:
            overrides[key] = value
    checkout = None
    if args.nanogpt is not None:  # refused before anything is written
        from bench.nanogpt import check_checkout

        checkout = check_checkout(args.nanogpt)
    config, dataset = prepared(resolve(preset, None, overrides), memory=False)
    out = args.out or default_out(f"plain-{preset}")
    rundir.check_new(out)
    out.mkdir(parents=True, exist_ok=True)
    also = " and nanoGPT's train.py" if checkout is not None else ""
    console.out.line(f"our loop vs the independent reference loop{also}: preset {preset} -> {out}", flush=True)
    result = compare(config, dataset, out, args.steps or 30, args.warmup, args.rounds, command, preset, checkout)
    text = to_markdown(result)
    atomic_write_bytes(out / "plain.md", text.encode())
    atomic_write_bytes(out / "plain.json", json.dumps(result.model_dump(mode="json"), indent=1).encode())
    console.out.line()
    console.out.line(text)
    console.out.line(f"wrote {out / 'plain.md'} and {out / 'plain.json'}")
    return 0

"""Our training loop against the plainest PyTorch loop of the same model and data.

    gpt2-tui bench --plain --preset nano [--steps 30] [--rounds 3]

The plain loop is what anyone would write first: the same GPT, the same batches (same
sampler, same seed), torch.optim.AdamW, fp32, eager; per step: batch -> forward ->
zero_grad -> backward -> step. A second plain variant adds clip_grad_norm_, which our
loop does too (the Trainer clips and reports the pre-clip norm), so any gap can be put
where it belongs. The loops run in alternating rounds (ours, plain, plain+clip, ours, ...)
so drift on a shared machine hits them alike, the order rotating each round so that no
loop always runs first; each figure is the median over the timed steps of all rounds.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from pydantic import BaseModel

from engine import rundir
from engine.measure.common import BenchOptions, default_out, load_average, time_config
from engine.checkpoint import atomic_write_bytes
from engine.config import RunConfig, resolve
from engine.data import BatchSampler, Dataset
from engine.model import GPT
from engine.device import describe as device_name
from engine.device import pick as pick_device
from engine.start import open_data


def plain_loop(
    config: RunConfig, dataset: Dataset, steps: int, clip: bool = False
) -> tuple[list[float], list[float]]:
    """(seconds per step, device-synchronized; loss per step) of the plainest loop.

    `config` comes from open_data; only its model, batch geometry, seed and AdamW
    hyper-parameters are used (constant lr, weight decay on every parameter).
    """
    device = pick_device(config.speed.device)
    torch.manual_seed(config.train.seed)
    model = GPT(config.model).to(device)
    o = config.optim
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    sampler = BatchSampler(dataset.train, config.train.batch_size, config.seq_len, seed=config.train.seed)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = sampler.next()
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        losses.append(loss.item())  # what a plain loop prints; also the device sync
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times, losses


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
    "plain": "plain loop: forward, zero_grad, backward, AdamW step, loss.item()",
    "plain_clip": "plain loop + clip_grad_norm_ (the work our loop also does)",
}


def compare(config: RunConfig, dataset: Dataset, out: Path, steps: int, warmup: int, rounds: int,
            command: str, preset: str) -> PlainResult:  # fmt: skip
    import datetime

    result = PlainResult(
        preset=preset, device_name=device_name(pick_device(config.speed.device)),
        date=datetime.date.today().isoformat(), load_before=load_average(), batch_size=config.train.batch_size,
        block_size=config.seq_len, vocab_size=config.model.vocab_size or 0, steps=steps, warmup=warmup,
        rounds=rounds, command=command,
    )  # fmt: skip
    settled: dict[str, list[float]] = {k: [] for k in VARIANTS}
    total = warmup + steps
    ours = config.model_copy(deep=True)
    ours.train.max_steps = total
    ours.train.eval_interval = ours.train.ckpt_interval = total + 1
    ours.train.log_interval = 1
    cpu: dict[str, float] = {k: 0.0 for k in VARIANTS}
    names = list(VARIANTS)
    for n in range(rounds):
        for name in names[n % len(names) :] + names[: n % len(names)]:  # rotate: no loop always goes first
            c0 = time.process_time()
            if name == "ours":
                times = time_config(ours, dataset, out / f"round{n}-ours").step_times_s
            else:
                times, _ = plain_loop(config, dataset, total, clip=name == "plain_clip")
            cpu[name] += time.process_time() - c0
            timed = times[warmup:]
            settled[name] += timed
            result.per_round_ms.setdefault(name, []).append(1000 * statistics.median(timed))
            print(f"  round {n + 1}/{rounds} {name}: {1000 * statistics.median(timed):.1f} ms/step", flush=True)
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
        "| loop | median ms/step | per-round medians (ms) | vs plain | CPU ms/step (all steps + build) |",
        "|---|---:|---|---:|---:|",
    ]
    for name, what in VARIANTS.items():
        rounds = ", ".join(f"{m:.1f}" for m in r.per_round_ms.get(name, []))
        lines.append(
            f"| {what} | {r.ms[name]:.1f} | {rounds} | {r.ms['plain'] / r.ms[name]:.3f}x | {r.cpu_ms[name]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run(args: BenchOptions, command: str) -> int:
    preset = args.preset or "nano"
    overrides = {"speed.device": args.device, "speed.precision": "fp32", "speed.compile": False,
                 "train.grad_accum": 1}  # fmt: skip
    for key, value in (("data.path", args.data), ("model.vocab_size", args.vocab_size),
                       ("train.batch_size", args.batch_size), ("train.block_size", args.block_size)):  # fmt: skip
        if value is not None:
            overrides[key] = value
    config, dataset = open_data(resolve(preset, None, overrides))
    out = args.out or default_out(f"plain-{preset}")
    rundir.check_new(out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"our loop vs the plain loop: preset {preset} -> {out}", flush=True)
    result = compare(config, dataset, out, args.steps or 30, args.warmup, args.rounds, command, preset)
    text = to_markdown(result)
    atomic_write_bytes(out / "plain.md", text.encode())
    atomic_write_bytes(out / "plain.json", json.dumps(result.model_dump(mode="json"), indent=1).encode())
    print()
    print(text)
    print(f"wrote {out / 'plain.md'} and {out / 'plain.json'}")
    return 0

"""Settled step time of the two compile scopes, paired step by step in one process.

    python -m bench.compile_settled [--preset gpt2] [--batch-size 2] [--block-size 128]
                                    [--pairs 40] [--warmup 3] [--device cpu]

bench.compile_warmup runs each scope in its own process, so the machine's drift between runs
lands in the settled figure (on a shared 2-core VM one run's steps moved by 20%). Here two
copies of the same model (same seed, same weights) are compiled, one whole (`model`) and one
block by block (`blocks`), and trained on the same batches, one step of each in turn (the
order flips every pair), so both see the same machine. A step is the trainer's recipe:
forward with the loss, backward, AdamW (fused where torch has it); the device is synchronized
around each. The table gives each scope's median and the median of the per-pair ratio.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import numpy as np
import torch

from bench.common import load_average
from engine import console
from engine.train import compiling
from engine import device as devices
from engine.config import resolve
from engine.train.batches import BatchSampler
from engine.train.model import GPT
from engine.run.preflight import prepared


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compile_settled", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3, help="steps of each before timing (the compile happens here)")
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    overrides = {"train.batch_size": args.batch_size, "train.block_size": args.block_size, "speed.compile": True}
    if args.device != "auto":
        overrides["speed.device"] = args.device
    config, dataset = prepared(resolve(args.preset, None, overrides), memory=False)
    device = devices.pick(config.speed.device)
    precision = devices.precision(config.speed.precision, device.type)
    dtype = devices.autocast_dtype(precision)
    sampler = BatchSampler(dataset.train, args.batch_size, config.seq_len, seed=0)

    steppers = {}
    for scope in ("model", "blocks"):
        torch.manual_seed(0)
        model = GPT(config.model).to(device)
        forward = compiling.compile_forward(model, scope, None)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type in ("cuda", "cpu"))
        steppers[scope] = (forward, opt)

    def step(scope: str, x: torch.Tensor, y: torch.Tensor) -> float:
        forward, opt = steppers[scope]
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - t0

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = sampler.next()
        return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    load_before = load_average()
    for _ in range(args.warmup):
        x, y = batch()
        for scope in steppers:
            step(scope, x, y)
    times: dict[str, list[float]] = {"model": [], "blocks": []}
    for i in range(args.pairs):
        x, y = batch()
        for scope in ("model", "blocks") if i % 2 == 0 else ("blocks", "model"):
            times[scope].append(step(scope, x, y))
    ratio = statistics.median(np.array(times["blocks"]) / np.array(times["model"]))
    console.out.line(f"{devices.describe(device)}, {precision}, torch {torch.__version__}, {datetime.date.today()}, "
                     f"preset {args.preset} B{args.batch_size} T{config.seq_len}, {args.pairs} pairs after {args.warmup} warm-up "
          f"steps each, load before {load_before}, after {load_average()}  ")  # fmt: skip
    console.out.line(f"Command: `python -m bench.compile_settled {' '.join(argv or [])}`".rstrip() + "\n")
    console.out.line("| scope | median ms/step | per-pair blocks / model |")
    console.out.line("|---|---:|---:|")
    for scope in ("model", "blocks"):
        cell = f"{ratio:.3f} ({100 * (ratio - 1):+.1f}%)" if scope == "blocks" else ""
        console.out.line(f"| {scope} | {1000 * statistics.median(times[scope]):.1f} | {cell} |")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

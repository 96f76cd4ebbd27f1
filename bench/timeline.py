"""One configuration timed step by step, to show the torch.compile warm-up settling.

    gpt2-tui bench --config run.toml [--steps 100] [--out DIR] [--compile-cache cold|warm|both]

The run config is trained by the real Trainer (evals and checkpoints left out) with a
step event every --log-interval steps; the table lists each interval's ms/step and the
point where the speed settled: the first interval after which every interval stays
within 10% of the settled median (the median of the second half).
With --compile-cache, torch.compile's caches start empty (cold), filled by a one-step run
of the same config (warm), or both, one after the other (fresh.time_compile_cache); the
table then gives the first step of each: the warm-up a second run or a resume pays.
"""

from __future__ import annotations

import datetime
import json
import statistics
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel

from engine import console
from engine import rundir
from bench.fresh import time_compile_cache
from bench.common import BenchOptions, FirstStep, default_out, load_average
from engine.files import atomic_write_bytes
from engine.config import RunConfig, resolve
from engine.dataset import Dataset
from engine.errors import UserError
from engine.run.preflight import prepared

SETTLED_BAND = 0.10


class Timeline(BaseModel):
    config_file: str
    device_name: str
    precision: str
    compile: bool
    torch_version: str = torch.__version__
    date: str
    load: str
    tokens_per_step: int
    log_interval: int
    command: str
    startup_s: float
    step_times_s: list[float]  # per-step time of each interval, in order
    settled_step_s: float
    settled_after: int  # steps until the speed settled
    warmup_s: float  # wall time of the steps before it settled
    compile_cache: str | None = None  # cold | warm | both; None: the user's cache, as any run
    first_steps: list[FirstStep] = []


def settle_point(times: list[float], band: float = SETTLED_BAND) -> tuple[float, int]:
    """(settled median, index of the first interval from which all stay within band of it)."""
    settled = statistics.median(times[len(times) // 2 :])
    index = len(times) - 1
    while index > 0 and abs(times[index - 1] - settled) <= band * settled:
        index -= 1
    return settled, index


def timeline(config: RunConfig, dataset: Dataset, config_file: str, out: Path, command: str,
             compile_cache: Literal["cold", "warm", "both", "all"] | None = None) -> Timeline:  # fmt: skip
    """Train `config` (bound by open_data) in out/run and read its step times back."""
    load = load_average()
    timing, firsts = time_compile_cache(compile_cache, config, dataset, out / "run")
    times = timing.step_times_s
    settled, index = settle_point(times)
    every = config.train.log_interval
    return Timeline(
        config_file=config_file, device_name=timing.device_name, precision=timing.precision,
        compile=config.speed.compile, date=datetime.date.today().isoformat(), load=load,
        tokens_per_step=config.tokens_per_step, log_interval=every, command=command, startup_s=timing.startup_s,
        step_times_s=times, settled_step_s=settled, settled_after=index * every,
        warmup_s=sum(t * every for t in times[:index]), compile_cache=compile_cache, first_steps=firsts,
    )  # fmt: skip


def to_markdown(t: Timeline) -> str:
    lines = [
        f"config {t.config_file}: {t.precision}, compile {'on' if t.compile else 'off'}, "
        f"{t.tokens_per_step:,} tokens/step; {t.device_name}, torch {t.torch_version}, {t.date}, "
        f"load average {t.load}  ",
        f"Command: `{t.command}`  ",
        f"startup (build + first step, compile included): {t.startup_s:.2f} s; "
        f"settled at {1000 * t.settled_step_s:.1f} ms/step ({t.tokens_per_step / t.settled_step_s:,.0f} tok/s) "
        f"after {t.settled_after} steps ({t.warmup_s:.1f} s)",
        "",
        *first_step_table(t.first_steps),
        "| step | ms/step | tok/s | vs settled |",
        "|---:|---:|---:|---:|",
    ]
    for i, s in enumerate(t.step_times_s):
        lines.append(
            f"| {(i + 1) * t.log_interval} | {1000 * s:.1f} | {t.tokens_per_step / s:,.0f} | "
            f"{s / t.settled_step_s:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def first_step_table(firsts: list[FirstStep]) -> list[str]:
    """The first step with torch.compile's caches cold and warm (markdown lines; none without)."""
    if not firsts:
        return []
    lines = ["| compile cache | run | first step s | compile s | startup s | files in the cache after |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    whats = {"cold": "empty directory", "warm": "filled by the run above", "artifacts": "empty + the run's artifacts"}
    for f in firsts:
        comp = "-" if f.compile_s is None else f"{f.compile_s:.2f}"
        lines.append(f"| {f.cache} ({whats[f.cache]}) | {f.steps} step{'s' * (f.steps > 1)} | {f.first_step_s:.2f} | "
                     f"{comp} | {f.startup_s:.2f} | {f.cache_files} |")  # fmt: skip
    return [*lines, ""]


def run(args: BenchOptions, command: str) -> int:
    steps = args.steps or 100
    overrides = {"train.max_steps": steps, "train.log_interval": args.log_interval or 1,
                 "train.eval_interval": steps + 1, "train.ckpt_interval": steps + 1,
                 "optim.warmup_steps": 0}  # fmt: skip
    for key, value in (("data.path", args.data), ("model.vocab_size", args.vocab_size),
                       ("train.batch_size", args.batch_size), ("train.block_size", args.block_size),
                       ("speed.device", None if args.device == "auto" else args.device)):  # fmt: skip
        if value is not None:
            overrides[key] = value
    config, dataset = prepared(resolve(None, args.config, overrides), memory=False)  # bad input: found before writing
    if args.compile_cache and not config.speed.compile:
        raise UserError(f"--compile-cache times torch.compile, which {args.config} leaves off; "
                        "set compile = true under [speed] in it")  # fmt: skip
    out = args.out or default_out(Path(args.config).stem)
    rundir.check_new(out)
    out.mkdir(parents=True, exist_ok=True)
    console.out.line(f"timing {args.config} for {steps} steps -> {out}", flush=True)
    t = timeline(config, dataset, str(args.config), out, command, args.compile_cache)
    text = to_markdown(t)
    atomic_write_bytes(out / "timeline.md", text.encode())
    atomic_write_bytes(out / "timeline.json", json.dumps(t.model_dump(mode="json"), indent=1).encode())
    console.out.line(text)
    console.out.line(f"wrote {out / 'timeline.md'} and {out / 'timeline.json'}")
    return 0

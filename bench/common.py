"""What the measuring tools share: timing one config with the real Trainer, where results go.

Every tool trains with the engine's own Trainer (no copy of the loop): step times come
from its Step events, which are device-synchronized.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, Field

from engine.train import compile_cache, guard
from engine import events as ev
from engine.config import MAX_BATCH, MAX_CONTEXT, MAX_STEPS, MAX_VOCAB, RunConfig
from engine.dataset import Dataset
from engine.errors import UserError
from engine.run.requests import Control
from engine.run.owner import start
from engine.train.trainer import measuring


OUT_OF_MEMORY = (torch.OutOfMemoryError, guard.OutOfMemory)  # torch's, and the trainer's stop after one


def out_of_memory(config: RunConfig) -> str:
    """A rung's or candidate's record after an OOM: the words, and what the estimator
    predicted against what the device offered, so the table says how far off it was."""
    from engine.train import memory
    from engine.device import memory_bytes
    from engine.text import human

    est = memory.estimate(config)
    total = memory_bytes(config.speed.device)
    of = f" of {human(total)} device memory" if total else ""
    return f"out of memory: estimated peak {human(est.peak_bytes)}{of}; lower --batch-size"


class BenchOptions(BaseModel):
    """What `gpt2-tui bench` was asked for (the CLI's flags, typed and checked)."""

    preset: str | None = None
    config: Path | None = None
    plain: bool = False
    nanogpt: Path | None = None  # --plain: a nanoGPT checkout whose train.py runs beside ours
    best: bool = False
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    warmup: int = Field(5, ge=1, le=MAX_STEPS)
    out: Path | None = None
    data: str | None = None
    device: str = "auto"
    vocab_size: int | None = Field(None, ge=2, le=MAX_VOCAB)
    batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    block_size: int | None = Field(None, ge=1, le=MAX_CONTEXT)
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH)
    log_interval: int | None = Field(None, ge=1, le=MAX_STEPS)
    batch_sizes: str | None = None
    compile_modes: str | None = None
    skip: list[str] = []
    rounds: int = Field(3, ge=1, le=1000)
    compile_cache: Literal["cold", "warm", "both", "all"] | None = None
    gpu_report: bool = False
    part: list[str] = []
    dry_run: bool = False
    full: bool = False  # --gpu-report: the full report's parts, not the short-window profile
    no_doctor: bool = False  # --gpu-report: leave the doctor out
    budget: int | None = Field(None, ge=1, le=10**6)
    to_loss: Annotated[float, Field(gt=0)] | Literal["baseline"] | None = None  # "baseline": --to-loss alone
    recipe_ladder: bool = False  # --to-loss's rows: the speedrun's tricks (bench/recipe_ladder.py)
    seeds: int | None = Field(None, ge=1, le=1000)  # --recipe-ladder: paired seeds per row

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> BenchOptions:
        from pydantic import ValidationError

        try:
            return cls.model_validate(values)
        except ValidationError as err:
            e = err.errors()[0]
            flag = "--" + str(e["loc"][0]).replace("_", "-")
            ctx = e.get("ctx") or {}
            why = (f"must be at least {ctx['ge']}" if "ge" in ctx else f"must be at most {ctx['le']}" if "le" in ctx
                   else e["msg"].lower())  # fmt: skip
            raise UserError(f"{flag} {why} (got {e['input']!r})") from None


def load_average() -> str:
    """The 1/5/15-minute load, as `uptime` shows it (the machine may be shared)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


class Timing(BaseModel):
    """What one bench run measured, from its events."""

    step_times_s: list[float]  # per-step time of each logged interval, in order
    data_times_s: list[float]
    mem_bytes: int | None
    startup_s: float
    n_params: int
    device: str
    device_name: str
    precision: str
    flops_per_token: int
    peak_flops: float | None
    reason: str
    compile_s: float | None = None  # from the run's `compiled` event (engine.train.compiling.Warmup)
    compile_source: str | None = None  # cold | warm disk | run artifacts
    attention: str | None = None  # the SDPA kernel that ran (engine.train.attention); None: manual
    attention_ms: dict[str, float | None] = {}  # CUDA: each kernel's timing that picked it
    contention: list[ev.Contention | None] = []  # each step_times_s interval's (engine/train/contention.py)

    def settled(self, warmup_intervals: int) -> list[float]:
        return self.step_times_s[warmup_intervals:] or self.step_times_s[-1:]


def time_config(
    config: RunConfig,
    dataset: Dataset,
    run_dir: Path,
    control: Control | None = None,
    on_step: Callable[[ev.Step], None] | None = None,
) -> Timing:
    """Train `config` (bound by open_data) in run_dir with the real Trainer; collect its step times."""
    steps: list[ev.Step] = []
    started: list[ev.RunStarted] = []
    finished: list[ev.RunFinished] = []
    compiled: list[ev.Compiled] = []
    t0 = time.perf_counter()
    first_step_at: list[float] = []

    def collect(event: Any) -> None:
        if isinstance(event, ev.Step):
            if not first_step_at:
                first_step_at.append(time.perf_counter())
            steps.append(event)
            if on_step is not None:
                on_step(event)
        elif isinstance(event, ev.RunStarted):
            started.append(event)
        elif isinstance(event, ev.RunFinished):
            finished.append(event)
        elif isinstance(event, ev.Compiled):
            compiled.append(event)

    if config.speed.compile:  # a compile starts from the cache directory alone, as in a fresh process
        compile_cache.forget_loaded()
    run = start(
        config, run_dir, sinks=[ev.CallbackSink(collect)], control=control, force=True, dataset=dataset,
        components=measuring,
    )  # fmt: skip
    try:
        reason = run.run()
    finally:
        del run
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if not started or not steps:
        raise RuntimeError("the run stopped before its first step")
    s = started[0]
    mems = [e.mem_bytes for e in steps if e.mem_bytes is not None]
    return Timing(
        step_times_s=[e.step_time_s for e in steps], data_times_s=[e.data_time_s for e in steps],
        mem_bytes=max(mems) if mems else None, startup_s=first_step_at[0] - t0, n_params=s.n_params,
        device=s.device, device_name=s.device_name, precision=s.precision,
        flops_per_token=s.flops_per_token, peak_flops=s.peak_flops, reason=reason,
        compile_s=compiled[0].compile_s if compiled else None, compile_source=compiled[0].source if compiled else None,
        attention=s.attention, attention_ms=s.attention_ms, contention=[e.contention for e in steps],
    )  # fmt: skip


CacheMode = Literal["cold", "warm", "both", "all"]


class FirstStep(BaseModel):
    """The first step of one run, timed with torch.compile's caches cold, warm from disk, or
    filled from another run's compile artifacts; each run in a fresh process (bench.fresh)."""

    cache: Literal["cold", "warm", "artifacts"]
    steps: int  # the run's length: 1 for a run that only fills or reads the cache
    first_step_s: float  # the first logged interval's per-step time
    startup_s: float  # trainer start to first step done: build, compile (or cache read), first step
    cache_files: int  # files in the cache directory after the run
    compile_s: float | None = None  # what torch counted as compiling (engine.train.compiling.Warmup)



def default_out(name: str) -> Path:
    return Path("runs") / f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}"

"""The speed ladder: what each optimization buys, measured on this machine by the real Trainer.

    gpt2-tui bench --preset gpt2 [--steps N] [--out DIR]      the cumulative ladder
    gpt2-tui bench --config run.toml [--steps N]              one config over time (timeline.py)
    gpt2-tui bench --preset nano --plain                      our loop vs an independent plain loop (plain.py)

Each rung adds one optimization to the rung before and trains a few steps with the
engine's own Trainer (no copy of the loop): step times come from its Step events, which
are device-synchronized. A rung whose switch cannot work on this device is listed as
skipped with the reason, and the ladder goes on without it. Checkpoints and evals are
left out of bench runs: they happen outside the step clock anyway and only cost time.

Each rung's timed steps carry the machine's contention (engine/train/contention.py): a rung
timed on a busy machine is marked in the table, and one line under the header says how many.
With a time budget the ladder re-plans as it climbs (replan): when it falls behind, the rungs
left measure fewer steps, never none; a rung is not skipped for time.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from pydantic import BaseModel, Field

from engine import console
from engine import events as ev
from engine.train import contention
from engine import rundir
from engine.files import atomic_write_bytes
from engine.train.memory import param_count
from engine.text import attention_text, contention_text, human, params_text, path_text, ratio_text
from engine.config import RunConfig, resolve
from engine.dataset import Dataset
from engine.errors import UserError
from engine.run.requests import Control
from engine import device as devices
from engine import switch_matrix
from engine.device import describe as describe_device, pick as pick_device
from bench.fresh import time_compile_cache
from bench.common import (OUT_OF_MEMORY, BenchOptions, FirstStep, default_out, load_average, out_of_memory)
from bench.rungs import BASELINE, RUNGS
from engine.run.preflight import prepared

GPT2_VOCAB = 50257
CPU_BUDGET_S = 480  # the whole ladder on a CPU: nano's finishes in minutes even on 2 cores (a busy one: longer)


class RungSpec(BaseModel):
    """One step up the ladder: config switches (dotted name -> value) added to the rung below."""

    name: str
    label: str
    changes: dict[str, Any]
    why: str


LADDER: list[RungSpec] = [  # the rungs' table: bench/rungs.py
    RungSpec(name="baseline", label="baseline", changes=BASELINE, why="fp32, eager, manual attention, file read per "
             "batch, per-row batch loop, unpadded vocab, unfused AdamW"),  # fmt: skip
    *(RungSpec(name=r.name, label=r.label, changes=r.changes, why=r.why) for r in RUNGS),
]
from bench.names import RUNG_NAMES  # noqa: E402  (torch-free, for --help)


class BenchConfig(BaseModel):
    """What the ladder runs on: a preset plus the batch geometry every rung shares."""

    preset: str = "nano"
    data: str | None = None
    device: Literal["auto", "cuda", "mps", "cpu"] = "auto"
    vocab_size: int | None = Field(GPT2_VOCAB, ge=2, description="None = the dataset's")
    batch_size: int | None = Field(None, ge=1, description="None = the preset's")
    block_size: int | None = Field(None, ge=1, description="None = the model's context")
    grad_accum: int = Field(1, ge=1)
    steps: int = Field(20, ge=1, description="timed steps per rung")
    warmup: int = Field(5, ge=1, description="untimed steps first (compile happens here)")
    log_interval: int = Field(1, ge=1, description="steps per timed interval (one host sync each)")
    skip: list[str] = Field(default_factory=list, description="rungs left out by request")
    compile_cache: Literal["cold", "warm", "both", "all"] | None = Field(
        None, description="compiled rungs: torch.compile's caches cold, warm, both or all (+ the run's artifacts) "
        "(None: the user's cache)"
    )
    seed: int = 1337
    budget_s: float | None = Field(
        None, gt=0, description="seconds the whole ladder may take; None: CPU_BUDGET_S on a CPU, no bound elsewhere"
    )

    fit_batch: bool = Field(
        True, description="with a time budget and no batch_size: a smaller micro-batch, picked from a measured first "
        "step, when the preset's would not let every rung run within the budget (fit_shape)"
    )
    fit_steps: bool = Field(
        False, description="with a time budget: fewer timed and warm-up steps too, when a smaller batch is not enough "
        "(the CLI sets it when --steps was not given)"
    )

    def budget_for(self, device: torch.device) -> float | None:
        return self.budget_s if self.budget_s is not None else (CPU_BUDGET_S if device.type == "cpu" else None)


class RungResult(BaseModel):
    name: str
    label: str
    status: Literal["ran", "skipped", "failed", "pending"] = "pending"
    reason: str | None = None  # why skipped or failed
    notes: list[str] = []  # parts of the rung that did not apply here
    precision: str | None = None
    startup_s: float | None = None  # trainer start -> first step done (build, compile, first step)
    first_step_s: float | None = None
    median_step_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    data_time_s: float | None = None
    speedup_vs_baseline: float | None = None
    speedup_vs_prev: float | None = None
    step_times_s: list[float] = []  # every timed interval's per-step time, warm-up included
    first_steps: list[FirstStep] = []  # compiled rungs under --compile-cache: cold, then warm
    attention: str | None = None  # the SDPA kernel that ran (on CUDA the fastest of those timed)
    attention_ms: dict[str, float | None] = {}  # CUDA: what each kernel took, which picked it
    warmup: int | None = None  # this rung's warm-up and timed steps (the ladder's, unless re-planned)
    steps: int | None = None
    contention: ev.Contention | None = None  # over its timed steps (engine/train/contention.py)


class LadderResult(BaseModel):
    preset: str
    shape_note: str = ""  # how fit_shape picked the batch and steps from a measured first step, if it did
    device: str = ""
    device_name: str = ""
    torch_version: str = torch.__version__
    date: str = Field(default_factory=lambda: datetime.date.today().isoformat())
    load: str = ""
    n_params: int | None = None
    batch_size: int = 0
    block_size: int = 0
    grad_accum: int = 1
    vocab_size: int = 0
    tokens_per_step: int = 0
    steps: int = 0
    warmup: int = 0
    command: str = ""
    rungs: list[RungResult] = []
    replan_note: str = ""  # the last time the ladder re-planned its rungs' steps for the budget, and why


# ---------------------------------------------------------------- the ladder


def _fused_adamw_reason(device: torch.device) -> str | None:
    try:
        p = torch.nn.Parameter(torch.zeros(2, device=device))
        p.grad = torch.zeros(2, device=device)
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, TypeError) as err:
        return f"fused AdamW is not available on {device.type} ({str(err).splitlines()[0]})"
    return None


def applicable(name: str, value: Any, device: torch.device, vocab: int) -> tuple[Any, str | None]:
    """(the value to set, or why this switch cannot work here: engine/switch_matrix.py's IDLE
    entries, for this device as a Target)."""
    target = switch_matrix.Target(device.type, devices.has_bf16(device.type))  # type: ignore[arg-type]
    idle = switch_matrix.idle(name, value, target)
    if idle is not None:
        return value, idle
    if name == "speed.precision" and value == "amp":
        amp = devices.half_precision(device.type)  # the engine's own decision: emulated bf16 counts as none
        return amp, contention.half_reason(amp) if device.type == "cpu" else None
    if name == "optim.fused" and value:
        return value, _fused_adamw_reason(device)
    if name == "model.pad_vocab" and value and vocab % 64 == 0:
        return value, f"vocab {vocab} is already a multiple of 64"
    return value, None


class PlannedRung(NamedTuple):
    """A rung's full override set (cumulative), or None with the reason it is skipped."""

    spec: RungSpec
    overrides: dict[str, Any] | None
    skip_reason: str | None
    notes: list[str]  # parts of the rung that cannot work here


def base_overrides(bench: BenchConfig) -> dict[str, Any]:
    """What every rung shares: device, data, geometry, and a run length with no evals or saves."""
    total = bench.warmup + bench.steps
    out: dict[str, Any] = {
        "speed.device": bench.device, "train.grad_accum": bench.grad_accum,
        "train.max_steps": total, "train.log_interval": bench.log_interval,
        "train.eval_interval": total + 1, "train.eval_batches": 1, "train.ckpt_interval": total + 1,
        "train.seed": bench.seed, "optim.warmup_steps": 0,
    }  # fmt: skip
    for key, value in (
        ("data.path", bench.data), ("model.vocab_size", bench.vocab_size),
        ("train.batch_size", bench.batch_size), ("train.block_size", bench.block_size),
    ):  # fmt: skip
        if value is not None:
            out[key] = value
    return out


def plan(bench: BenchConfig, device: torch.device, vocab: int) -> list[PlannedRung]:
    unknown = [s for s in bench.skip if s not in RUNG_NAMES]
    if unknown:
        raise UserError(f"unknown rung {unknown[0]!r} in --skip; choose from: {', '.join(RUNG_NAMES[1:])}")
    if "baseline" in bench.skip:
        raise UserError("the baseline rung cannot be skipped: every speedup is measured against it")
    current: dict[str, Any] = {}
    rungs = []
    for spec in LADDER:
        if spec.name in bench.skip:
            rungs.append(PlannedRung(spec, None, "left out by --skip", []))
            continue
        applied, notes = {}, []
        for name, value in spec.changes.items():
            value, why_not = applicable(name, value, device, vocab)
            if why_not is None:
                applied[name] = value
            else:
                notes.append(why_not)
        if not applied:
            rungs.append(PlannedRung(spec, None, "; ".join(notes), []))
            continue
        current = current | applied
        rungs.append(PlannedRung(spec, dict(current), None, notes))
    return rungs


MIN_STEPS = 3  # timed steps per rung that fit_shape never goes below: the median of 3 intervals
FIT_SHARE = 0.7  # the share of the budget left after the probe that fit_shape plans the rungs to fill
CPU_COMPILE_S = 60.0  # what fit_shape sets aside for a compiled rung's compile on a CPU (nano: 20-60 s on 2 cores)
HEARTBEAT_S = 30.0  # a rung or probe still running says so this often (beside a hog one printed nothing for 6.5 min)


@contextlib.contextmanager
def heartbeat(tell: Callable[[str], None], what: Callable[[], str], every: float | None = None) -> Iterator[None]:
    """While the block runs, `tell` a line every `every` seconds (HEARTBEAT_S) that it is still
    measuring `what()`: a slow rung on a busy machine is never silent. The line comes from a
    thread of its own that runs no torch, ended and joined with the block."""
    done, t0 = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S if every is None else every):
            tell(f"  still measuring {what()} ({time.monotonic() - t0:.0f} s so far)")

    thread = threading.Thread(target=beat, daemon=True, name="ladder-heartbeat")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class Shape(NamedTuple):
    batch_size: int
    warmup: int
    steps: int


def fit_shape(
    start: Shape, step_s: float, startup_s: float, rungs: int, left_s: float, fit_steps: bool, reserve_s: float = 0.0,
    probe_batch: int | None = None,
) -> tuple[Shape, bool]:
    """(the largest shape whose `rungs` rungs fit, whether it does): each rung costs `startup_s`
    plus its warm-up and timed steps, a step taking `step_s` at `probe_batch` (default `start`'s
    batch size), scaled by batch size; they must fill at most FIT_SHARE of `left_s` less
    `reserve_s`. The batch halves first (down to an eighth of the preset's), then, with
    `fit_steps`, the steps shrink (to 1 warm-up + MIN_STEPS), then the batch halves again to 1.
    `start` itself when it fits; the smallest shape, and False, when nothing does."""
    room = FIT_SHARE * (left_s - reserve_s)
    per = step_s / (probe_batch or start.batch_size)

    def cost(s: Shape) -> float:
        return rungs * (startup_s + (s.warmup + s.steps) * per * s.batch_size)

    def halvings(b: int, floor: int) -> list[int]:
        out = []
        while b > floor:
            b = max(floor, b // 2)
            out.append(b)
        return out

    candidates = [start] + [start._replace(batch_size=b) for b in halvings(start.batch_size, max(1, start.batch_size // 8))]
    low = candidates[-1].batch_size
    if fit_steps:
        short = Shape(low, min(start.warmup, 1), min(start.steps, MIN_STEPS))
        candidates += [short] + [short._replace(batch_size=b) for b in halvings(low, 1)]
    else:
        candidates += [start._replace(batch_size=b) for b in halvings(low, 1)]
    fitting = next((c for c in candidates if cost(c) <= room), None)
    return (fitting, True) if fitting is not None else (candidates[-1], False)


def replan(start: Shape, startup_s: float, step_s: float, rungs: int, left_s: float) -> tuple[Shape, bool]:
    """(the steps the `rungs` rungs still to climb measure, whether they fit `left_s`): each
    costs `startup_s` plus its warm-up and timed steps at `step_s` (measured on the rung before).
    `start`'s steps when they fit; else the warm-up shrinks to 1, then the timed steps to
    MIN_STEPS (never above `start`'s own): fewer steps, never no rung, and False when even
    those do not fit (the ladder then takes longer than its budget and says so)."""
    room = left_s / max(1, rungs) - startup_s
    fit = int(room / step_s) if step_s > 0 and room > 0 else (10**9 if room > 0 else 0)
    warmup = max(min(start.warmup, 1), min(start.warmup, fit - start.steps))
    steps = max(min(start.steps, MIN_STEPS), min(start.steps, fit - warmup))
    return start._replace(warmup=warmup, steps=steps), warmup + steps <= fit


def _probe(
    bench: BenchConfig, base: dict[str, Any], baseline: dict[str, Any], dataset: Dataset, run_dir: Path, batch: int
) -> tuple[float, float]:
    """(seconds of a baseline step at `batch`, seconds of a rung's start-up, its slow first step
    included): two steps of the ladder's slowest rung, the baseline, with the real Trainer (a
    first step alone overstates the rest several times over)."""
    two = {"train.max_steps": 2, "train.log_interval": 1, "train.batch_size": batch}
    config, ds = prepared(resolve(bench.preset, None, base | baseline | two), memory=False)
    timing, _ = time_compile_cache(None, config, ds, run_dir)
    step_s = timing.step_times_s[-1]
    return step_s, max(0.0, timing.startup_s - step_s)


def checked_plan(
    bench: BenchConfig, base: dict[str, Any], out: Path,
    planner: Callable[[BenchConfig, torch.device, int], list[PlannedRung]],
) -> tuple[torch.device, RunConfig, list[PlannedRung], Dataset]:  # fmt: skip
    """Before a byte is written: the device, the preset's config bound to the dataset (opened
    through the engine's preflight), the rungs `planner` plans there, each rung's config
    validated, and `out` free."""
    device = pick_device(bench.device)
    probe, dataset = prepared(resolve(bench.preset, None, base), memory=False)
    vocab = probe.model.vocab_size
    assert vocab is not None
    the_plan = planner(bench, device, vocab)
    for p in the_plan:
        if p.overrides is not None:
            resolve(bench.preset, None, base | p.overrides)
    rundir.check_new(out)
    return device, probe, the_plan, dataset


def run_ladder(
    bench: BenchConfig,
    out: Path,
    stop: threading.Event | None = None,
    on_step: Callable[[str, ev.Step], None] | None = None,
    on_rung: Callable[[RungResult], None] | None = None,
    command: str = "",
    say: Callable[[str], None] | None = None,
) -> LadderResult:
    """Climb the ladder; results are filled in rung by rung (on_rung sees each as it lands;
    `say` gets a line as each starts, and how the shape was picked).

    With a time budget (a CPU's by default), the batch size (and with fit_steps the steps) is
    picked from a measured first step of the baseline so that every rung runs within it
    (fit_shape); the result's shape_note says so. As it climbs, each rung's steps are re-planned
    from the rung before's measured cost (replan): behind the budget the rest measure fewer
    steps, never none (result.replan_note says the last re-plan). Bad input (preset, data,
    sizes, --skip, --out) is found before anything is written. A rung that fails (out of memory, a kernel
    missing) is recorded and the ladder goes on.
    """
    tell = say or (lambda line: None)
    base = base_overrides(bench)
    device, probe, the_plan, dataset = checked_plan(bench, base, out, plan)
    vocab = probe.model.vocab_size
    budget = bench.budget_for(device)
    t0 = time.monotonic()
    shape_note = ""
    runnable = [p for p in the_plan if p.overrides is not None]
    step_s: float | None = None  # a measured baseline step, when the shape is fitted to the budget
    if budget is not None and bench.batch_size is None and bench.fit_batch and runnable and not (stop and stop.is_set()):
        out.mkdir(parents=True, exist_ok=True)
        start = Shape(probe.train.batch_size, bench.warmup, bench.steps)
        small = max(1, start.batch_size // 8)  # cheap to measure however slow the preset's batch is here
        tell(f"measuring two baseline steps at batch size {small} to fit the ladder in its {budget:g} s budget")
        try:
            with tempfile.TemporaryDirectory(prefix="gpt2-tui-ladder-probe-") as tmp, heartbeat(
                    tell, lambda: "the two baseline steps"):  # not a rung: not in `out`  # fmt: skip
                step_s, startup_s = _probe(bench, base, runnable[0].overrides or {}, dataset, Path(tmp) / "probe", small)
        except OUT_OF_MEMORY as err:  # the rungs will say it, each with its estimate: keep the preset's shape
            tell(f"the shape probe ran out of memory ({str(err).splitlines()[0][:120]}); rungs keep the preset's shape")
            step_s = None
    if step_s is not None:
        compiled = any((p.overrides or {}).get("speed.compile") for p in runnable)
        reserve = CPU_COMPILE_S if compiled and device.type == "cpu" else 0.0
        left = budget - (time.monotonic() - t0)
        fitted, fits = fit_shape(start, step_s, startup_s, len(runnable), left, bench.fit_steps, reserve, small)
        measured = f"a measured baseline step took {step_s:.2f} s at batch size {small}"
        how = f"batch size {fitted.batch_size}, {fitted.warmup} + {fitted.steps} steps per rung"
        if not fits:
            shape_note = (f"{measured}: {how}, the smallest shape, and still not all {len(runnable)} rungs may fit "
                          f"the {budget:g} s budget: the rungs re-plan to fewer steps as they climb and the ladder may "
                          "outlast it (raise --budget)")  # fmt: skip
        elif fitted != start:
            shape_note = (f"{measured}: {how}, so all {len(runnable)} rungs fit the {budget:g} s budget "
                          "(--batch-size and --steps choose)")  # fmt: skip
        if fitted != start:
            bench = bench.model_copy(update={"batch_size": fitted.batch_size, "warmup": fitted.warmup, "steps": fitted.steps})
            base = base_overrides(bench)
            probe, _ = prepared(resolve(bench.preset, None, base), memory=False)
        if shape_note:
            tell(shape_note)

    result = LadderResult(
        preset=bench.preset, device=str(device), device_name=describe_device(device),  # known before any rung runs
        load=load_average(), batch_size=probe.train.batch_size,
        block_size=probe.seq_len, grad_accum=probe.train.grad_accum, vocab_size=vocab, n_params=param_count(probe),
        tokens_per_step=probe.tokens_per_step, steps=bench.steps, warmup=bench.warmup, command=command,
        rungs=[RungResult(name=s.name, label=s.label) for s, _, _, _ in the_plan], shape_note=shape_note,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    baseline: float | None = None
    prev: float | None = None
    deadline = None if budget is None else t0 + budget
    planned = current = Shape(result.batch_size, bench.warmup, bench.steps)  # the ladder's steps; the next rung's
    # what a rung costs (start-up s, s a step): the rung before's, measured; before the first, the probe's
    pace = None if step_s is None else (startup_s, step_s / small * result.batch_size)
    compiled_ran, short_said, started = False, False, False
    for i, (spec, overrides, skip_reason, notes) in enumerate(the_plan):
        r = result.rungs[i]
        r.notes = notes
        if stop is not None and stop.is_set():
            r.status, r.reason = "skipped", "stopped before this rung"
        elif overrides is None:
            r.status, r.reason = "skipped", skip_reason
        else:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and pace is not None:  # behind (or back within) the budget: re-plan the rest
                ahead = [p.overrides for p in the_plan[i:] if p.overrides is not None]
                compiling = not compiled_ran and device.type == "cpu" and any(o.get("speed.compile") for o in ahead)
                shape, fits = replan(planned, *pace, len(ahead), left - (CPU_COMPILE_S if compiling else 0.0))
                if shape != current or (not fits and not short_said):
                    result.replan_note = _replan_line(shape, current, fits, pace, len(ahead), left, budget or 0.0)
                    tell(f"  {result.replan_note}")
                    short_said = not fits
                current = shape
            r.warmup, r.steps = current.warmup, current.steps
            tell(f"  {spec.label}: measuring {current.warmup} + {current.steps} steps"
                 + ("" if left is None else f" ({left:.0f} s of the budget left)" if left >= 0 else
                    f" ({-left:.0f} s past the budget)"))
            climb = bench.model_copy(update={"warmup": current.warmup, "steps": current.steps})
            seen = [0]  # the rung's latest step, for the heartbeat

            def stepped(name: str, e: ev.Step, seen: list[int] = seen) -> None:
                seen[0] = e.step
                if on_step is not None:
                    on_step(name, e)

            total = current.warmup + current.steps
            with heartbeat(tell, lambda: f"{spec.label}: step {seen[0]} of {total}"):
                _run_rung(r, climb, base_overrides(climb) | overrides, dataset, out / f"{i}-{spec.name}", result,
                          -(-current.warmup // bench.log_interval), stop, stepped)  # fmt: skip
            started = True
            compiled_ran = compiled_ran or bool(overrides.get("speed.compile"))
            if r.status == "ran" and r.median_step_s:
                pace = (r.startup_s or 0.0, r.median_step_s)
                baseline = baseline or r.median_step_s
                r.speedup_vs_baseline = baseline / r.median_step_s
                r.speedup_vs_prev = (prev / r.median_step_s) if prev else 1.0
                prev = r.median_step_s
        if on_rung is not None:
            on_rung(r)
        save(result, out)
    if budget is not None and started and (took := time.monotonic() - t0) > budget:
        fewer = any(r.steps is not None and (r.warmup, r.steps) != planned[1:] for r in result.rungs)
        result.replan_note = (result.replan_note + "; " if result.replan_note else "") + (
            f"the ladder took {took:.0f} s, over its {budget:g} s budget: every rung ran"
            + (", at fewer steps" if fewer else "") + " (raise --budget)")
        tell(f"  {result.replan_note}")
        save(result, out)
    if stop is not None and stop.is_set() and not started:
        shutil.rmtree(out, ignore_errors=True)  # stopped before any rung started: no empty tables left behind
    return result


def _replan_line(shape: Shape, was: Shape, fits: bool, pace: tuple[float, float], rungs: int, left: float,
                 budget: float) -> str:  # fmt: skip
    """What a re-plan did and why, in one line (said as it happens; the table's header keeps the last)."""
    startup, step = pace
    cost = startup + (was.warmup + was.steps) * step
    why = (f"{max(0.0, left):.0f} s of the {budget:g} s budget left for {rungs} rung{'s' * (rungs != 1)} at about "
           f"{cost:.0f} s each as last measured ({startup:.1f} s start-up, {step:.2f} s a step)")
    steps = f"{shape.warmup} + {shape.steps} steps, not {was.warmup} + {was.steps}" if shape != was else (
        f"{shape.warmup} + {shape.steps} steps")
    if not fits:
        return f"re-planned: {why}: the rest measure {steps}, the fewest; the ladder will outlast its budget"
    if shape.warmup + shape.steps < was.warmup + was.steps:
        return f"re-planned (behind the budget): {why}: the rest measure {steps}"
    return f"re-planned (back within the budget): {why}: the rest measure {steps}"


def _run_rung(
    r: RungResult, bench: BenchConfig, overrides: dict[str, Any], dataset: Dataset, run_dir: Path,
    result: LadderResult, warm_intervals: int, stop: threading.Event | None,
    on_step: Callable[[str, ev.Step], None] | None,
) -> None:  # fmt: skip
    config, ds = prepared(resolve(bench.preset, None, overrides), memory=False)
    control = Control()
    watcher = None
    if stop is not None:  # forward a stop request to this rung's trainer (the budget never stops a rung: replan)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                if stop.is_set():
                    control.stop()
                    return

        watcher = (threading.Thread(target=watch, daemon=True), done)
        watcher[0].start()
    try:
        timing, r.first_steps = time_compile_cache(
            bench.compile_cache, config, ds, run_dir, control, (lambda e: on_step(r.name, e)) if on_step else None
        )
    except OUT_OF_MEMORY:
        r.status, r.reason = "failed", out_of_memory(config)
        return
    except Exception as err:  # a missing kernel or compiler: record it, climb on
        line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        r.status, r.reason = "failed", f"{type(err).__name__}: {line}"[:300]
        return
    finally:
        if watcher is not None:
            watcher[1].set()
    if timing.reason == "stopped":
        r.status, r.reason = "skipped", "stopped during this rung"
        return
    settled = timing.settled(warm_intervals)
    median = statistics.median(settled)
    tok_s = config.tokens_per_step / median
    r.status = "ran"
    r.precision = timing.precision
    r.startup_s = timing.startup_s
    r.first_step_s = timing.step_times_s[0]
    r.median_step_s = median
    r.tokens_per_s = tok_s
    r.mfu = tok_s * timing.flops_per_token / timing.peak_flops if timing.peak_flops else None
    r.peak_mem_bytes = timing.mem_bytes
    r.data_time_s = statistics.median(timing.data_times_s[warm_intervals:] or timing.data_times_s[-1:])
    r.step_times_s = timing.step_times_s
    r.attention, r.attention_ms = timing.attention, timing.attention_ms
    r.contention = contention.combine(timing.contention[warm_intervals:] or timing.contention[-1:])  # settled's window
    result.device, result.device_name, result.n_params = timing.device, timing.device_name, timing.n_params


# ---------------------------------------------------------------- output


def _first_step(r: RungResult) -> str:
    if not r.first_steps:
        return f"{r.first_step_s:.2f}"
    def one(f: FirstStep) -> str:
        compiling = "" if f.compile_s is None else f" (compile {f.compile_s:.1f})"
        return f"{f.first_step_s:.2f} {f.cache}{compiling}"

    return ", ".join(one(f) for f in r.first_steps)


def table_rows(result: LadderResult) -> list[list[str]]:
    """The ladder as rows of strings (header first): shared by markdown, console and TUI."""
    rows = [["rung", "precision", "ms/step", "tok/s", "MFU", "peak mem", "vs baseline", "vs prev",
             "first step s", "startup s", "note"]]  # fmt: skip
    kernel = None  # the attention kernel is named on the rung where it changes (the flash rung)
    for r in result.rungs:
        if r.status != "ran":
            rows.append([r.label, "-", "-", "-", "-", "-", "-", "-", "-", "-", f"{r.status}: {r.reason}"])
            continue
        mfu = "unknown" if r.mfu is None else f"{100 * r.mfu:.1f}%"
        notes = [f"not applied: {n}" for n in r.notes]
        if r.steps is not None and (r.warmup, r.steps) != (result.warmup, result.steps):
            notes.append(f"{r.warmup} + {r.steps} steps (re-planned for the budget)")
        if r.attention != kernel and r.attention:
            notes.append(attention_text(r))
        kernel = r.attention
        rows.append([
            r.label, r.precision or "-", contention.marked(f"{1000 * r.median_step_s:.1f}", r.contention),
            f"{r.tokens_per_s:,.0f}", mfu,
            human(r.peak_mem_bytes), ratio_text(r.speedup_vs_baseline), ratio_text(r.speedup_vs_prev),
            _first_step(r), f"{r.startup_s:.2f}", "; ".join(notes),
        ])  # fmt: skip
    return rows


def header_lines(result: LadderResult) -> list[str]:
    params = "? params" if result.n_params is None else params_text(result.n_params, result.vocab_size)
    return [
        f"preset {result.preset} ({params}), "
        f"B={result.batch_size} T={result.block_size} x{result.grad_accum} = {result.tokens_per_step:,} tokens/step",
        f"device {result.device_name or result.device} ({result.device}), torch {result.torch_version}, "
        f"{result.date}, load average at start {result.load}",
        f"median of {result.steps} timed steps after {result.warmup} warm-up steps per rung "
        "(device-synchronized); 'first step' includes compilation; 'startup' is trainer start to first step done",
        *([f"shape: {result.shape_note}"] if result.shape_note else []),
        *([result.replan_note] if result.replan_note else []),
        *([busy] if (busy := contention.line([r.contention for r in result.rungs if r.status == "ran"], "rungs"))
          else []),
    ]


def markdown(header: list[str], command: str, rows: list[list[str]], first: str = "---") -> str:
    """A bench table as markdown: its header lines, the command, then the rows (a text first
    column unless `first` aligns it; the figures right-aligned; the note last, left)."""
    lines = [*(f"{h}  " for h in header), ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append(f"|{first}|---|" + "---:|" * (len(rows[0]) - 3) + "---|")
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


def to_markdown(result: LadderResult) -> str:
    return markdown(header_lines(result), result.command, table_rows(result))


def to_text(result: LadderResult) -> str:
    rows = table_rows(result)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]) - 1)]
    lines = list(header_lines(result)) + [""]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:-1], widths[1:])]
        lines.append("  ".join(cells) + (f"  {row[-1]}" if row[-1] else ""))
    return "\n".join(lines)


def save(result: LadderResult, out: Path) -> None:
    atomic_write_bytes(out / "ladder.json", json.dumps(result.model_dump(mode="json"), indent=1).encode())
    atomic_write_bytes(out / "ladder.md", to_markdown(result).encode())


def run(args: BenchOptions, command: str) -> int:
    """`gpt2-tui bench [--preset P]`: the ladder, printed and written to a new directory."""
    preset = args.preset or "nano"
    bench = BenchConfig(
        preset=preset, data=args.data, device=args.device,
        vocab_size=args.vocab_size or GPT2_VOCAB, batch_size=args.batch_size, block_size=args.block_size,
        grad_accum=args.grad_accum, steps=args.steps or 20, warmup=args.warmup,
        log_interval=args.log_interval or 1, skip=args.skip, compile_cache=args.compile_cache, budget_s=args.budget,
        fit_steps=args.steps is None,
    )  # fmt: skip
    out = args.out or default_out(preset)

    def progress(r: RungResult) -> None:
        if r.status == "ran":
            busy = contention_text(r.contention, short=True)
            speed = f"{1000 * (r.median_step_s or 0):.1f} ms/step ({ratio_text(r.speedup_vs_baseline)})"
            console.out.line(f"  {r.label}: {speed}" + (f"  {contention.MARK} {busy}" if busy else ""), flush=True)
        else:
            console.out.line(f"  {r.label}: {r.status} ({r.reason})", flush=True)

    console.out.line(f"speed ladder: preset {preset}, {bench.warmup} + {bench.steps} steps per rung "
                     f"-> {path_text(out)}", flush=True)  # fmt: skip
    result = run_ladder(bench, out, on_rung=progress, command=command,
                        say=lambda line: console.out.line(line, flush=True))  # fmt: skip
    console.out.line()
    console.out.line(to_text(result))
    console.out.line(f"\nwrote {path_text(out / 'ladder.md')} and {path_text(out / 'ladder.json')}")
    return 0

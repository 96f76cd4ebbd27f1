"""A segment's numbers: the step clock, the logged steps' readings (copied to the host behind
the work, read a step later: engine/train/readings.py), their step events, the compile
warm-up's cost once, the GPU sampler's readings and the settled summary at the end.

A component of the segment (engine/train/trainer.py): it says when a step is logged
(`every` = log_interval, and the last step). What it reads back of the guard's counters it
hands to the loop, which acts on bad steps. Under torchrun the same: a logged step's loss is
averaged over the ranks on the device, and its step times are gathered over the ranks when
its reading is read, a step later, by every rank at the same step (engine/train/readings.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine import events as ev
from engine.train import compiling, contention, distributed
from engine.train import guard as guards
from engine.train.build import Parts
from engine.train.flops import mfu
from engine.train.readings import Reading, Readings
from engine.train.state import Progress


class StepClock:
    """Times training steps only: pauses, evals and saves restart it."""

    def __init__(self) -> None:
        self.readings: Readings | None = None  # the logged steps in flight, timed by device events
        self.restart()

    def restart(self) -> None:
        """After an eval, a save, a pause: the next steps are timed from here."""
        self.mark()
        if self.readings is not None:
            self.readings.restart()

    def mark(self) -> None:
        """The steps counted so far went into a reading: count again from here."""
        self.steps, self.data_s, self.tokens = 0, 0.0, 0

    def count(self, tokens: int) -> None:
        """A step taken, with the tokens it trained on (all ranks'; fewer in a batch ramp)."""
        self.steps += 1
        self.tokens += tokens


class Reporting:
    """`emit` takes the events (rank 0's; the GPU sampler's thread emits through it too)."""

    def __init__(self, config: Any, run_dir: Path, emit: Callable[[Any], None], every: int) -> None:
        self.config, self.run_dir, self.emit, self.every = config, run_dir, emit, every
        self.clock = StepClock()
        self.dist = distributed.current()
        self.step_times: list[float] = []
        self.step_tokens: list[float] = []  # each step report's tokens a step (all ranks'), beside step_times
        self._timed: deque[float] = deque()  # each recorded interval's tokens a step, until its reading arrives
        self.gauge = contention.Gauge()  # each step event's window, read as it is emitted
        self.contention: list[ev.Contention] = []
        self._p: Parts | None = None
        self._sampler: Any = None

    def due(self, step: int, last: bool) -> bool:
        return step % self.every == 0 or last

    def start(self, p: Parts) -> None:
        """Once the parts are built: readings on their device."""
        self._p = p
        self.clock.readings = Readings(p.device)
        self.gauge.restart()

    def record(self, at: Progress, lr: float, loss: torch.Tensor | None = None, report: bool = True) -> None:
        """A step's numbers (its guard snapshot; a logged step's loss, under torchrun the mean
        over the ranks) and the time since the last record, copied to the host behind the work."""
        assert self._p is not None and self.clock.readings is not None
        c, values = self.clock, self._p.guard.snapshot()
        if report and loss is not None and self.dist.enabled:  # an all-reduce on the device: no host read
            values = torch.cat([values, distributed.mean_over_ranks(loss, self.dist).reshape(1).to(values.dtype)])
        c.readings.record(at.step, at.tokens, lr, values, c.steps, c.data_s, report)
        self._timed.append(c.tokens / max(1, c.steps))
        c.mark()

    def settle(self, at: Progress) -> list[guards.Reading]:
        """Before a save or a hand-over: the steps not yet recorded timed up to here (not after
        the save), and every reading read, so the checkpoint's train_time_s counts them all."""
        if self.clock.steps:
            self.record(at, 0.0, report=False)
        return self.ready(at, wait=True)

    def ready(self, at: Progress, wait: bool = False) -> list[guards.Reading]:
        """The earlier recorded steps whose numbers have arrived (all of them with `wait`; under
        torchrun those recorded before this step, on every rank alike): reported, their time
        counted; the guard's readings for the loop to act on."""
        assert self.clock.readings is not None
        before = at.step if self.dist.enabled else None
        return [self.arrived(r, at) for r in self.clock.readings.ready(wait, before)]

    def arrived(self, r: Reading, at: Progress) -> guards.Reading:
        """A recorded step's numbers: its step event if logged, the compile warm-up's cost once."""
        assert self._p is not None
        p = self._p
        reading = p.guard.take(r.values[:4], r.step)  # this step's loss, norm and the skipped-step counters
        tokens = self._timed.popleft()
        at.train_time_s += r.step_time_s * max(0, r.step - at.timed_to)  # the steps this reading timed
        at.timed_to = max(at.timed_to, r.step)
        if r.report:
            self._step_event(p, r.values[4] if len(r.values) > 4 else reading.loss, r, reading.norm, tokens)
        if p.warmup is not None:
            self._warmed_up(p, r.step)
        return reading

    def _step_event(self, p: Parts, loss: float, r: Reading, grad_norm: float, tokens: float) -> None:
        rank_times = distributed.gather_floats(r.step_time_s, self.dist)
        step_time = max(rank_times) if rank_times else r.step_time_s  # a step ends with its slowest rank
        self.step_times.append(step_time)
        self.step_tokens.append(tokens)
        self.contention.append(busy := self.gauge.read())
        W = self.dist.world_size
        tok_s = tokens / step_time
        mem = torch.cuda.max_memory_allocated(p.device) if p.device.type == "cuda" else None
        self.emit(ev.Step(step=r.step, loss=loss, lr=r.lr, grad_norm=grad_norm, step_time_s=step_time,
                          tokens_per_s=tok_s, mfu=mfu(tok_s / W, p.flops_token, p.peak), mem_bytes=mem,
                          tokens=r.tokens, data_time_s=r.data_time_s, rank_step_times=rank_times,
                          contention=busy))  # fmt: skip

    def _warmed_up(self, p: Parts, step: int) -> None:
        """After a compiled segment's first steps: what the compile cost, and (rank 0) what
        it built saved with the run, for its resume, its next toggle to compile, a new machine."""
        warmup, p.warmup = p.warmup, None
        assert warmup is not None
        compiled = warmup.read(step)
        self.emit(compiled)
        if not compiled.compiled:  # Dynamo gave up (recompile limit, a graph break everywhere): eager
            self.emit(ev.Warning_(message=f"compile is on but nothing was compiled by step {step}: this segment runs "
                                          "eager, at eager speed; restart the app or the run to compile again"))
        if not self.dist.is_main:
            return
        try:
            compiling.save_artifacts(self.run_dir, p.device_label)
        except OSError as err:  # a nicety: the run goes on without it
            self.emit(ev.Warning_(message=f"compile artifacts not saved in {self.run_dir} ({err.strerror or err})"))

    def summary(self) -> dict[str, Any]:
        """Settled speed: medians over the second half of the logged intervals (past compile)."""
        if not self.step_times or self._p is None:
            return {}
        p, W = self._p, self.dist.world_size
        settled = ev.settled_step_time(self.step_times)
        tok_s = ev.settled_step_time(self.step_tokens) / settled  # the full batch's, once a batch ramp is over
        return {
            "first_step_time_s": self.step_times[0],
            "median_step_time_s": settled,
            "tokens_per_s": tok_s,
            "mfu": mfu(tok_s / W, p.flops_token, p.peak),
            "peak_mem_bytes": torch.cuda.max_memory_allocated(p.device) if p.device.type == "cuda" else None,
            "contention": c.model_dump() if (c := contention.settled(self.contention)) else None,  # the same window
        }

    # ------------------------------------------------------------------ the GPU sampler

    def start_sampler(self) -> None:
        """NVML readings into the run's events (about 1 Hz): the dashboard's GPU tab, live or attached."""
        from engine import gpu_monitor

        p = self._p
        if p is None or not (self.dist.is_main and p.device.type == "cuda" and gpu_monitor.available()[0]):
            return
        self._sampler = gpu_monitor.GpuSampler(lambda samples: self.emit(ev.Gpu(gpus=samples)))
        self._sampler.start()

    def stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()


def locked(emit: Callable[[Any], None]) -> Callable[[Any], None]:
    """`emit` for a segment: rank 0's only, one event at a time (the GPU sampler's thread emits too)."""
    lock, dist = threading.Lock(), distributed.current()

    def one(event: Any) -> None:
        if dist.is_main:
            with lock:
                emit(event)

    return one

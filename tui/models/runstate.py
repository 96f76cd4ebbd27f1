"""What the dashboard knows about a run, built only from its events (no Textual here).

The same state is fed by a live in-process trainer or by tailing another process's
events.jsonl, so `attach` and a launch show exactly the same thing. Alerts are derived
here too: NaN/Inf loss, a loss spike, the grad norm pinned at the clip after warmup, data
loading taking over 10% of the step.

Phases no event marks are told by what the app did (`Building`, `note_stop`): the first
dataset build before the run starts, and a stop asked for until the run ends. The compile
warm-up is read from the events: compile on, and no step reported yet in this segment.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.api import events as ev
from engine.api import SegmentReader
from engine.api import describe

XAxis = Literal["step", "tokens", "time"]
X_AXES: tuple[XAxis, ...] = ("step", "tokens", "time")
EMA_BETA = 0.9
SPIKE_FACTOR = 1.5  # loss above this multiple of its EMA is a spike
GPU_ROUNDS = 3600  # an hour of GPU readings at 1 Hz
PINNED_STEPS = 10  # at least this many consecutive step reports at the clip, past warmup = pinned
PINNED_MAX = 100  # ... and as many as the warmup took, up to this many (the run's own time scale)
DATA_SHARE = 0.10  # data wait above this share of the step time is an alert


@dataclass
class Series:
    """One metric over the run, with all three possible x values per point."""

    step: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)

    def add(self, step: int, tokens: int, t: float, y: float) -> None:
        self.step.append(step)
        self.tokens.append(tokens)
        self.time.append(t)
        self.y.append(y)

    def xs(self, axis: XAxis) -> list[float]:
        return getattr(self, axis)

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class CheckpointRow:
    step: int
    path: str
    val_loss: float | None
    size_bytes: int
    time: float
    best: bool


@dataclass
class LogLine:
    time: float
    text: str
    level: Literal["info", "warning", "error"] = "info"


@dataclass
class Building:
    """Not an engine event: the app tells the state that the default dataset is being built
    (on: True; what it is doing and the fraction done, where known) or is ready (on: False),
    before the run itself starts."""

    on: bool
    what: str = ""
    fraction: float | None = None
    time: float = field(default_factory=time.time)


@dataclass
class Writer:
    """Not an engine event: whether a process still writes the run (its lock's holder,
    tui/session.py), looked at before the events were read, so a run that ended well has
    its run_finished read first. A live run whose writer is gone died without finishing."""

    alive: bool


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class RunState:
    """Accumulates events; `version` increases on every change so views redraw only then."""

    def __init__(self) -> None:
        self.version = 0
        self.started: ev.RunStarted | None = None
        self.finished: ev.RunFinished | None = None
        self.failed: ev.RunFailed | None = None
        self.paused = False
        self.t0: float | None = None
        self.paused_s = 0.0  # time spent paused (not counted in elapsed)
        self._paused_at: float | None = None  # when the pause in progress began
        self.step = 0
        self.mem_bytes: int | None = None  # device memory the run last reported (a live toggle's budget)
        self.tokens = 0
        self.last_event_time: float | None = None
        self.last_step: ev.Step | None = None
        self.series: dict[str, Series] = {
            k: Series() for k in ("loss", "ema", "lr", "grad_norm", "step_time", "tokens_per_s", "mfu", "mem")
        }
        self.val = Series()
        self.best_val_loss: float | None = None
        self.checkpoints: dict[int, CheckpointRow] = {}
        self.samples: list[tuple[int, str]] = []
        self.gpu_rounds: list[list[Any]] = []  # GpuSample rounds from `gpu` events, the last GPU_ROUNDS
        self.gpu_count = 0  # rounds ever fed (the GPU tab takes the ones it has not seen)
        self.log: list[LogLine] = []  # the last 500
        self.log_count = 0  # lines ever logged
        self.building_since: float | None = None  # the default dataset being built (no event says so)
        self.building_step: tuple[str, float | None] | None = None  # what the build is doing, how far
        self.stop_since: float | None = None  # a stop asked for from this app (no event says so)
        self.writer_lost = False  # no process writes the run any more (no event says so: Writer)
        self.pending_toggles: dict[str, dict[str, Any]] = {}  # request id -> switches: posted here, not yet acknowledged
        self.segment_steps = 0  # step reports since the last run_started
        self.segments = SegmentReader()  # the segment table and the charts' markers read it
        self.segment_events: list[ev.Segment] = []  # as they came (the dashboard toasts live toggles)
        self.tune_plan: ev.TunePlan | None = None  # the run's tuner (--tune): its plan, trials so far, end
        self.tune_trials: dict[int, ev.TuneTrial] = {}  # by index: the latest word on each
        self.tune_done: ev.TuneDone | None = None
        self._ema: float | None = None
        self._pinned = 0
        self._alerts_on: set[str] = set()

    # ----------------------------------------------------------------- derived

    @property
    def max_steps(self) -> int | None:
        return self.started.setting("train.max_steps") if self.started else None

    @property
    def grad_clip(self) -> float:
        clip = self.started.setting("optim.grad_clip", (int, float)) if self.started else None
        return float(clip or 0.0)

    @property
    def compiling(self) -> bool:
        """torch.compile's warm-up: compile on and no step reported yet in this segment."""
        return bool(self._setting("speed", "compile", False)) and self.segment_steps == 0

    @property
    def gone(self) -> bool:
        """Not over by its events, but no process writes it any more (kill -9, a crash)."""
        return self.live and self.writer_lost

    @property
    def state(self) -> str:
        """failed / completed / stopped once over; writer gone when it died without saying so;
        else stopping, building dataset, waiting, paused, compiling or running."""
        if self.failed:
            return "failed"
        if self.finished:
            return self.finished.reason
        if self.writer_lost:
            return "writer gone"
        if self.stop_since is not None:
            return "stopping"
        if self.started is None:
            return "building dataset" if self.building_since is not None else "waiting"
        if self.paused:
            return "paused"
        return "compiling" if self.compiling else "running"

    @property
    def live(self) -> bool:
        return self.failed is None and self.finished is None

    def phase_seconds(self, now: float | None = None) -> float | None:
        """How long the current long phase (building, stopping, compiling) has lasted."""
        state, now = self.state, now or time.time()
        since = {"building dataset": self.building_since, "stopping": self.stop_since,
                 "compiling": self.started.time if self.started else None}.get(state)  # fmt: skip
        return None if since is None else max(0.0, now - since)

    def resuming(self) -> None:
        """The run is being continued: no longer over, waiting for its next run_started."""
        self.started = self.finished = self.failed = self.stop_since = None
        self.paused = self.writer_lost = False
        self.version += 1

    def note_stop(self, t: float | None = None) -> None:
        """A stop was asked for (the run saves and ends: STOPPING until run_finished)."""
        if self.live and self.stop_since is None:
            self.stop_since = t or time.time()
            self.version += 1

    def note_toggle(self, request_id: str, switches: dict[str, Any]) -> None:
        """This app asked the run for these switches (a toggle request): pending until the run
        acknowledges the request (applied or dropped) in its events, or ends."""
        if self.live:
            self.pending_toggles[request_id] = dict(switches)
            self.version += 1

    def pending_switches(self) -> dict[str, Any]:
        """{dotted: value} asked for and not yet acknowledged (a later request's value wins)."""
        out: dict[str, Any] = {}
        for switches in self.pending_toggles.values():
            out |= switches
        return out

    def tune_status(self) -> str:
        """The status line's word on a tune: 'tuning: trial 3 of 7 (loss chunked)', or how it ended."""
        if self.tune_done is not None:
            gain = f" {self.tune_done.gain:.2f}x" if self.tune_done.gain else ""
            return f"tuned{gain}"
        if self.tune_plan is None or not self.tune_trials:
            return ""
        last = self.tune_trials[max(self.tune_trials)]
        return f"tuning: trial {last.index} of {last.of} ({last.label})"

    def settled_step_time(self) -> float | None:
        """The current segment's settled step time: the figure the Segments tab, the summary
        and `compare` give for it (one rule, engine.run.segments), not one across every segment;
        None where they say "too short to settle" (a toggled compile's first steps are not settled)."""
        times = self.segments.current_step_times()
        return ev.settled_step_time(times) if ev.settles(times) else None

    def contention(self) -> ev.Contention | None:
        """The machine's contention over the current segment's settled window (the window of
        settled_step_time: engine.run.segments)."""
        return self.segments.current_contention()

    def elapsed(self, now: float | None = None) -> float:
        """Time the run has been running: pauses, and the time between a stop and its resume, do not count."""
        if self.t0 is None:
            return 0.0
        end = (self.last_event_time if not self.live or self.writer_lost else (now or time.time())) or self.t0
        pausing = max(0.0, end - self._paused_at) if self._paused_at is not None else 0.0
        return max(0.0, end - self.t0 - self.paused_s - pausing)

    def _pause_ends(self, t: float | None) -> None:
        if self._paused_at is not None:
            self.paused_s += max(0.0, (t or self._paused_at) - self._paused_at)
            self._paused_at = None

    def eta(self) -> float | None:
        """Time left at the current segment's recent speed (the console's rule, engine.events.eta_seconds:
        a run that slows down says so within a few step reports)."""
        if not self.live or self.stop_since is not None or self.writer_lost:
            return None
        return ev.eta_seconds(self.segments.current_step_times(), self.step, self.max_steps)

    # ----------------------------------------------------------------- feeding

    def feed(self, e: Any) -> None:
        if isinstance(e, Writer):
            if self.writer_lost == e.alive:
                self.writer_lost = not e.alive
                self.version += 1
            return
        if isinstance(e, Building):
            self.building_since = (self.building_since or e.time) if e.on else None
            self.building_step = (e.what, e.fraction) if e.on else None
            self.version += 1
            return
        if isinstance(e, ev.Gpu):  # not a change of the run's charts: no version bump, no redraw
            self.gpu_rounds.append(e.gpus)
            self.gpu_count += 1
            del self.gpu_rounds[:-GPU_ROUNDS]
            return
        self.version += 1
        self.last_event_time = getattr(e, "time", None)
        self.segments.feed(e)
        match e:
            case ev.RunStarted():
                self._pause_ends(e.time)
                self.started, self.finished, self.failed, self.paused = e, None, None, False
                self.building_since, self.building_step, self.segment_steps, self._pinned = None, None, 0, 0
                self.t0 = self.t0 or e.time
                self.step = e.start_step
                self._log(describe(e), e.time)
            case ev.Step():
                self._on_step(e)
            case ev.Eval():
                self.val.add(e.step, self.tokens, self._rel(e.time), e.val_loss)
                if _finite(e.val_loss) and (self.best_val_loss is None or e.val_loss < self.best_val_loss):
                    self.best_val_loss = e.val_loss
                self._log(describe(e), e.time)
            case ev.Checkpoint():
                if e.best:
                    for row in self.checkpoints.values():
                        row.best = False
                self.checkpoints[e.step] = CheckpointRow(e.step, e.path, e.val_loss, e.size_bytes, e.time, e.best)
                self._log(describe(e), e.time)
            case ev.Sample():
                self.samples.append((e.step, e.text))
                del self.samples[:-20]
            case ev.Warning_():
                self._log(describe(e), e.time, "warning")
            case ev.Segment():
                self.segment_events.append(e)
                if line := describe(e):
                    self._log(line, e.time)
            case ev.TunePlan():
                self.tune_plan, self.tune_trials, self.tune_done = e, {}, None
                self._log(describe(e), e.time)
            case ev.TuneTrial():
                self.tune_trials[e.index] = e
                self._log(describe(e), e.time)
            case ev.TuneDone():
                self.tune_done = e
                self._log(describe(e), e.time)
            case ev.Paused():
                self.paused = True
                if self._paused_at is None:
                    self._paused_at = e.time
                self._log(describe(e), e.time)
            case ev.Resumed():
                self.paused = False
                self._pause_ends(e.time)
                self._log(describe(e), e.time)
            case ev.RequestAck():
                self.pending_toggles.pop(e.id, None)
            case ev.RunFinished():
                self.pending_toggles.clear()
                self.finished, self.paused = e, False
                self._pause_ends(e.time)
                self._paused_at = e.time  # until a resume's run_started: a stopped run's time is not elapsed
                self.step = e.step
                self._log(describe(e).splitlines()[0], e.time)
            case ev.RunFailed():
                self.pending_toggles.clear()
                self.failed = e
                self._pause_ends(e.time)
                self._paused_at = e.time
                self._log(describe(e), e.time, "error")

    def gpu_since(self, seen: int) -> list[list[Any]]:
        """The GPU rounds fed after the first `seen` (as many as are still kept)."""
        new = min(self.gpu_count - seen, len(self.gpu_rounds))
        return self.gpu_rounds[len(self.gpu_rounds) - new :] if new > 0 else []

    def _rel(self, t: float) -> float:
        return t - self.t0 if self.t0 is not None else 0.0

    def _log(self, text: str, t: float | None = None, level: Literal["info", "warning", "error"] = "info") -> None:
        self.log.append(LogLine(t or time.time(), text, level))
        self.log_count += 1
        del self.log[:-500]

    def _on_step(self, e: ev.Step) -> None:
        self.step, self.tokens, self.last_step = e.step, e.tokens, e
        self.segment_steps += 1
        t = self._rel(e.time)
        s = self.series

        def add(name: str, y: float | None) -> None:
            if y is not None:
                s[name].add(e.step, e.tokens, t, y)

        add("loss", e.loss if math.isfinite(e.loss) else None)
        if math.isfinite(e.loss):
            self._ema = e.loss if self._ema is None else EMA_BETA * self._ema + (1 - EMA_BETA) * e.loss
            add("ema", self._ema)
        add("lr", e.lr)
        add("grad_norm", e.grad_norm if math.isfinite(e.grad_norm) else None)
        add("step_time", e.step_time_s)
        add("tokens_per_s", e.tokens_per_s)
        add("mfu", None if e.mfu is None else 100 * e.mfu)
        add("mem", None if e.mem_bytes is None else e.mem_bytes / 2**30)
        if e.mem_bytes is not None:
            self.mem_bytes = e.mem_bytes
        self._check_alerts(e)

    def _alert(self, key: str, on: bool, text: str, t: float) -> None:
        """Log an alert when its condition starts; re-arm it once the condition clears."""
        if on and key not in self._alerts_on:
            self._alerts_on.add(key)
            self._log(f"ALERT {text}", t, "warning")
        elif not on:
            self._alerts_on.discard(key)

    def _check_alerts(self, e: ev.Step) -> None:
        bad = not (math.isfinite(e.loss) and math.isfinite(e.grad_norm))
        self._alert("nan", bad, f"step {e.step}: NaN/Inf loss or grad norm (loss {e.loss}, norm {e.grad_norm})", e.time)
        ema = self._ema
        spike = math.isfinite(e.loss) and ema is not None and len(self.series["loss"]) > 10 and e.loss > SPIKE_FACTOR * ema
        self._alert("spike", spike, f"step {e.step}: loss spike {e.loss:.3f} vs EMA {ema or 0:.3f}", e.time)
        # early in training (warmup, and just after) the norm sits near the clip on healthy
        # runs: only a streak past warmup, as long as the warmup itself, says the lr is too high
        clip, need = self.grad_clip, self._pinned_reports()
        past_warmup = e.step > self._setting("optim", "warmup_steps", 0)
        self._pinned = self._pinned + 1 if clip > 0 and past_warmup and e.grad_norm >= clip else 0
        self._alert(
            "pinned", self._pinned >= need,
            f"step {e.step}: grad norm at the clip ({clip}) for {need} reports after warmup: lr may be too high", e.time,
        )  # fmt: skip
        share = e.data_time_s / e.step_time_s if e.step_time_s > 0 else 0.0
        unpinned = bool(self.started and self.started.device.startswith("cuda")
                        and not self._setting("data", "pin_memory", True))  # fmt: skip
        # unpinned, .to(device) waits for the GPU to finish the step before: that wait lands in data time
        why = ("; pinned memory is off, so this includes GPU time: the copy to the GPU waits for the step "
               "before it (try --pin-memory to measure it right)" if unpinned else self._data_advice())  # fmt: skip
        self._alert(
            "data", share > DATA_SHARE, f"step {e.step}: data loading is {100 * share:.0f}% of the step time{why}", e.time,
        )  # fmt: skip

    def _data_advice(self) -> str:
        """What may help a data stall on this run: only switches that are off and do something
        on its device (preload: always; prefetch: only with an accelerator, on CPU the batch is
        built inline whatever it says)."""
        accel = bool(self.started and not self.started.device.startswith("cpu"))
        flags = [f for f, off in (("--preload", not self._setting("data", "preload", True)),
                                  ("--prefetch", accel and not self._setting("data", "prefetch", True))) if off]  # fmt: skip
        if flags:
            return f" (try {'/'.join(flags)})"
        return " (preload is on" + ("" if accel else "; prefetch does nothing on CPU") + \
            ": the batch itself is the cost; vectorized batching, or a larger model per token, shrinks its share)"

    def _setting(self, section: str, key: str, default: Any) -> Any:
        """The run's setting, or `default` when its run_started line lacks it (RunStarted.setting)."""
        kind = type(default) if default is not None else int
        value = self.started.setting(f"{section}.{key}", kind) if self.started else None
        return default if value is None else value

    def _pinned_reports(self) -> int:
        warmup = self._setting("optim", "warmup_steps", 0) // max(1, self._setting("train", "log_interval", 1))
        return min(PINNED_MAX, max(PINNED_STEPS, warmup))

    # ----------------------------------------------------------------- checkpoints

    def next_checkpoint(self) -> int | None:
        """The step at which the next periodic checkpoint is due (None once the run is over)."""
        every, total = self._setting("train", "ckpt_interval", None), self.max_steps
        if not every or total is None or not self.live:
            return None
        return min(total, (self.step // every + 1) * every)

    def checkpoint_rows(self) -> list[tuple[CheckpointRow, bool]]:
        """Rows whose file is still on disk (keep-last deletes old ones), newest first,
        each with whether it is the latest."""
        rows = [r for r in self.checkpoints.values() if r.best or Path(r.path).exists()]
        rows.sort(key=lambda r: r.step, reverse=True)
        latest = rows[0].step if rows else None
        return [(r, r.step == latest) for r in rows]

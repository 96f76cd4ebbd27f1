"""Typed events a run emits, and the sinks that carry them.

Every run writes them to `events.jsonl` in its run directory (one JSON object per line,
with an "event" key); the same events go to the console for headless runs and to a
queue or callback for the TUI. `read_events` parses a run's file back, for `attach`.
"""

from __future__ import annotations

import queue
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Protocol, TextIO, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.gpu_monitor import GpuSample


class _Event(BaseModel):
    # NaN/Inf losses are written as NaN/Infinity (which json and pydantic read back), not as
    # null, which would make the very step that diverged an unreadable line
    model_config = ConfigDict(ser_json_inf_nan="constants")

    time: float = Field(default_factory=time.time)


class RunStarted(_Event):
    event: Literal["run_started"] = "run_started"
    config: dict[str, Any]
    n_params: int
    device: str
    device_name: str
    precision: str  # what "auto" resolved to on this device
    start_step: int = 0
    flops_per_token: int
    peak_flops: float | None = None
    dataset: dict[str, Any] = {}
    world_size: int = 1  # processes training together (torchrun); 1 alone
    parallel: str | None = None  # "ddp" or "fsdp" when world_size > 1


class Step(_Event):
    event: Literal["step"] = "step"
    step: int  # optimizer steps completed
    loss: float  # mean train loss over the step's micro-batches
    lr: float
    grad_norm: float  # global norm before clipping
    step_time_s: float  # device-synchronized, averaged over the steps since the last event
    tokens_per_s: float
    mfu: float | None  # None: the device's peak is unknown
    mem_bytes: int | None  # peak allocated device memory; None on CPU
    tokens: int  # tokens seen so far
    data_time_s: float = 0.0  # of step_time_s, host time spent waiting for batches
    rank_step_times: list[float] | None = None  # under torchrun: each rank's step time, by rank


class Eval(_Event):
    event: Literal["eval"] = "eval"
    step: int
    val_loss: float


class Checkpoint(_Event):
    event: Literal["checkpoint"] = "checkpoint"
    step: int
    path: str
    val_loss: float | None
    best: bool = False
    size_bytes: int = 0


class Warning_(_Event):
    event: Literal["warning"] = "warning"
    message: str


class RunFinished(_Event):
    event: Literal["run_finished"] = "run_finished"
    step: int
    reason: Literal["completed", "stopped"] = "completed"
    best_val_loss: float | None = None
    summary: dict[str, Any] = {}


class RunFailed(_Event):
    event: Literal["run_failed"] = "run_failed"
    step: int | None = None
    error: str


class Sample(_Event):
    """A short generation from the model at an eval, for the dashboard's sample panel."""

    event: Literal["sample"] = "sample"
    step: int
    text: str


class Paused(_Event):
    event: Literal["paused"] = "paused"
    step: int


class Resumed(_Event):
    event: Literal["resumed"] = "resumed"
    step: int


class Gpu(_Event):
    """One round of GPU readings (engine.gpu_monitor, about 1 Hz): for the dashboard's GPU tab."""

    event: Literal["gpu"] = "gpu"
    gpus: list[GpuSample]  # one per visible GPU


class RequestAck(_Event):
    """A request to the run (engine.control) was applied or dropped, and why (dropped ones)."""

    event: Literal["request"] = "request"
    id: str
    kind: str  # pause, resume, save, stop, toggle; "?" for a line that was no request
    status: Literal["applied", "dropped"]
    step: int
    reason: str = ""


SegmentReason = Literal["start", "resume", "toggle", "oom"]


class Segment(_Event):
    """From `step` on, the run trains with these speed switches (engine.segments): emitted
    right after run_started, and on a live toggle or an OOM fallback."""

    event: Literal["segment"] = "segment"
    step: int
    switches: dict[str, Any]  # dotted name -> value, engine.segments.SWITCHES
    changed: dict[str, list[Any]]  # dotted name -> [old, new], against the previous segment
    reason: SegmentReason


Event = Annotated[
    Union[RunStarted, Step, Eval, Checkpoint, Warning_, RunFinished, RunFailed, Sample, Paused, Resumed, Gpu, Segment,
          RequestAck],
    Field(discriminator="event"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str) -> Event:
    return _adapter.validate_json(line)


def read_events(path: Path) -> tuple[list[Event], list[str]]:
    """All events of an events.jsonl, and a warning for each line that is torn or unknown."""
    events, problems = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                events.append(parse_event(line))
            except ValidationError:
                problems.append(f"{path}:{n}: skipped an unreadable line")
    return events, problems


# ------------------------------------------------------------------------------ sinks


class Sink(Protocol):
    def emit(self, event: _Event) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends one line per event in one unbuffered write, so `attach` sees it at once.

    A write that fails (disk full) drops that line and the run goes on: the run matters more
    than its log, and the checkpoint code warns about the full disk on the other sinks.
    """

    def __init__(self, path: Path):
        self._f = open(path, "ab", buffering=0)
        self.dropped = 0
        if self._f.tell():
            with open(path, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
            if torn:
                self._write(b"\n")  # a kill -9 tore the last line: end it, so the next event stays whole

    def _write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError:
            self.dropped += 1

    def emit(self, event: _Event) -> None:
        self._write((event.model_dump_json() + "\n").encode())

    def close(self) -> None:
        self._f.close()


class QueueSink:
    """Hands events to another thread (the TUI) without ever blocking the trainer."""

    def __init__(self, q: queue.Queue | None = None):
        self.queue: queue.Queue = q if q is not None else queue.Queue()

    def emit(self, event: _Event) -> None:
        self.queue.put_nowait(event)

    def close(self) -> None:
        pass


class CallbackSink:
    def __init__(self, fn: Callable[[Any], None]):
        self._fn = fn

    def emit(self, event: _Event) -> None:
        self._fn(event)

    def close(self) -> None:
        pass


def settled_step_time(times: list[float]) -> float | None:
    """Median over the second half of the step reports: past the compile warm-up."""
    return statistics.median(times[len(times) // 2 :]) if times else None


ETA_MIN_REPORTS = 3  # the first report carries the warm-up (compile); from the third, the settled median skips it


def eta_seconds(times: list[float], step: int, max_steps: int | None) -> float | None:
    """Time left to max_steps at the settled step time; None until there is a basis for it."""
    if max_steps is None or len(times) < ETA_MIN_REPORTS:
        return None
    return max(0, max_steps - step) * settled_step_time(times)  # type: ignore[operator]


def duration_text(seconds: float) -> str:
    """'42s', '12m34s', '1h02m': short enough for a log line."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def printable(text: str) -> str:
    """Model output may hold control characters (ESC, CR, C1, bidi overrides); a terminal must
    never receive them raw: each becomes a middle dot. Newlines and tabs stay."""
    return "".join(c if c.isprintable() or c in "\n\t" else "\u00b7" for c in text.replace("\r\n", "\n"))


SAMPLE_LINES, SAMPLE_CHARS = 6, 400  # a console sample: a glance at the model, not a page


def sample_text(text: str, indent: str = "    ") -> str:
    """A sample for a log: made safe, its first lines only, indented under its header."""
    safe = printable(text).rstrip()
    head = safe[:SAMPLE_CHARS].split("\n")[:SAMPLE_LINES]
    lines = [indent + line.rstrip() for line in head] if safe else [indent + "(empty)"]
    if len("\n".join(head)) < len(safe):
        lines.append(indent + "...")
    return "\n".join(lines)


def short(name: str) -> str:
    """'speed.compile' -> 'compile': the sections are noise in a table or a log line."""
    return name.rsplit(".", 1)[-1]


def value_text(v: Any) -> str:
    """A switch's value as people say it: on/off, auto for None."""
    return {True: "on", False: "off", None: "auto"}[v] if isinstance(v, (bool, type(None))) else str(v)


def change_text(diff: dict[str, list[Any]]) -> str:
    """'compile off -> on, prefetch on -> off' (empty when nothing changed)."""
    return ", ".join(f"{short(n)} {value_text(a)} -> {value_text(b)}" for n, (a, b) in diff.items())


def describe(e: _Event, max_steps: int | None = None, eta: float | None = None) -> str:
    """The human-readable text of an event: the console's, the dashboard log's, `attach`'s.
    One line, except a run's end (its settled speed follows) and a sample (its text follows,
    indented; the dashboard draws samples in a panel of their own). `eta`: seconds to the
    end, for a step line (eta_seconds)."""
    from engine.memory import human

    match e:
        case RunStarted():
            t = e.config["train"]
            return (
                f"run started: {e.n_params / 1e6:.2f}M parameters on {e.device_name} ({e.device}, {e.precision}), "
                f"{t['batch_size']}x{t['grad_accum']}x{t.get('block_size')} tokens/step, from step {e.start_step}"
            ) + (f", {e.world_size} processes ({e.parallel})" if e.world_size > 1 else "")
        case Step():
            mfu = "-" if e.mfu is None else f"{100 * e.mfu:.1f}%"
            return (
                f"step {e.step:>6}/{max_steps} | loss {e.loss:.4f} | lr {e.lr:.2e} | "
                f"norm {e.grad_norm:.3f} | {1000 * e.step_time_s:.1f} ms | "
                f"{e.tokens_per_s:,.0f} tok/s | mfu {mfu} | mem {human(e.mem_bytes)}"
            ) + (f" | eta {duration_text(eta)}" if eta else "")
        case Eval():
            return f"eval step {e.step}: val loss {e.val_loss:.4f}"
        case Checkpoint():
            return f"checkpoint step {e.step}: {e.path}{' (best)' if e.best else ''}"
        case Warning_():
            return f"warning: {e.message}"
        case RunFinished():
            best = "-" if e.best_val_loss is None else f"{e.best_val_loss:.4f}"
            line = f"run {e.reason} at step {e.step}; best val loss {best}"
            s = e.summary
            if s:
                mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
                line += (
                    f"\nsettled speed: {1000 * s['median_step_time_s']:.1f} ms/step, "
                    f"{s['tokens_per_s']:,.0f} tok/s, mfu {mfu}, peak mem "
                    f"{human(s.get('peak_mem_bytes'))} (first step {s['first_step_time_s']:.2f} s)"
                )
            return line
        case RunFailed():
            return f"run failed at step {e.step}: {e.error}"
        case Paused():
            return f"paused at step {e.step}"
        case Resumed():
            return f"resumed at step {e.step}"
        case RequestAck():
            why = f": {e.reason}" if e.reason else ""
            return f"request {e.id} ({e.kind}) {e.status} at step {e.step}{why}"
        case Segment():
            if e.reason == "start":
                return ""  # run_started already said it all
            return f"segment from step {e.step}: {change_text(e.changed) or 'switches unchanged'} ({e.reason})"
        case Sample():
            return f"sample at step {e.step}:\n{sample_text(e.text)}"
        case Gpu():
            return ""  # a reading a second: the GPU tab draws them, the log and console do not
    return ""


class ConsoleSink:
    """Each event's text (describe), for headless runs and logs; step lines carry an ETA from
    the step times of the current segment (a toggle changes the speed, so it starts afresh)."""

    def __init__(self, stream: TextIO | None = None):
        self._out = stream or sys.stdout
        self._max_steps: int | None = None
        self._times: list[float] = []

    def emit(self, event: _Event) -> None:
        eta = None
        if isinstance(event, RunStarted):
            self._max_steps = event.config["train"]["max_steps"]
            self._times = []
        elif isinstance(event, Segment) and event.reason != "start":
            self._times = []
        elif isinstance(event, Step):
            self._times.append(event.step_time_s)
            eta = eta_seconds(self._times, event.step, self._max_steps)
        line = describe(event, self._max_steps, eta)
        if line:
            print(line, file=self._out, flush=True)

    def close(self) -> None:
        pass

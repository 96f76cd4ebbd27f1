"""Typed events a run emits, and the sinks that carry them.

Every run writes them to `events.jsonl` in its run directory (one JSON object per line,
with an "event" key); the same events go to the console for headless runs and to a
queue or callback for the TUI. `read_events` parses a run's file back, for `attach`.
"""

from __future__ import annotations

import queue
import statistics
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Protocol, TextIO, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine import files as runfiles, text
from engine.console import Console, out as console_out
from engine.errors import UserError
from engine.gpu_monitor import GpuSample


class _Event(BaseModel):
    # NaN/Inf losses are written as NaN/Infinity (which json and pydantic read back), not as
    # null, which would make the very step that diverged an unreadable line
    model_config = ConfigDict(ser_json_inf_nan="constants")

    time: float = Field(default_factory=time.time)


class _AtStep(_Event):
    step: int  # optimizer steps completed when it happened


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
    init_from: str | None = None  # this start loaded pretrained weights (--init-from: gpt2, or a directory)

    def setting(self, dotted: str, kind: type | tuple[type, ...] = int) -> Any:
        """One value of the run's config by dotted name ("train.max_steps"), or None when the
        line lacks it or holds another type: events.jsonl is a file anyone may edit, so no
        reader indexes `config` directly (a hand-written line must not crash a screen)."""
        value: Any = self.config
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            return None  # JSON true is no step count
        return value if isinstance(value, kind) else None


class Step(_AtStep):
    event: Literal["step"] = "step"
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


class Eval(_AtStep):
    event: Literal["eval"] = "eval"
    val_loss: float


class Checkpoint(_AtStep):
    event: Literal["checkpoint"] = "checkpoint"
    path: str
    val_loss: float | None
    best: bool = False
    size_bytes: int = 0


class Warning_(_Event):
    event: Literal["warning"] = "warning"
    message: str


class RunFinished(_AtStep):
    event: Literal["run_finished"] = "run_finished"
    reason: Literal["completed", "stopped"] = "completed"
    best_val_loss: float | None = None
    summary: dict[str, Any] = {}


class RunFailed(_Event):
    event: Literal["run_failed"] = "run_failed"
    step: int | None = None
    error: str


class Sample(_AtStep):
    """A short generation from the model at an eval, for the dashboard's sample panel."""

    event: Literal["sample"] = "sample"
    text: str


class Paused(_AtStep):
    event: Literal["paused"] = "paused"


class Resumed(_AtStep):
    event: Literal["resumed"] = "resumed"


class Gpu(_Event):
    """One round of GPU readings (engine.gpu_monitor, about 1 Hz): for the dashboard's GPU tab."""

    event: Literal["gpu"] = "gpu"
    gpus: list[GpuSample]  # one per visible GPU


class RequestAck(_AtStep):
    """A request to the run (engine.run.requests) was applied or dropped, and why (dropped ones)."""

    event: Literal["request"] = "request"
    id: str
    kind: str  # pause, resume, save, stop, toggle; "?" for a line that was no request
    status: Literal["applied", "dropped"]
    reason: str = ""


SegmentReason = Literal["start", "resume", "toggle", "oom"]


class Segment(_AtStep):
    """From `step` on, the run trains with these speed switches (engine.run.segments): emitted
    right after run_started, and on a live toggle or an OOM fallback."""

    event: Literal["segment"] = "segment"
    switches: dict[str, Any]  # dotted name -> value, engine.run.segments.SWITCHES
    changed: dict[str, list[Any]]  # dotted name -> [old, new], against the previous segment
    reason: SegmentReason
    init_from: str | None = None  # the segment began from these pretrained weights (a new run's first)


class Compiled(_AtStep):
    """A compiled segment's warm-up, read from torch's own counters after its first steps
    (engine.train.compiling.Warmup): how long compiling took and where the code came from."""

    event: Literal["compiled"] = "compiled"
    scope: str  # speed.compile_scope: model | blocks
    compiled: bool  # Dynamo captured a graph this segment; False: it ran eager (e.g. the recompile limit)
    graphs: int  # graphs Dynamo captured this segment
    compile_s: float  # seconds torch spent compiling (forward and backward, eval's graph included)
    source: Literal["cold", "warm disk", "run artifacts"]  # any cache miss: cold
    cache_hits: int  # inductor FX graph + AOTAutograd cache hits this segment
    cache_misses: int


Event = Annotated[
    Union[RunStarted, Step, Eval, Checkpoint, Warning_, RunFinished, RunFailed, Sample, Paused, Resumed, Gpu, Segment,
          RequestAck, Compiled],
    Field(discriminator="event"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str | bytes) -> Event:
    return _adapter.validate_json(line)


class EventLines:
    """The one reading of an events.jsonl's lines as typed events (read_events, attach's tail,
    `runs`): a torn, garbage, unknown, too deeply nested (pydantic-core's recursion limit) or
    not-UTF-8 line is skipped and counted in `problems`, never raised."""

    def __init__(self, source: Path | str) -> None:
        self.source, self.line = source, 0
        self.problems: list[str] = []

    def parse(self, raw: bytes) -> Event | None:
        self.line += 1
        if not raw.strip():
            return None
        try:
            return _adapter.validate_json(raw)
        except (ValidationError, ValueError, RecursionError, MemoryError):
            self.problems.append(f"{self.source}:{self.line}: skipped an unreadable line")
            return None

    def read(self, lines: Iterable[bytes]) -> list[Event]:
        return [e for e in map(self.parse, lines) if e is not None]


EVENTS_CAP = 16 << 30  # a log larger than this is not a run's (1M steps is ~0.3 GB)


def read_events(path: Path) -> tuple[list[Event], list[str]]:
    """All events of an events.jsonl, and a warning for each line that is torn or unknown."""
    reader = EventLines(path)
    with runfiles.open_log(path, EVENTS_CAP) as f:  # a regular file, never a link or a FIFO
        return reader.read(f), reader.problems


# ------------------------------------------------------------------------------ sinks


class Sink(Protocol):
    def emit(self, event: _Event) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends one line per event in one unbuffered write, so `attach` sees it at once: whole
    lines or none (engine.files.AppendLog), never through a link.

    A write that fails (disk full) drops that line and the run goes on: the run matters more
    than its log, and the checkpoint code warns about the full disk on the other sinks. A log
    moved or deleted under the run (rotation, cleanup) is re-created at its path.
    """

    def __init__(self, path: Path):
        self._log = runfiles.AppendLog(path)

    @property
    def dropped(self) -> int:
        return self._log.dropped

    def emit(self, event: _Event) -> None:
        if self._log.moved():
            try:
                self._log.reopen()
            except (OSError, UserError):
                pass  # the directory is gone or hostile: the write below counts the drop
        self._log.write((event.model_dump_json() + "\n").encode())

    def close(self) -> None:
        self._log.close()


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


class ConsoleSink:
    """Each event's text (describe), for headless runs and logs; step lines carry an ETA from
    the step times of the current segment (a toggle changes the speed, so it starts afresh)."""

    def __init__(self, stream: TextIO | None = None):
        self._out = Console(stream) if stream is not None else console_out  # the one terminal boundary
        self._max_steps: int | None = None
        self._times: list[float] = []

    def emit(self, event: _Event) -> None:
        eta = None
        if isinstance(event, RunStarted):
            self._max_steps = event.setting("train.max_steps")
            self._times = []
        elif isinstance(event, Segment) and event.reason != "start":
            self._times = []
        elif isinstance(event, Step):
            self._times.append(event.step_time_s)
            eta = eta_seconds(self._times, event.step, self._max_steps)
        line = text.describe(event, self._max_steps, eta)
        if line:
            self._out.line(line, flush=True)

    def close(self) -> None:
        pass

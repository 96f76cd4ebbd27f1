"""Typed events a run emits, and the sinks that carry them.

Every run writes them to `events.jsonl` in its run directory (one JSON object per line,
with an "event" key); the same events go to the console for headless runs and to a
queue or callback for the TUI. `read_events` parses a run's file back, for `attach`.
"""

from __future__ import annotations

import math
import queue
import statistics
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Protocol, TextIO, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from engine import files, text
from engine.console import Console, out as console_out
from engine.errors import UserError
from engine.gpu_monitor import GpuSample


# ------------------------------------------------------------------------------ numbers
# The one reading of a run's numbers (docs/reliability.md): each numeric field below declares its
# range with one of these types, so a line holding 10**400 tokens, an infinite time or a NaN step
# time fails validation and is skipped like a torn line (EventLines): no reader computes with it.
# Constructing an event checks the same rule, so what a run writes reads back. Free-form parts
# (config, dataset, summary, switches, GPU readings) hold only int64s and finite floats (`Plain`):
# a config may set --lr 1e30 (the guard stops that run in words), and its events must still be written.
INT_MAX = 2**63 - 1  # int64: what torch and numpy hold; float() of it is finite, str() of it short
FIGURE_MAX = 1e18  # seconds, rates, ratios: a figure times a figure or a count stays finite
TIME_MAX = 1e11  # a time.time() (year 5138): datetime and time.localtime show it

Count = Annotated[int, Field(ge=0, le=INT_MAX)]  # steps, tokens, bytes, FLOPs, parameters, graphs
Measure = Annotated[float, Field(ge=0, le=FIGURE_MAX, allow_inf_nan=False)]  # seconds, ms, tokens/s: >= 0
Figure = Annotated[float, Field(ge=-FIGURE_MAX, le=FIGURE_MAX, allow_inf_nan=False)]  # MFU, FLOP/s
Finite = Annotated[float, Field(allow_inf_nan=False)]  # a setting's value as it ran (lr): the config bounds it
Timestamp = Annotated[float, Field(ge=0, le=TIME_MAX, allow_inf_nan=False)]  # seconds since the epoch
# a loss or grad norm: NaN/Inf is what a diverged step measured, written as NaN/Infinity and read back
# (readers check math.isfinite); only here may a number be non-finite
Loss = Annotated[float, Field(allow_inf_nan=True)]


def _plain_numbers(value: Any) -> Any:
    """A free-form value whose every number is an int64 or a finite float (else ValueError)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(v, BaseModel):
            todo.extend(v.__dict__.values())
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError("a number out of range")
        elif isinstance(v, int) and not -INT_MAX - 1 <= v <= INT_MAX:
            raise ValueError("a number out of range")
    return value


Plain = AfterValidator(_plain_numbers)  # on a free-form field: Annotated[dict[str, Any], Plain]
_STRICT = ConfigDict(strict=True)
_adapters: dict[int, TypeAdapter[Any]] = {}


def bounded(kind: Any, value: Any) -> Any:
    """`value` read by one of the types above (Timestamp, Count...) from a JSON number that is
    not a bool, or None when it is none or out of range: the rule for numbers read elsewhere
    (the mailbox). `kind` Plain: any JSON value whose numbers fit."""
    if kind is Plain:
        try:
            return _plain_numbers(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    adapter = _adapters.get(id(kind))
    if adapter is None:
        adapter = _adapters[id(kind)] = TypeAdapter(kind, config=_STRICT)
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return None


def or_unknown(kind: Any, unknown: Any = None) -> BeforeValidator:
    """A detail an event carries (a peak FLOP/s, the machine's load, a kernel's timing) read by
    `kind`, or `unknown` where it is out of range or malformed: one bad detail never drops the
    event it rides in (a run_started lost to a NaN timing would hide the whole run)."""
    adapter = TypeAdapter(kind)

    def read(value: Any) -> Any:
        try:
            return adapter.validate_python(value)
        except ValidationError:
            return unknown

    return BeforeValidator(read)


def _timings(value: Any) -> dict[str, float | None]:
    """Kernel timings by name, each read as a Measure or None (cannot run, or out of range)."""
    if not isinstance(value, dict):
        return {}
    return {text.printable(str(k))[:64]: bounded(Measure, v) for k, v in list(value.items())[:32]}


class _Event(BaseModel):
    # NaN/Inf losses are written as NaN/Infinity (which json and pydantic read back), not as
    # null, which would make the very step that diverged an unreadable line
    model_config = ConfigDict(ser_json_inf_nan="constants")

    time: Timestamp = Field(default_factory=time.time)


class _AtStep(_Event):
    step: Count  # optimizer steps completed when it happened


class Contention(BaseModel):
    """How much of the machine a timed window had (engine/train/contention.py measures and judges
    it): a timing taken on a busy machine says so."""

    load: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None  # 1-minute load average
    cores: Annotated[int, Field(ge=1, le=1 << 24)] = 1  # the CPUs this process may run on
    cpu: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None  # CPU s per wall s; None: no window
    # of the time its threads wanted a CPU, the share spent waiting for one; None: not measured here
    stolen: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    contended: bool = False  # the rule's verdict (engine/train/contention.py)


# An event's details (or_unknown): a value out of range or of the wrong type reads as unknown
_PeakValue = Annotated[float, Field(gt=0, le=FIGURE_MAX, allow_inf_nan=False)] | None  # > 0: MFU divides by it
Peak = Annotated[_PeakValue, or_unknown(_PeakValue)]
Description = Annotated[dict[str, Any], Plain, or_unknown(Annotated[dict[str, Any], Plain], {})]  # {} if unreadable
Detail = Annotated[str | None, or_unknown(str | None)]  # a name or a note
Timings = Annotated[dict[str, Measure | None], BeforeValidator(_timings)]  # by name; each None where unreadable
Load = Annotated[Contention | None, or_unknown(Contention | None)]


class RunStarted(_Event):
    """A run (or a resume of it) began: its resolved config, model size, device and data."""

    event: Literal["run_started"] = "run_started"
    config: Annotated[dict[str, Any], Plain]  # the fully resolved config, as in the run's config.toml
    n_params: Count  # the model's parameter count
    device: str  # the torch device: cpu, cuda, cuda:0, mps
    device_name: str  # the device as people name it (GPU model, CPU architecture)
    precision: str  # what "auto" resolved to on this device
    start_step: Count = 0  # the step it starts from (0, or the resumed checkpoint's)
    flops_per_token: Count  # model FLOPs per trained token (forward and backward), for MFU
    # the device's peak FLOP/s at this precision (> 0: MFU divides by it); None: unknown
    peak_flops: Peak = None
    dataset: Description = {}  # the dataset's description (dataset.json: dtype, vocab, counts)
    world_size: Annotated[int, Field(ge=1, le=INT_MAX)] = 1  # processes training together (torchrun); 1 alone
    parallel: Detail = None  # "ddp" or "fsdp" when world_size > 1
    init_from: Detail = None  # this start loaded pretrained weights (--init-from: gpt2, or a directory)
    attention: Detail = None  # the SDPA kernel `flash` runs here (flash, cuDNN, efficient, math); None: manual
    attention_ms: Timings = {}  # CUDA: ms per attention forward+backward of each kernel timed (None: cannot run)
    contention: Load = None  # the machine's load as it started (engine/train/contention.py)

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
    """Training progress, every --log-interval steps."""

    event: Literal["step"] = "step"
    loss: Loss  # mean train loss over the step's micro-batches
    lr: Finite  # the learning rate of this step
    grad_norm: Loss  # global norm before clipping
    step_time_s: Measure  # device-synchronized, averaged over the steps since the last event
    tokens_per_s: Measure  # training tokens per second, all ranks together
    mfu: Figure | None  # None: the device's peak is unknown
    mem_bytes: Count | None  # peak allocated device memory; None on CPU
    tokens: Count  # tokens seen so far
    data_time_s: Measure = 0.0  # of step_time_s, host time spent waiting for batches
    rank_step_times: list[Measure] | None = None  # under torchrun: each rank's step time, by rank
    contention: Load = None  # the machine's contention since the last step event


class Eval(_AtStep):
    """A validation-loss measurement, every --eval-interval steps."""

    event: Literal["eval"] = "eval"
    val_loss: Loss  # mean loss over --eval-batches val batches
    tokens: Count | None = None  # training tokens the weights saw by then (None: logged before it existed)
    # training time by then: the sum of the step times (each logged interval's step time x its steps),
    # across segments, kept through resumes; evals, checkpoints, pauses and resume gaps left out,
    # a compile's warm-up counted (its first steps are slow). None: logged before it existed
    train_time_s: Measure | None = None


class Checkpoint(_AtStep):
    """A checkpoint was written (atomically) to the run's checkpoints/."""

    event: Literal["checkpoint"] = "checkpoint"
    path: str  # the checkpoint file
    val_loss: Loss | None  # the val loss it was saved at; None: no eval yet
    best: bool = False  # the best val loss so far: also saved as best.pt
    size_bytes: Count = 0  # the file's size


class Warning_(_Event):
    """Something the user should know; the run goes on."""

    event: Literal["warning"] = "warning"
    message: str  # the text, possibly several lines


class RunFinished(_AtStep):
    """The run ended on purpose: it reached max_steps, or was stopped with a checkpoint."""

    event: Literal["run_finished"] = "run_finished"
    reason: Literal["completed", "stopped"] = "completed"  # completed: max_steps reached; stopped: asked to stop
    best_val_loss: Loss | None = None  # the lowest val loss of the run; None: no eval
    summary: Annotated[dict[str, Any], Plain] = {}  # settled: first/median step s, tok/s, MFU, peak mem, contention


class RunFailed(_Event):
    """The run ended on an error (the last checkpoint stays loadable)."""

    event: Literal["run_failed"] = "run_failed"
    step: Count | None = None  # the step it failed at, when known
    error: str  # what went wrong, in one line with its fix where there is one


class Sample(_AtStep):
    """A short generation from the model at an eval, for the dashboard's sample panel."""

    event: Literal["sample"] = "sample"
    text: str  # the generated text (from an empty prompt)


class Paused(_AtStep):
    """The run paused at a step boundary, on a pause request."""

    event: Literal["paused"] = "paused"


class Resumed(_AtStep):
    """A paused run went on."""

    event: Literal["resumed"] = "resumed"


class Gpu(_Event):
    """One round of GPU readings (engine.gpu_monitor, about 1 Hz): for the dashboard's GPU tab."""

    event: Literal["gpu"] = "gpu"
    gpus: Annotated[list[GpuSample], Plain]  # one per visible GPU (its numbers: int64s, finite floats)


class RequestAck(_AtStep):
    """A request to the run (engine.run.requests) was applied or dropped, and why (dropped ones)."""

    event: Literal["request"] = "request"
    id: str  # the request's id, as the requester wrote it
    kind: str  # pause, resume, save, stop, toggle; "?" for a line that was no request
    status: Literal["applied", "dropped"]
    reason: str = ""  # why it was dropped; empty when applied


SegmentReason = Literal["start", "resume", "toggle", "oom"]


class Segment(_AtStep):
    """From `step` on, the run trains with these speed switches (engine.run.segments): emitted
    right after run_started, and on a live toggle or an OOM fallback."""

    event: Literal["segment"] = "segment"
    switches: Annotated[dict[str, Any], Plain]  # dotted name -> value, engine.run.segments.SWITCHES
    changed: Annotated[dict[str, list[Any]], Plain]  # dotted name -> [old, new], against the previous segment
    reason: SegmentReason  # start, resume, toggle (a live change) or oom (the fallback after out of memory)
    init_from: str | None = None  # the segment began from these pretrained weights (a new run's first)


class Compiled(_AtStep):
    """A compiled segment's warm-up, read from torch's own counters after its first steps
    (engine.train.compiling.Warmup): how long compiling took and where the code came from."""

    event: Literal["compiled"] = "compiled"
    scope: str  # speed.compile_scope: model | blocks
    compiled: bool  # Dynamo captured a graph this segment; False: it ran eager (e.g. the recompile limit)
    graphs: Count  # graphs Dynamo captured this segment
    compile_s: Measure  # seconds torch spent compiling (forward and backward, eval's graph included)
    source: Literal["cold", "warm disk", "run artifacts"]  # any cache miss: cold
    cache_hits: Count  # inductor FX graph + AOTAutograd cache hits this segment
    cache_misses: Count  # inductor FX graph + AOTAutograd cache misses this segment


class TunePlan(_AtStep):
    """The run's tuner (engine/run/tune.py, --tune) begins: what it will try, in order, what it will
    not (each "name: why") and what it may spend."""

    event: Literal["tune_plan"] = "tune_plan"
    trials: Annotated[list[str], Field(max_length=64)]  # the trials' names, after the start's own
    skipped: Annotated[list[str], Field(max_length=64)]  # "name: why" for each not tried
    budget: str  # speed.tune_budget as given
    budget_steps: Count | None = None
    budget_s: Measure | None = None
    steps_per_trial: Count  # the fewest steps a trial is measured over (its step reports)


class TuneTrial(_AtStep):
    """One trial of the tuner: begun ("trying") or ended with its figure; `index` 0 is the start."""

    event: Literal["tune_trial"] = "tune_trial"
    index: Count
    of: Count  # the trials planned after the start
    label: str
    switches: Annotated[dict[str, Any], Plain]  # the whole set it trains with
    status: Literal["trying", "measured", "contended", "unsettled", "skipped"]
    settled_step_time_s: Measure | None = None  # the median of its settled half
    spread: Measure | None = None  # (max - min) / median of the settled half
    warmup_s: Measure | None = None  # its first report past the settled time (a compile's warm-up)
    vs_start: Measure | None = None  # how many times the start's step time this one's is faster
    contention: Load = None
    reason: str = ""  # why it was skipped or cut


class TuneDone(_AtStep):
    """The tune ended: the switches the run trains on with from here, their gain over the start,
    what was not tried and why, and where the tuned set was saved for `--from-tuned`."""

    event: Literal["tune_done"] = "tune_done"
    switches: Annotated[dict[str, Any], Plain]
    changed: Annotated[dict[str, list[Any]], Plain]  # dotted name -> [start, chosen]
    gain: Measure | None = None  # the start's settled step time over the chosen one's
    trials: Count  # trials measured, the start's included
    skipped: Annotated[list[str], Field(max_length=128)]
    reason: str  # why the tune ended
    tuned_file: str | None = None


Event = Annotated[
    Union[RunStarted, Step, Eval, Checkpoint, Warning_, RunFinished, RunFailed, Sample, Paused, Resumed, Gpu, Segment,
          RequestAck, Compiled, TunePlan, TuneTrial, TuneDone],
    Field(discriminator="event"),
]
_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str | bytes) -> Event:
    return _adapter.validate_json(line)


# how pydantic says a number broke its field's range (the numbers above); `value_error`: Plain's
_RANGE = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
                    "value_error", "int_parsing_size"})


class EventLines:
    """The one reading of an events.jsonl's lines as typed events (read_events, attach's tail,
    `runs`): a torn, garbage, unknown, too deeply nested (pydantic-core's recursion limit),
    not-UTF-8 or out-of-range (the numbers above) line is skipped and counted in `problems`,
    never raised."""

    def __init__(self, source: Path | str) -> None:
        self.source, self.line = source, 0
        self.problems: list[str] = []

    def parse(self, raw: bytes) -> Event | None:
        self.line += 1
        if not raw.strip():
            return None
        try:
            return _adapter.validate_json(raw)
        except ValidationError as err:
            field = next((e["loc"][1] for e in err.errors() if e["type"] in _RANGE and len(e["loc"]) > 1), None)
            why = f"a number out of range in {field}" if isinstance(field, str) else "an unreadable line"
            self.problems.append(f"{self.source}:{self.line}: skipped {why}")
            return None
        except (ValueError, RecursionError, MemoryError):
            self.problems.append(f"{self.source}:{self.line}: skipped an unreadable line")
            return None

    def read(self, lines: Iterable[bytes]) -> list[Event]:
        return [e for e in map(self.parse, lines) if e is not None]


EVENTS_CAP = 16 << 30  # a log larger than this is not a run's (1M steps is ~0.3 GB)


def read_events(path: Path) -> tuple[list[Event], list[str]]:
    """All events of an events.jsonl, and a warning for each line that is torn or unknown."""
    reader = EventLines(path)
    with files.open_log(path, EVENTS_CAP) as f:  # a regular file, never a link or a FIFO
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
        self._log = files.AppendLog(path)

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


# The settle window: the first report carries the warm-up (compile); from the third, the settled
# median skips it. A segment with fewer step reports has no settled speed: "too short to settle".
SETTLE_MIN_REPORTS = 3
ETA_MIN_REPORTS = SETTLE_MIN_REPORTS
# The ETA's window: the latest step reports of the settled window, so a run that slows down (a
# busy machine, a throttled GPU) gets a later ETA within a few reports, not half a segment later.
ETA_RECENT_REPORTS = 10


def settles(times: list[float]) -> bool:
    """Whether these step reports are enough for a settled step time (SETTLE_MIN_REPORTS)."""
    return len(times) >= SETTLE_MIN_REPORTS


def eta_seconds(times: list[float], step: int, max_steps: int | None) -> float | None:
    """Time left to max_steps at the recent step time: the median of the latest
    ETA_RECENT_REPORTS reports of the settled window (past the warm-up); None until there is
    a basis for it."""
    if max_steps is None or len(times) < ETA_MIN_REPORTS:
        return None
    return max(0, max_steps - step) * statistics.median(times[len(times) // 2 :][-ETA_RECENT_REPORTS:])


class ConsoleSink:
    """Each event's text (describe), for headless runs and logs; step lines carry an ETA from
    the step times of the current segment (a toggle changes the speed, so it starts afresh)."""

    def __init__(self, stream: TextIO | None = None, settled_before: Callable[[int], Any] | None = None):
        self._out = Console(stream) if stream is not None else console_out  # the one terminal boundary
        self._max_steps: int | None = None
        self._times: list[float] = []
        # the run's last segment that settled before a step (an engine.run.segments.SegmentSummary, or
        # None): what the closing summary falls back on when the last segment is too short to settle
        self._settled_before = settled_before or (lambda step: None)
        self._from_step = 0  # where the current segment began

    def emit(self, event: _Event) -> None:
        eta = None
        if isinstance(event, RunStarted):
            self._max_steps = event.setting("train.max_steps")
            self._times, self._from_step = [], event.start_step
        elif isinstance(event, Segment) and event.reason != "start":
            self._times, self._from_step = [], event.step
        elif isinstance(event, Step):
            self._times.append(event.step_time_s)
            eta = eta_seconds(self._times, event.step, self._max_steps)
        if isinstance(event, RunFinished) and event.summary and not settles(self._times):
            line = text.unsettled_end(event, self._from_step, len(self._times), self._settled_before(self._from_step))
        else:
            line = text.describe(event, self._max_steps, eta)
        if line:
            self._out.line(line, flush=True)

    def close(self) -> None:
        pass

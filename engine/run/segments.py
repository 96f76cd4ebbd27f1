"""A run as a sequence of segments: stretches trained with one set of speed switches.

Each resume, live toggle or OOM fallback starts a segment (a `segment` event right after
`run_started`, or alone for a live toggle). Read back, a run's events say what speed each
set of switches reached, so `compare`, the Compare screen and the dashboard's segment table
all take their figures from here. Runs logged before the `segment` event existed count one
segment per `run_started`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from engine import events as ev
from engine.config import RunConfig
from engine.train import contention
from engine.train.flops import mfu
from engine import settings

# The settings that change how fast a run goes, not what it computes (batch geometry aside:
# a toggle keeps the tokens per optimizer step, so micro-batch x grad-accum is a speed choice).
# Each says so itself: `live=True` in its Field (engine/config.py).
SWITCHES: tuple[str, ...] = settings.switches()

_DEFAULTS: dict[str, Any] = RunConfig().model_dump(mode="json")

# Every setting a segment trained with, by dotted name, sections in the config's order ("preset"
# first): what a comparison names when it differs between rows. The run directory is left out:
# every run has its own.
SETTINGS: tuple[str, ...] = ("preset", *(s.dotted for s in settings.all_settings()))


def _dig(d: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(d, dict) or key not in d:
            raise KeyError(dotted)
        d = d[key]
    return d


def switches(config: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """The speed switches of a config, by dotted name, in SWITCHES order. A dict missing one
    (a config written before the setting existed) gets the default, which is what applied."""
    data = config.model_dump(mode="json") if isinstance(config, RunConfig) else config
    out = {}
    for name in SWITCHES:
        try:
            out[name] = _dig(data, name)
        except KeyError:
            out[name] = _dig(_DEFAULTS, name)
    return out


def trained_with(config: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """Every setting (SETTINGS) of a run_started event's config, with the switches `now` in force
    over it (a live toggle changes those alone); a setting the config lacks (written before it
    existed) gets the default, which is what applied."""
    out = {}
    for name in SETTINGS:
        try:
            out[name] = _dig(config, name)
        except KeyError:
            out[name] = _dig(_DEFAULTS, name)
    out.update((n, v) for n, v in now.items() if n in out)
    return out


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """[old, new] for each switch whose value differs, in SWITCHES order."""
    names = [n for n in SWITCHES if n in before or n in after]
    names += sorted(n for n in {*before, *after} if n not in SWITCHES)
    return {n: [before.get(n), after.get(n)] for n in names if before.get(n) != after.get(n)}


def opening(
    config: RunConfig, step: int, previous: RunConfig | dict[str, Any] | None, reason: ev.SegmentReason,
    init_from: str | None = None,
) -> ev.Segment:
    """The event that opens a segment at `step`; `previous` is the config the run last trained
    with (the loaded checkpoint's on a resume; None when there is none); `init_from`: the
    pretrained weights it starts from, when it loaded them."""
    now = switches(config)
    diff = changed(switches(previous), now) if previous is not None else {}
    return ev.Segment(step=step, switches=now, changed=diff, reason=reason, init_from=init_from)


# ------------------------------------------------------------------------------ reading


class Reach(BaseModel):
    """Where a run first reached a target val loss: the eval's step, the training time and
    tokens it had taken by then (Eval.train_time_s: the sum of step times, evals, checkpoints,
    pauses and resume gaps left out), and the val loss it measured."""

    step: int
    train_time_s: float
    tokens: int
    val_loss: float


class SegmentSummary(BaseModel):
    """One segment's switches and the speed it reached (what `compare --json` prints)."""

    from_step: int
    to_step: int
    switches: dict[str, Any]
    changed: dict[str, list[Any]]
    reason: str
    first_step_time_s: float | None  # the first logged interval: includes the compile warm-up
    settled_step_time_s: float | None  # events.settled_step_time: past the warm-up
    tokens_per_s: float | None  # at the settled step time
    mfu: float | None  # at the settled step time; None when the device's peak is unknown
    peak_mem_bytes: int | None  # the highest peak the step reports gave; None on CPU
    # a compiled segment's warm-up (a `compiled` event; None: compile off, or a run logged before it)
    compiled: bool | None = None  # False: compile was on but nothing ran compiled (eager)
    compile_s: float | None = None  # seconds torch spent compiling
    compile_source: str | None = None  # cold | warm disk | run artifacts
    # fewer step reports than the settle window (events.SETTLE_MIN_REPORTS): no settled speed, no ratio
    too_short_to_settle: bool = False
    best_val_loss: float | None = None  # the best val loss of this segment's evals (not the run's)
    # the run's first eval at or below the target val loss that falls in this segment (mark_target;
    # None: not reached here, or no target given): the run's training time and tokens by then
    to_target: Reach | None = None
    # the machine's contention over the settled window (engine/train/contention.py; None: not recorded)
    contention: ev.Contention | None = None
    # every setting it trained with (trained_with): what `settings` is picked from; not printed
    config: dict[str, Any] = Field(default_factory=dict, exclude=True)
    # a comparison's (engine.inspect.compare): this segment's value of each setting that differs
    # between the compared rows, by dotted name in the config's order (empty: nothing differs)
    settings: dict[str, Any] = {}


class _Open:
    """The segment being read: its opening and the step reports since."""

    def __init__(self, step: int, sw: dict[str, Any], diff: dict[str, list[Any]], reason: str,
                 started: ev.RunStarted | None, from_run_started: bool) -> None:  # fmt: skip
        self.from_step = self.to_step = step
        self.switches, self.changed, self.reason = sw, diff, reason
        self.started = started
        self.from_run_started = from_run_started  # provisional: a segment event right after replaces it
        self.times: list[float] = []
        self.readings: list[ev.Contention | None] = []  # each step report's contention, beside `times`
        self.tokens_per_step: float | None = None
        self.peak: int | None = None
        self.compiled: ev.Compiled | None = None
        self.best_val: float | None = None

    def summary(self) -> SegmentSummary:
        short = bool(self.times) and not ev.settles(self.times)
        settled = None if short else ev.settled_step_time(self.times)
        tok_s = self.tokens_per_step / settled if settled and self.tokens_per_step else None
        s = self.started
        util = mfu(tok_s, s.flops_per_token, s.peak_flops, s.world_size) if tok_s and s else None
        return SegmentSummary(
            from_step=self.from_step, to_step=self.to_step, switches=self.switches, changed=self.changed,
            reason=self.reason, first_step_time_s=self.times[0] if self.times else None,
            settled_step_time_s=settled, tokens_per_s=tok_s, mfu=util, peak_mem_bytes=self.peak,
            compiled=c.compiled if (c := self.compiled) else None, compile_s=c.compile_s if c else None,
            compile_source=c.source if c else None, too_short_to_settle=short, best_val_loss=self.best_val,
            contention=contention.settled(self.readings),
            config=trained_with(s.config if s else {}, self.switches),
        )  # fmt: skip


class SegmentReader:
    """Builds segments from events fed one at a time (the dashboard feeds a live run's);
    closed segments are summarized once, the open one on each `segments()` call."""

    def __init__(self) -> None:
        self.closed: list[SegmentSummary] = []
        self.current: _Open | None = None
        self.started: ev.RunStarted | None = None
        self.evals: list[tuple[int, Reach]] = []  # (segment index, the eval) per finite eval, in order
        self._train_s, self._timed_to, self._tokens = 0.0, 0, 0  # for logs whose evals carry no time

    def _close(self) -> None:
        if self.current is not None:
            self.closed.append(self.current.summary())
        self.current = None

    def feed(self, e: Any) -> None:
        cur = self.current
        match e:
            case ev.RunStarted():
                before = cur.switches if cur else (self.closed[-1].switches if self.closed else None)
                self._close()
                now = switches(e.config)
                reason = "resume" if before is not None or e.start_step > 0 else "start"
                diff = changed(before, now) if before is not None else {}
                self.started = e
                self.current = _Open(e.start_step, now, diff, reason, e, from_run_started=True)
                self._timed_to = e.start_step
            case ev.Segment():
                if cur is not None and cur.from_run_started and not cur.times:
                    cur.switches, cur.changed, cur.reason = e.switches, e.changed, e.reason
                    cur.from_run_started = False
                else:  # a live toggle: the run goes on in the same process
                    self._close()
                    self.current = _Open(e.step, e.switches, e.changed, e.reason, self.started, False)
            case ev.Step() if cur is not None:
                cur.to_step = max(cur.to_step, e.step)
                self._train_s += e.step_time_s * max(0, e.step - self._timed_to)
                self._timed_to, self._tokens = max(self._timed_to, e.step), e.tokens
                if e.step_time_s > 0:
                    cur.times.append(e.step_time_s)
                    cur.readings.append(e.contention)
                    cur.tokens_per_step = e.tokens_per_s * e.step_time_s
                if e.mem_bytes is not None:
                    cur.peak = max(cur.peak or 0, e.mem_bytes)
            case ev.Compiled() if cur is not None:
                cur.compiled = e
            case ev.Eval() if cur is not None:
                cur.to_step = max(cur.to_step, e.step)
                if math.isfinite(e.val_loss):
                    cur.best_val = e.val_loss if cur.best_val is None else min(cur.best_val, e.val_loss)
                    spent = e.train_time_s if e.train_time_s is not None else self._train_s
                    tokens = e.tokens if e.tokens is not None else self._tokens
                    self.evals.append((len(self.closed), Reach(step=e.step, train_time_s=spent, tokens=tokens,
                                                               val_loss=e.val_loss)))  # fmt: skip
            case ev.Checkpoint() | ev.RunFinished() | ev.RunFailed() if cur is not None:
                cur.to_step = max(cur.to_step, e.step if e.step is not None else cur.to_step)

    def current_step_times(self) -> list[float]:
        """The step times of the segment being read (none yet: empty): what a live view's
        settled speed and ETA come from, by the same rule as the segment's summary."""
        return list(self.current.times) if self.current else []

    def current_contention(self) -> ev.Contention | None:
        """The contention over the settled window of the segment being read (the live view's marker)."""
        return contention.settled(self.current.readings) if self.current else None

    def segments(self) -> list[SegmentSummary]:
        return self.closed + ([self.current.summary()] if self.current else [])


def segments_of(events: Iterable[Any]) -> list[SegmentSummary]:
    """The segments of a run, from its events (engine.events.read_events), in order."""
    reader = SegmentReader()
    for e in events:
        reader.feed(e)
    return reader.segments()


def final_val_loss(evals: list[tuple[int, Reach]]) -> float | None:
    """The run's last finite val loss (where it ended up, not its best)."""
    return evals[-1][1].val_loss if evals else None


def default_target(finals: Iterable[float | None]) -> float | None:
    """The target val loss a comparison uses unless told: the worst final val loss among the
    runs, so every run reaches it (None when no run evaluated)."""
    known = [f for f in finals if f is not None]
    return max(known) if known else None


def mark_target(segments: list[SegmentSummary], evals: list[tuple[int, Reach]], target: float | None) -> Reach | None:
    """Each segment's `to_target` (the first eval in it at or below `target`) set in place; the
    run's first such eval returned (None: never reached, or no target)."""
    first: Reach | None = None
    for i, seg in enumerate(segments):
        seg.to_target = None
        if target is None:
            continue
        seg.to_target = next((r for j, r in evals if j == i and r.val_loss <= target), None)
        first = first or seg.to_target
    return first


def speedup(segment: SegmentSummary, base: SegmentSummary) -> float | None:
    """How many times faster `segment` trained than `base`, in tokens/s (a step-time ratio
    would mislead when the micro-batch changed)."""
    if segment.tokens_per_s and base.tokens_per_s:
        return segment.tokens_per_s / base.tokens_per_s
    return None

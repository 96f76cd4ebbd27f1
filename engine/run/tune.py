"""The run tunes itself (`--tune`): its live speed switches tried as segments while it trains,
the fastest kept for the rest of the run and saved for this machine and model shape.

A trial is a live toggle (engine/run/toggle.py) that the tuner asks of the run the way any UI
does, through the run's own Control: the owner checks it as a launch would, saves, and the next
segment resumes bit-exactly with the new switches, so the run trains the same tokens with or
without a tune. Under torchrun rank 0 alone tunes: its requests reach every rank through the
same agreement as a user's (distributed.agree), so all ranks run the same trials.

    plan     each switch's alternatives on this device, in order of expected gain (precision,
             compile and its scope, attention, loss, micro-batch x accumulation at the same
             tokens per step, fused AdamW, the data path), each judged now by the launch's rules
             (memory estimate, switch matrix, device): what would not fit or is refused is
             never tried, and a precision this CPU only emulates is never a candidate;
    trial    the best set so far with one change; warm-up (compile included) and then the
             settled half of its step reports (the Segments tab's rule: the median of the second
             half), until their spread is within SPREAD_OK or MAX_REPORTS; a trial timed under
             contention is measured on to MAX_REPORTS and, still contended, marked;
    keep     a trial that beats the best by KEEP_GAIN becomes the best;
    done     at the end of the plan, the budget, or the run's last steps: the run returns to the
             best set, says so (a tune_done event) and saves it (`--from-tuned` starts there).

The tuner's state is `tune.json` in the run directory (written atomically, read bounded and
validated like any file there), so a run killed mid-tune resumes mid-tune: the trial it was in
is measured again from its resume.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from engine import events as ev
from engine import files
from engine.config import RunConfig
from engine.errors import UserError
from engine.run import toggle
from engine.run.requests import Control, Request
from engine.run.segments import SWITCHES, changed, switches
from engine.run.tuned import read_model, save_tuned
from engine.text import duration_text
from engine.train import contention

STATE = "tune.json"  # in the run directory
STATE_CAP = 1 << 20  # a state of a few dozen trials is a few KB
MIN_REPORTS = 6  # a trial's step reports before its settled half (the last 3) is read
MAX_REPORTS = 12  # a noisy or contended trial is measured this long, then taken as it is (or marked)
SPREAD_OK = 0.10  # the settled half's (max - min) / median: within this the figure stands
KEEP_GAIN = 1.02  # a trial replaces the best only when this much faster: less is a busy machine's noise
ID_PREFIX = "tune-"  # the tuner's toggle requests: "tune-3" is trial 3, "tune-best" the return


Text = Annotated[str, Field(max_length=2000)]  # a label or a reason: read back from tune.json, shown printable
Switches = Annotated[dict[str, Any], ev.Plain]  # dotted switch -> value: its numbers in the events' range


class Trial(BaseModel):
    """One configuration tried: `change` over the best set at the time it runs (the start: none)."""

    label: Text
    change: Switches = {}
    status: Literal["planned", "trying", "measured", "contended", "unsettled", "skipped"] = "planned"
    switches: Switches = {}  # the whole set it trained with (set when it starts)
    from_step: ev.Count | None = None
    settled_step_time_s: ev.Measure | None = None
    spread: ev.Measure | None = None
    warmup_s: ev.Measure | None = None  # the first report's time past the settled one (compile included)
    contention: ev.Contention | None = None
    reason: Text = ""  # why it was skipped, or what was odd about its figure


class State(BaseModel):
    """tune.json: what the tuner planned, measured and chose; read back through the file rules
    (every number in the events' ranges: a planted NaN or 10**400 is refused, not compared)."""

    version: Literal[1] = 1
    start: Switches  # the switches the run had when the tune began
    best: ev.Count = 0  # the index of the fastest measured trial (0: the start)
    trials: list[Trial] = Field(max_length=64)
    skipped: list[Text] = Field([], max_length=64)  # "label: why", judged at the plan
    current: ev.Count = 0
    began_step: ev.Count = 0
    budget: Annotated[str, Field(max_length=16)]  # speed.tune_budget as the tune began
    budget_steps: ev.Count | None = None
    budget_s: ev.Measure | None = None
    spent_s: ev.Measure = 0.0  # wall seconds spent tuning before this process (a resume adds to it)
    waited_steps: ev.Count = 0  # boundaries a trial's toggle took to reach every rank: not the step budget's
    done: bool = False
    ending: Text = ""


# ------------------------------------------------------------------------------ the plan


def _precisions(kind: str) -> tuple[list[str], list[str]]:
    """(the precisions worth trying on this device kind, why the others are not)."""
    from engine import device
    from engine.train.contention import half_reason

    if kind == "cuda":
        return ["tf32", device.half_precision("cuda")], []
    if kind != "cpu":
        return [], []
    tried, left = [], []
    for half in ("bf16", "fp16"):
        if device.cpu_native(half):
            tried.append(half)
        else:
            left.append(f"precision {half}: {half_reason(half, measure=False)}")
    return tried, left


def candidates(config: RunConfig, kind: str) -> tuple[list[Trial], list[str]]:
    """Each switch's alternatives on this device, in order of expected gain; (trials, not tried: why).
    Never the tokens per optimizer step, the model or the optimizer: only SWITCHES, which keep them."""
    now = toggle.effective(config)
    out: list[Trial] = []
    halves, left = _precisions(kind)
    out += [Trial(label=f"precision {p}", change={"speed.precision": p}) for p in halves if p != now["speed.precision"]]
    other_scope = "model" if config.speed.compile_scope == "blocks" else "blocks"
    if not config.speed.compile:
        out.append(Trial(label="compile", change={"speed.compile": True}))
    out.append(Trial(label=f"compile scope {other_scope}", change={"speed.compile": True, "speed.compile_scope": other_scope}))
    if config.speed.compile:
        out.append(Trial(label="no compile", change={"speed.compile": False}))
    if kind == "cuda":
        out.append(Trial(label="compile mode max-autotune-no-cudagraphs",
                         change={"speed.compile": True, "speed.compile_mode": "max-autotune-no-cudagraphs"}))  # fmt: skip
    m = config.model
    out.append(Trial(label=f"attention {'manual' if m.attention == 'flash' else 'flash'}",
                     change={"model.attention": "manual" if m.attention == "flash" else "flash"}))  # fmt: skip
    loss = "chunked" if m.loss == "plain" else "plain"
    out.append(Trial(label=f"loss {loss}", change={"model.loss": loss}))
    t = config.train
    if t.batch_size % 2 == 0 and t.batch_ramp == 0:
        b, a = t.batch_size // 2, t.grad_accum * 2
        out.append(Trial(label=f"micro-batch {b} x {a}", change={"train.batch_size": b, "train.grad_accum": a}))
    if t.grad_accum % 2 == 0 and t.batch_ramp == 0:
        b, a = t.batch_size * 2, t.grad_accum // 2
        out.append(Trial(label=f"micro-batch {b} x {a}", change={"train.batch_size": b, "train.grad_accum": a}))
    fused = config.optim.fused is not False
    out.append(Trial(label="unfused AdamW" if fused else "fused AdamW", change={"optim.fused": not fused}))
    d = config.data
    if kind == "cuda":
        out.append(Trial(label=f"prefetch {'off' if d.prefetch else 'on'}", change={"data.prefetch": not d.prefetch}))
    for name in ("preload", "vectorized"):
        if not getattr(d, name):
            out.append(Trial(label=name, change={f"data.{name}": True}))
    if m.grad_checkpointing:
        out.append(Trial(label="no grad checkpointing", change={"model.grad_checkpointing": False}))
    return out, left


def refusal(config: RunConfig, target: dict[str, Any]) -> str | None:
    """Why the run may not train with the switches `target` now (the launch's own rules, as a
    live toggle is judged: memory, switch matrix, device, the tokens per step), else None."""
    asked = {n: v for n, v in target.items() if switches(config).get(n) != v}
    if not asked:
        return None
    try:
        verdict = toggle.judge(config, asked)
    except UserError as err:
        return str(err)
    return str(verdict.found[0]).split("\n")[0] if verdict.found else None


def _target(best: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    return {**best, **change}


def _budget(text: str, config: RunConfig) -> tuple[int | None, float | None]:
    """speed.tune_budget as (steps, seconds): a share of the planned steps, steps, or seconds."""
    if text.endswith("%"):
        return int(float(text[:-1]) / 100 * config.train.max_steps), None
    if text.endswith("s"):
        return None, float(text[:-1])
    return int(text), None


# ------------------------------------------------------------------------------ the tuner


class Tuner:
    """Rank 0's tuner of one run: a sink of the run's events (it reads its trials' step reports)
    and, at each step boundary (`at_boundary`), the one that asks for the next trial."""

    def __init__(self, run_dir: Path, state: State | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.state = state
        self.times: list[float] = []
        self.readings: list[ev.Contention | None] = []
        self.asked: str | None = None  # the id of the toggle asked and not yet in force
        self.dropped: str | None = None  # why the run refused it
        self.by_hand = False  # a segment opened with switches the tuner did not ask for
        self._began = time.monotonic()
        self._spent0 = state.spent_s if state else 0.0

    # the run's events, as a sink
    def emit(self, e: Any) -> None:
        s = self.state
        if s is None or s.done:
            return
        trial = s.trials[s.current] if s.current < len(s.trials) else None
        match e:
            case ev.Step() if trial is not None and trial.from_step is not None and e.step > trial.from_step:
                if e.step_time_s > 0 and self.asked is None:
                    self.times.append(e.step_time_s)
                    self.readings.append(e.contention)
            case ev.Segment() if e.reason != "start":
                self.times, self.readings = [], []
                if e.reason == "toggle" and self.asked is None and trial is not None and e.switches != trial.switches:
                    self.by_hand = True
                self.asked = None
                if trial is not None:
                    trial.from_step = e.step
            case ev.RequestAck() if e.id == self.asked and e.status == "dropped":
                self.asked, self.dropped = None, e.reason or "refused"

    def close(self) -> None:
        pass

    def failed(self, why: str) -> None:
        """The run stopped in a trial (out of memory, though the estimate said it fits): the trial
        is marked in tune.json, so the resume moves on to the next instead of running it again."""
        s = self.state
        if s is None or s.done or s.current == 0 or s.trials[s.current].status != "trying":
            return
        trial = s.trials[s.current]
        trial.status, trial.reason = "skipped", why
        self._save()

    # what the owner asks at each step boundary
    def at_boundary(self, step: int, config: RunConfig, control: Control, emit: Any) -> None:
        """Measure the trial in force; when it has its figure, record it and ask for the next."""
        if self.state is None:
            self._plan(config, step, emit)
            self.times, self.readings = [], []
        s = self.state
        if s.done:
            return
        if self.asked is not None:  # under torchrun the ranks agree on it every ~0.2 s (distributed.agree)
            s.waited_steps += 1
            return
        trial = s.trials[s.current]
        if trial.status == "skipped":  # it ended the run before (Tuner.failed): the resume moves on
            emit(self._event(step, s.current, trial))
            return self._next(step, config, control, emit)
        if self.by_hand:
            return self._finish(step, config, control, emit, "a toggle by hand changed the switches: the tune "
                                "stopped there, with the best so far", back=False)  # fmt: skip
        if self.dropped is not None:
            trial.status, trial.reason, self.dropped = "skipped", self.dropped, None
            emit(self._event(step, s.current, trial))
            return self._next(step, config, control, emit)
        if switches(config) != trial.switches:  # its toggle not asked yet in this process (a resume)
            return self._ask(f"{ID_PREFIX}{s.current}", trial.switches, control)
        if trial.from_step is None:
            trial.from_step = step
        over = self._over(step, config)
        if len(self.times) < MIN_REPORTS:
            if over:
                trial.status, trial.reason = "unsettled", f"cut before it settled: {over}"
                emit(self._event(step, s.current, trial))
                return self._finish(step, config, control, emit, over)
            return
        half = self.times[len(self.times) // 2 :]
        settled = statistics.median(half)
        spread = (max(half) - min(half)) / settled if settled > 0 else 0.0
        busy = contention.settled(self.readings)
        if (spread > SPREAD_OK or contention.is_contended(busy)) and len(self.times) < MAX_REPORTS and not over:
            return
        trial.settled_step_time_s, trial.spread, trial.contention = settled, spread, busy
        trial.warmup_s = max(0.0, self.times[0] - settled)  # the first report carries the compile
        trial.status = "contended" if contention.is_contended(busy) else "measured"
        if spread > SPREAD_OK:
            trial.reason = f"its settled steps spread {100 * spread:.0f}%"
        best = s.trials[s.best]
        if (s.current != s.best and trial.status == "measured" and best.settled_step_time_s
                and settled * KEEP_GAIN < best.settled_step_time_s):  # fmt: skip
            s.best = s.current
        emit(self._event(step, s.current, trial))
        self._next(step, config, control, emit)

    def _next(self, step: int, config: RunConfig, control: Control, emit: Any) -> None:
        """The next planned trial that is new and allowed now, asked for; none left: the tune ends."""
        s = self.state
        assert s is not None
        best = s.trials[s.best].switches
        tried = [t.switches for t in s.trials if t.switches]
        while s.current + 1 < len(s.trials):
            over = self._over(step, config)
            if over:
                return self._finish(step, config, control, emit, over)
            s.current += 1
            trial = s.trials[s.current]
            target = _target(best, trial.change)
            why = "the same switches as a trial before it" if target in tried else refusal(config, target)
            if why is None:
                trial.switches, trial.status, trial.from_step = target, "trying", step
                self._save()
                emit(self._event(step, s.current, trial))
                return self._ask(f"{ID_PREFIX}{s.current}", target, control)
            trial.status, trial.reason = "skipped", why
            emit(self._event(step, s.current, trial))
        self._finish(step, config, control, emit, "every planned trial was tried")

    def _over(self, step: int, config: RunConfig) -> str | None:
        """Why the tune may explore no more: its budget is spent, or the run is about to end."""
        s = self.state
        assert s is not None
        left = config.train.max_steps - step
        if left <= MIN_REPORTS * config.train.log_interval:
            return f"the run has {left} steps left, too few for another trial"
        if s.budget_steps is not None and step - s.began_step - s.waited_steps >= s.budget_steps:
            return f"the budget was spent ({s.budget_steps} steps, {s.budget})"
        if s.budget_s is not None and self.spent() >= s.budget_s:
            return f"the budget was spent ({duration_text(s.budget_s)})"
        return None

    def spent(self) -> float:
        return self._spent0 + time.monotonic() - self._began

    def _ask(self, rid: str, target: dict[str, Any], control: Control) -> None:
        """The toggle to `target` asked of the run as any UI asks (taken at this boundary)."""
        self.asked = rid
        control.steer(Request("toggle", id=rid, switches=dict(target)))

    def _finish(self, step: int, config: RunConfig, control: Control, emit: Any, why: str, back: bool = True) -> None:
        """The tune ends: the run returns to the best set (unless a person chose another), says so, saves it."""
        s = self.state
        assert s is not None
        for t in s.trials[s.current + 1 :]:
            if t.status == "planned":
                t.status, t.reason = "skipped", why
        s.done, s.ending = True, why
        s.current = len(s.trials) - 1
        best = s.trials[s.best]
        start = s.trials[0]
        gain = (start.settled_step_time_s / best.settled_step_time_s
                if start.settled_step_time_s and best.settled_step_time_s else None)  # fmt: skip
        saved = None
        if best.settled_step_time_s is not None:
            saved = save_tuned(config, best.switches, gain, self.run_dir)
        self._save()
        emit(ev.TuneDone(step=step, switches=best.switches, changed=changed(s.start, best.switches), gain=gain,
                         trials=sum(t.status in ("measured", "contended") for t in s.trials),
                         skipped=[*s.skipped, *(f"{t.label}: {t.reason}" for t in s.trials if t.status == "skipped")],
                         reason=why, tuned_file=str(saved) if saved else None))  # fmt: skip
        if back and switches(config) != best.switches:
            self._ask(f"{ID_PREFIX}best", best.switches, control)

    def _event(self, step: int, index: int, trial: Trial) -> ev.TuneTrial:
        s = self.state
        assert s is not None
        start = s.trials[0].settled_step_time_s
        vs = start / trial.settled_step_time_s if index and start and trial.settled_step_time_s else None
        return ev.TuneTrial(step=step, index=index, of=len(s.trials) - 1, label=trial.label, switches=trial.switches,
                            status=trial.status, settled_step_time_s=trial.settled_step_time_s, spread=trial.spread,
                            warmup_s=trial.warmup_s, vs_start=vs, contention=trial.contention, reason=trial.reason)  # fmt: skip

    def _plan(self, config: RunConfig, step: int, emit: Any) -> None:
        """The trials, each judged against the start (what is refused is said, never tried), said and saved."""
        from engine import device

        kind = device.kind(config.speed.device)
        now = switches(config)
        planned, skipped = candidates(config, kind)
        trials = [Trial(label="the start", status="trying", switches=now, from_step=step)]
        for t in planned:
            target = _target(now, t.change)
            if target == now:
                continue
            why = refusal(config, target)
            if why is None:
                trials.append(t)
            else:
                skipped.append(f"{t.label}: {why}")
        steps, seconds = _budget(config.speed.tune_budget, config)
        state = State(start=now, trials=trials, skipped=skipped, began_step=step, budget=config.speed.tune_budget,
                      budget_steps=steps, budget_s=seconds)  # fmt: skip
        per = MIN_REPORTS * config.train.log_interval
        emit(ev.TunePlan(step=step, trials=[t.label for t in trials[1:]], skipped=skipped,
                         budget=config.speed.tune_budget, budget_steps=steps, budget_s=seconds,
                         steps_per_trial=per))  # fmt: skip
        self.state = state
        self._save()
        emit(self._event(step, 0, trials[0]))

    def _save(self) -> None:
        s = self.state
        if s is not None:
            s.spent_s = self.spent()
            files.atomic_write_bytes(self.run_dir / STATE, s.model_dump_json(indent=1).encode())


def load_state(run_dir: Path) -> tuple[State | None, str | None]:
    """The run's tune.json, read by the file rules (bounded, no link followed, validated); (None,
    None) when there is none, (None, why) when it cannot be used."""
    state, why = read_model(Path(run_dir) / STATE, State, STATE, "a tune's state", STATE_CAP)
    if state is None:
        return None, why
    if not state.trials or not 0 <= state.best < len(state.trials) or not 0 <= state.current < len(state.trials):
        return None, f"{STATE} names trials it does not hold"
    if any(set(t.switches) - set(SWITCHES) for t in state.trials):
        return None, f"{STATE} names settings that are not speed switches"
    return state, None

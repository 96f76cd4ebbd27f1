"""Every run under a root at a glance: for `gpt2-tui runs [DIR]` and the app's Runs screen.

A run directory describes itself (config.toml, events.jsonl, writer.pid), so a summary is
read from it alone. The log is read as every reader reads it (events.EventLines) and only
what a summary needs is kept: a long run's log holds a line per step. Torn or garbage
lines are skipped, as `attach` does; a directory that holds no run is left out. Files are
opened through engine.files (regular files only, bounded, depth-capped), so one hostile run
never hangs or breaks the listing. Summaries are kept per log and read on only where the log
grew; step lines are kept raw and parsed only for the last segment's speed (a 1M-line log:
see docs/reliability.md). The writer's liveness (the lock's holder) is checked fresh each time.
"""

from __future__ import annotations

import math
import os
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from engine import events as ev
from engine import rundir
from engine import files
from engine.run.segments import Reach, default_target
from engine.text import fmt_params, loss_text, shown

RunStateName = Literal["running", "completed", "stopped", "failed", "writer gone"]
DEFAULT_ROOT = Path("runs")


class RunSummary(BaseModel):
    name: str
    path: Path
    preset: str | None = None
    n_params: int | None = None  # from the last run_started event
    vocab: int | None = None  # the real vocab the model was built for
    state: RunStateName
    step: int = 0
    max_steps: int | None = None
    best_val_loss: float | None = None
    settled_tokens_per_s: float | None = None  # of the last segment, past the warm-up
    started: datetime
    device_name: str | None = None
    error: str | None = None  # run_failed's message
    final_val_loss: float | None = None  # the last eval's
    # the first eval at or below list_runs' target val loss: training time (sum of step times,
    # Eval.train_time_s) and tokens by then; None: not reached, or logged before evals carried them
    to_target: Reach | None = None
    evals: list[Reach] = []  # the finite evals that carry their training time, in order


STEP_TAG, GPU_TAG = b'"event":"step"', b'"event":"gpu"'  # how JsonlSink writes them (compact)
TAIL_STEPS = 2048  # step reports of the last segment kept for its settled speed (its 2nd half: exact up to here)
EVENTS_CAP = ev.EVENTS_CAP
CONFIG_CAP = 1 << 20  # a run's config.toml is a few kB
CHUNK, LONGEST_LINE = 8 << 20, 64 << 20  # read size; a "line" longer than this is skipped
_OTHER = re.compile(rb'"event"\s*:\s*"(?!(?:step|gpu)")')  # the tag of a line that is not step/gpu


@dataclass
class _Scan:
    """What the log says, independent of the writer's liveness. Built incrementally: `offset`
    is how far the log was read (whole lines), so a growing log is read only where it grew.
    Step lines, nearly all of a long log, are only kept raw (the last TAIL_STEPS of the last
    segment) and parsed when a summary needs them."""

    first_time: float | None = None
    started: ev.RunStarted | None = None  # the last run_started
    end: ev.RunFinished | ev.RunFailed | None = None  # the end of the last segment
    step: int = 0
    best_val: float | None = None
    tail: deque[bytes] = field(default_factory=lambda: deque(maxlen=TAIL_STEPS))  # last segment's step lines
    pending: bytes | None = None  # the newest step line, not yet counted into `step`
    step_times: list[float] = field(default_factory=list)  # last segment (from `tail`, by `finish`)
    tokens_per_step: float | None = None  # tokens/s x s/step of the last report (all ranks)
    offset: int = 0
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the log read
    problems: int = 0  # unreadable lines skipped
    evals: list[Reach] = field(default_factory=list)  # finite evals with their training time and tokens
    final_val: float | None = None


def _scan(events: Path, s: _Scan | None = None) -> _Scan:
    """The log's summary, continuing `s` when it read this same file before. A log that is not a
    regular file (a FIFO, a link to /dev/zero) or is larger than EVENTS_CAP is not read."""
    try:
        fd = files.open_regular(events, EVENTS_CAP)
    except OSError:
        return _Scan()
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if s is None or s.ident != (st.st_dev, st.st_ino) or st.st_size < s.offset:
            s = _Scan(ident=(st.st_dev, st.st_ino))  # new, replaced or truncated: from the start
        elif st.st_size == s.offset:
            return s
        f.seek(s.offset)
        lines = ev.EventLines(events)  # torn by a kill, or not ours: skipped
        carry = b""
        while chunk := f.read(CHUNK):
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut:
                _scan_block(s, data, cut, lines)
                s.offset += cut
            carry = data[cut:]
            if len(carry) > LONGEST_LINE:  # no event is this long: skip it (counted as unreadable)
                s.offset, carry = s.offset + len(carry), b""
                lines.problems.append(f"{events}: skipped a line over {LONGEST_LINE} bytes")
        s.problems += len(lines.problems)  # a line without its newline yet is read next time
    _finish(s)
    return s


def _scan_block(s: _Scan, block: bytes, stop: int, lines: ev.EventLines) -> None:
    """The whole lines of block[:stop]: every one but step and gpu lines parsed in order (the regex finds their tags
    at C speed; a line with no event tag is no event); of step lines only the newest are kept, raw."""
    settled = reset = 0  # where the last step-setting event ended; where the last run_started did
    end = 0
    for m in _OTHER.finditer(block, 0, stop):
        if m.start() < end:
            continue  # the line found already
        start, end = block.rfind(b"\n", 0, m.start()) + 1, block.find(b"\n", m.end())
        e = lines.parse(block[start:end])
        if e is None:
            continue
        if isinstance(e, (ev.RunStarted, ev.RunFailed)):
            q = block.rfind(STEP_TAG, settled, start)
            if q >= 0:  # the newest step line before this event counts into `step` first
                s.pending = block[block.rfind(b"\n", 0, q) + 1 : block.find(b"\n", q)]
        _feed(s, e)
        if isinstance(e, (ev.RunStarted, ev.RunFinished, ev.RunFailed)):
            settled = end
        if isinstance(e, ev.RunStarted):
            reset = end
    size, steps = 1 << 20, []
    while True:  # the newest TAIL_STEPS step lines after `reset`, reading back only as far as needed
        lo = max(reset, stop - size)
        parts = block[lo:stop].split(b"\n")
        steps = [p for p in (parts if lo == reset else parts[1:]) if STEP_TAG in p]  # parts[0]: maybe half a line
        if len(steps) >= TAIL_STEPS or lo == reset:
            break
        size *= 4
    if steps:
        s.tail.extend(steps[-TAIL_STEPS:])
        if block.rfind(STEP_TAG, 0, stop) > settled:
            s.pending = steps[-1]


def _settle_step(s: _Scan) -> None:
    """Count the newest step line into `step` (before an event that reads `step`)."""
    if s.pending is not None:
        e = ev.EventLines("").parse(s.pending)
        s.pending = None
        if isinstance(e, ev.Step):
            s.step = e.step


def _finish(s: _Scan) -> None:
    """The figures from the kept step lines: step, settled step times, tokens per step."""
    _settle_step(s)
    s.step_times, s.tokens_per_step = [], None
    for e in ev.EventLines("").read(s.tail):
        if isinstance(e, ev.Step) and e.step_time_s > 0 and math.isfinite(e.step_time_s):
            s.step_times.append(e.step_time_s)
            s.tokens_per_step = e.tokens_per_s * e.step_time_s


def _better(s: _Scan, v: float | None) -> None:
    if v is not None and math.isfinite(v) and (s.best_val is None or v < s.best_val):
        s.best_val = v


def _feed(s: _Scan, e: ev.Event) -> None:
    match e:
        case ev.RunStarted():
            _settle_step(s)
            if s.first_time is None:
                s.first_time = e.time
            s.started, s.end = e, None
            s.tail.clear()
            s.step = max(s.step, e.start_step)
        case ev.Step():  # a step line written otherwise than JsonlSink does
            s.tail.append(e.model_dump_json().encode())
            s.pending = None
            s.step = e.step
        case ev.Eval():
            _better(s, e.val_loss)
            if math.isfinite(e.val_loss):
                s.final_val = e.val_loss
                if e.train_time_s is not None and e.tokens is not None:
                    s.evals.append(Reach(step=e.step, train_time_s=e.train_time_s, tokens=e.tokens, val_loss=e.val_loss))
        case ev.RunFinished():
            s.pending = None
            s.end, s.step = e, e.step
            _better(s, e.best_val_loss)
        case ev.RunFailed():
            _settle_step(s)
            s.end = e
            s.step = s.step if e.step is None else e.step


_cache: dict[Path, _Scan] = {}


def _scan_cached(events: Path) -> _Scan:
    """The summary of a log, read only where it grew since the last call in this process."""
    s = _scan(events, _cache.get(events))
    _cache[events] = s
    return s


def _read_config(path: Path) -> dict[str, Any]:
    """config.toml, bounded and depth-capped; {} when it cannot be read (the log still tells)."""
    try:
        return files.read_toml(path / rundir.CONFIG, CONFIG_CAP)
    except (OSError, ValueError):
        return {}


def _settled_tokens_per_s(s: _Scan) -> float | None:
    """The run's own settled figure when the segment finished; else the trainer's rule
    (events.settled_step_time) on what is logged."""
    if isinstance(s.end, ev.RunFinished):
        v = s.end.summary.get("tokens_per_s")
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    settled = ev.settled_step_time(s.step_times)
    return s.tokens_per_step / settled if settled and s.tokens_per_step else None


def _state(path: Path, s: _Scan) -> RunStateName:
    if isinstance(s.end, ev.RunFailed):
        return "failed"
    if s.end is not None:
        return "stopped" if s.end.reason == "stopped" else "completed"  # the word the run_finished event itself uses
    if rundir.writer_alive(path):  # the lock's holder: the one liveness rule, never writer.pid
        return "running"
    return "writer gone"  # no one holds the lock and no ending: nothing will finish it


def _dig(d: dict[str, Any] | None, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def summarize(path: Path) -> RunSummary | None:
    """The summary of one run directory, or None when it holds no run."""
    path = Path(path)
    if not path.is_dir() or not rundir.holds_run(path):
        return None
    s = _scan_cached(path / rundir.EVENTS)
    cfg = _read_config(path)
    started_cfg = s.started.config if s.started else {}
    if s.first_time is not None:
        t0 = s.first_time
    else:
        try:
            t0 = min(p.lstat().st_mtime for p in (path / rundir.CONFIG, path / rundir.EVENTS) if os.path.lexists(p))
        except (OSError, ValueError):
            return None
    max_steps = _dig(started_cfg, "train", "max_steps") or _dig(cfg, "train", "max_steps")
    vocab = _dig(started_cfg, "model", "vocab_size") or _dig(cfg, "model", "vocab_size")
    return RunSummary(
        name=path.name, path=path,
        preset=started_cfg.get("preset") or cfg.get("preset"),
        n_params=s.started.n_params if s.started else None,
        vocab=vocab if isinstance(vocab, int) else None,
        state=_state(path, s), step=s.step,
        max_steps=max_steps if isinstance(max_steps, int) else None,
        best_val_loss=s.best_val, settled_tokens_per_s=_settled_tokens_per_s(s),
        started=datetime.fromtimestamp(t0).astimezone(),
        device_name=s.started.device_name if s.started else None,
        error=s.end.error if isinstance(s.end, ev.RunFailed) else None,
        final_val_loss=s.final_val, evals=list(s.evals),
    )  # fmt: skip


def listing_target(summaries: list[RunSummary], target: float | None = None) -> float | None:
    """The val loss a listing times its runs to: `target` (`--target`), else the worst final val
    loss among them, which every run that evaluated reached (None: no run evaluated)."""
    return target if target is not None else default_target(r.final_val_loss for r in summaries)


def list_runs(root: Path = DEFAULT_ROOT, target: float | None = None) -> list[RunSummary]:
    """Summaries of the runs directly under `root` (or `root` itself when it is a run),
    newest first, each timed to `target` val loss (default: the worst final val loss among
    them, as `compare` does). A missing root lists nothing."""
    root = Path(root)
    if not root.is_dir():
        return []
    if rundir.holds_run(root):
        one = summarize(root)
        out = [one] if one else []
    else:
        try:
            dirs = [p for p in root.iterdir() if p.is_dir()]
        except OSError:
            return []
        out = [r for r in (summarize(p) for p in dirs) if r is not None]
        out.sort(key=lambda r: (r.started, r.name), reverse=True)
    goal = listing_target(out, target)
    for r in out:
        r.to_target = None if goal is None else next((e for e in r.evals if e.val_loss <= goal), None)
    return out


# ------------------------------------------------------------------------------ text


def model_text(r: RunSummary) -> str:
    """Preset, size and vocab together: a parameter count means little without its vocab."""
    vocab = f" v{r.vocab}" if r.vocab else ""
    return f"{r.preset or '-'} {fmt_params(r.n_params)}{vocab}"


def step_text(r: RunSummary) -> str:
    return f"{r.step}/{r.max_steps if r.max_steps is not None else '?'}"


def best_loss_text(r: RunSummary) -> str:
    return "-" if r.best_val_loss is None else loss_text(r.best_val_loss)


def speed_text(r: RunSummary) -> str:
    return "-" if r.settled_tokens_per_s is None else f"{r.settled_tokens_per_s:,.0f}"


def started_text(r: RunSummary) -> str:
    return r.started.strftime("%Y-%m-%d %H:%M")


COLUMNS = ("name", "model", "state", "step", "best val", "tok/s", "to target", "started", "device")


def target_text(r: RunSummary) -> str:
    """Training time and tokens to the listing's target val loss; "-" when not reached."""
    if r.to_target is None:
        return "-"
    from engine.inspect.compare import reach_text

    return reach_text(r.to_target)


def row(r: RunSummary) -> tuple[str, ...]:
    """One run as the cells of COLUMNS (the CLI table and the Runs screen share them)."""
    cells = (r.name, model_text(r), r.state, step_text(r), best_loss_text(r), speed_text(r), target_text(r),
             started_text(r), r.device_name or "-")  # fmt: skip
    return tuple(shown(c) for c in cells)  # names and fields come from files: printable, one line


def target_note(summaries: list[RunSummary], target: float | None = None) -> str:
    """What the `to target` column measures: the val loss, where it came from, what the time is."""
    goal = listing_target(summaries, target)
    if goal is None:
        return "to target: no run evaluated a val loss"
    source = "--target" if target is not None else "the worst final val loss among these runs"
    return (f"to target: training time (sum of step times) and tokens to first reach val loss {loss_text(goal)} "
            f"({source}); - not reached")  # fmt: skip


def format_table(summaries: list[RunSummary], target: float | None = None) -> str:
    """A plain text table with a header, one line per run in the order given, then what the
    `to target` column measures (`target`: the one list_runs was given)."""
    if not summaries:
        return "no runs found"
    rows = [COLUMNS, *(row(r) for r in summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    right = {3, 4, 5, 6}  # numbers line up on the right
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.append(target_note(summaries, target))
    return "\n".join(lines)


__all__ = ["COLUMNS", "DEFAULT_ROOT", "RunSummary", "format_table", "list_runs", "listing_target", "row", "summarize",
           "target_note"]  # fmt: skip

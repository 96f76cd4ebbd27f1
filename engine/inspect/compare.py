"""`gpt2-tui compare RUN...`: runs and their segments side by side, as a table or JSON.

Everything is read from the run directories' events (engine.run.segments), so a finished run,
a live one and one from another machine compare alike. The rows and their cells are built
here once; the text table, the Compare screen and the dashboard's segment table show them.
Speed-ups are ratios of settled tokens/s (a step-time ratio would mislead when the
micro-batch changed): against the segment before in the same run, and against the first row.
Time to a loss: the training time and tokens each run (and segment) took to first reach a
target val loss (`--target`; default the worst final val loss among the runs, which every run
reached). The time is the sum of step times (Eval.train_time_s): evals, checkpoints, pauses
and the gaps between segments are left out, a compile's warm-up is in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from engine import events as ev
from engine import rundir
from engine import files
from engine.errors import UserError
from engine.text import duration_text, human, loss_text, path_text, ratio_text, short, value_text
from engine.text import shown as cell
from engine.run.segments import (SWITCHES, Reach, SegmentReader, SegmentSummary, default_target, final_val_loss,
                                 mark_target, speedup)  # fmt: skip


class RunComparison(BaseModel):
    run_dir: str
    best_val_loss: float | None
    segments: list[SegmentSummary]
    final_val_loss: float | None = None  # the last eval's
    to_target: Reach | None = None  # the first eval at or below Comparison.target_val_loss (None: not reached)


class Comparison(BaseModel):
    """What `compare --json` prints."""

    runs: list[RunComparison]
    target_val_loss: float | None = None  # what to_target is measured to (None: no run evaluated)
    target_from: Literal["--target", "worst final val loss"] = "worst final val loss"


def best_val_loss(events: Sequence[Any]) -> float | None:
    vals = [e.val_loss for e in events if isinstance(e, ev.Eval) and math.isfinite(e.val_loss)]
    return min(vals) if vals else None


def _run_events(run_dir: Path) -> Iterator[Any]:
    """A run directory's events one at a time (a bad line is skipped, never a reason to refuse
    the run), or UserError with one line naming the problem and the fix."""
    rundir.require_dir(run_dir)
    path = run_dir / rundir.EVENTS
    if not os.path.lexists(path):
        raise UserError(f"{run_dir} is not a run directory (no {rundir.EVENTS}); give the directory of a run")
    lines = ev.EventLines(path)
    try:
        with files.open_log(path, ev.EVENTS_CAP) as f:  # a link, a FIFO, a device: refused
            for raw in f:
                e = lines.parse(raw)
                if e is not None:
                    yield e
    except OSError as err:
        raise UserError(f"cannot read {path_text(path)} ({err.strerror or type(err).__name__}); "
                        "give the directory of a run") from None  # fmt: skip


def _never_started(run_dir: Path) -> UserError:
    return UserError(f"{run_dir / rundir.EVENTS} holds no run_started event: the run never started; give a run that trained")


def read_run(run_dir: Path) -> list[Any]:
    """A run's events, all of them (the Compare screen draws its curves from them)."""
    events = list(_run_events(run_dir))
    if not any(isinstance(e, ev.RunStarted) for e in events):
        raise _never_started(run_dir)
    return events


def summarize(run_dir: Path, target: float | None = None) -> RunComparison:
    """A run's segments and best val loss, read in one pass holding no event list: memory stays
    bounded by the number of segments, evals and step times, however long the log (`compare`).
    `target`: time to that val loss too (to_target; else compare's default target applies)."""
    run, _evals = _summarize(run_dir, target)
    return run


def _summarize(run_dir: Path, target: float | None) -> tuple[RunComparison, list[tuple[int, Reach]]]:
    reader, best = SegmentReader(), None
    for e in _run_events(run_dir):
        reader.feed(e)
        if isinstance(e, ev.Eval) and math.isfinite(e.val_loss):
            best = e.val_loss if best is None else min(best, e.val_loss)
    if reader.started is None:
        raise _never_started(run_dir)
    segs = reader.segments()
    run = RunComparison(run_dir=str(run_dir), best_val_loss=best, segments=segs, final_val_loss=final_val_loss(reader.evals),
                        to_target=mark_target(segs, reader.evals, target))  # fmt: skip
    return run, reader.evals


def compare(run_dirs: Sequence[Path], target: float | None = None) -> Comparison:
    """Every run read and checked before anything is shown: one bad directory, one line.
    `target`: the val loss to time the runs to (default: the worst final val loss among them)."""
    read = [_summarize(Path(d), None) for d in run_dirs]
    goal = target if target is not None else default_target(r.final_val_loss for r, _ in read)
    for run, evals in read:
        run.to_target = mark_target(run.segments, evals, goal)
    return Comparison(runs=[r for r, _ in read], target_val_loss=goal,
                      target_from="--target" if target is not None else "worst final val loss")  # fmt: skip


# ------------------------------------------------------------------------------ rows


@dataclass
class Row:
    """One segment as a table row, with the speed-ups that need its neighbours."""

    run: str
    segment: SegmentSummary
    vs_prev: float | None  # against the segment before, same run (None for a run's first)
    vs_first: float | None  # against the first row of the table
    best_val_loss: float | None  # this segment's best (SegmentSummary.best_val_loss), not the run's


def labels(run_dirs: Sequence[str]) -> list[str]:
    """Directory names, or whole paths where two names clash."""
    names = [Path(d).name or d for d in run_dirs]
    return [n if names.count(n) == 1 else d for n, d in zip(names, run_dirs)]


def rows(runs: Sequence[tuple[str, Sequence[SegmentSummary], float | None]]) -> list[Row]:
    """(label, segments, best val loss) per run -> rows in order; each row's best val is its
    segment's own (the run's best is RunComparison.best_val_loss)."""
    out: list[Row] = []
    first: SegmentSummary | None = None
    for label, segs, best in runs:
        for i, s in enumerate(segs):
            first = first or s
            prev = speedup(s, segs[i - 1]) if i else None
            out.append(Row(label, s, prev, speedup(s, first), s.best_val_loss))
    return out


def varying(segs: Sequence[SegmentSummary]) -> list[str]:
    """The switches whose value is not the same in every segment, in SWITCHES order."""
    names = [n for n in SWITCHES if any(n in s.switches for s in segs)]
    return [n for n in names if len({repr(s.switches.get(n)) for s in segs}) > 1]


def switch_items(s: SegmentSummary, shown: Sequence[str], base: SegmentSummary) -> list[tuple[str, bool]]:
    """('compile=on', differs from the base row) for each shown switch, the ones this segment
    changed first: what a table highlights."""
    order = [n for n in shown if n in s.changed] + [n for n in shown if n not in s.changed]
    return [(cell(f"{short(n)}={value_text(s.switches.get(n))}"), s.switches.get(n) != base.switches.get(n)) for n in order]


# The speed first, the switches last: at 80 columns the figures the product exists to show
# stay on screen however many switches a run changed.
COLUMNS = ("run", "steps", "why", "warm-up", "ms/step", "tok/s", "compile", "MFU", "peak mem", "vs prev", "vs first", "best val", "to target", "switches")  # fmt: skip
SWITCHES_COLUMN = COLUMNS.index("switches")
LEFT = frozenset({0, 1, 2, SWITCHES_COLUMN})  # text columns; the figures are right-aligned


def cells(r: Row) -> list[str]:
    """Every column but `switches` (the last, left empty), which the caller renders with its
    highlighting."""
    s = r.segment
    return [
        cell(r.run), f"{s.from_step}-{s.to_step}", why_text(s),
        "-" if s.first_step_time_s is None else f"{s.first_step_time_s:.2f} s",
        speed_text(s),
        "-" if s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}", compile_text(s),
        "-" if s.mfu is None else f"{100 * s.mfu:.1f}%",
        human(s.peak_mem_bytes), ratio_text(r.vs_prev), ratio_text(r.vs_first),
        "" if r.best_val_loss is None else loss_text(r.best_val_loss), reach_text(s.to_target), "",
    ]  # fmt: skip


def why_text(s: SegmentSummary) -> str:
    """The `why` cell: how the segment began and what it changed ('toggle compile=on'), so a
    narrow table that cannot reach the switches column still names each change."""
    return " ".join([s.reason, *(cell(f"{short(n)}={value_text(v[-1])}") for n, v in s.changed.items())])


def tokens_text(n: int) -> str:
    """A token count as people read it: 950, 12.3K, 4.5M, 1.20B."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


def reach_text(r: Reach | None) -> str:
    """The `to target` cell: training time and tokens to the target val loss ("" not reached here)."""
    return "" if r is None else f"{time_text(r.train_time_s)} {tokens_text(r.tokens)} tok"


def time_text(seconds: float) -> str:
    """A training time: '0.84 s', '42.1 s', then engine.text.duration_text ('12m34s')."""
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s" if seconds < 60 else duration_text(seconds)


def target_line(c: Comparison) -> str:
    """What the `to target` column measures, and each run's figure (or that it never got there)."""
    if c.target_val_loss is None:
        return "to target: no run evaluated a val loss"
    names = labels([r.run_dir for r in c.runs])
    each = [f"{cell(n)} {reach_text(r.to_target) + f' (step {r.to_target.step})' if r.to_target else 'not reached'}"
            for n, r in zip(names, c.runs)]  # fmt: skip
    return (f"to target: training time (sum of step times) and tokens to first reach val loss {loss_text(c.target_val_loss)} "
            f"({c.target_from}): " + "; ".join(each))  # fmt: skip


TOO_SHORT = "too short to settle"


def speed_text(s: SegmentSummary) -> str:
    """The ms/step cell: the settled step time, or why there is none (a segment of fewer step
    reports than the settle window, events.SETTLE_MIN_REPORTS, has no speed and no ratio)."""
    if s.too_short_to_settle:
        return TOO_SHORT
    return "-" if s.settled_step_time_s is None else f"{1000 * s.settled_step_time_s:.1f}"


def compile_text(s: SegmentSummary) -> str:
    """A compiled segment's compile time and where its code came from; `eager` when compile
    was on but nothing ran compiled; `-` without compile (or before it was recorded)."""
    if s.compiled is None:
        return "-"
    if not s.compiled:
        return "eager (nothing compiled)"
    return f"{s.compile_s:.1f} s {s.compile_source}"


def shown_switches(segs: Sequence[SegmentSummary]) -> list[str]:
    """The switches a table shows: only those that differ somewhere (one segment: none; the
    rest are the same in every row, which a table says once if at all)."""
    return varying(segs)


def table_rows(c: Comparison) -> list[Row]:
    names = labels([r.run_dir for r in c.runs])
    return rows([(n, r.segments, r.best_val_loss) for n, r in zip(names, c.runs)])


def format_table(c: Comparison) -> str:
    """The plain-text table: switches that differ from the first row carry a `*`."""
    table = table_rows(c)
    segs = [r.segment for r in table]
    if not segs:
        return "no segments: the runs logged no steps yet"
    shown = shown_switches(segs)
    same = [n for n in SWITCHES if n not in shown and n in segs[0].switches]
    lines = []
    if same:
        lines.append("same in all: " + " ".join(cell(f"{short(n)}={value_text(segs[0].switches[n])}") for n in same))
    body = []
    for r in table:
        row = cells(r)
        row[SWITCHES_COLUMN] = " ".join(text + ("*" if hot else "") for text, hot in switch_items(r.segment, shown, segs[0]))
        body.append(row)
    widths = [max(len(x[i]) for x in [list(COLUMNS), *body]) for i in range(len(COLUMNS))]
    for row in [list(COLUMNS), *body]:
        lines.append("  ".join(x.ljust(w) if i in LEFT else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths))).rstrip())
    lines.append("* differs from the first row; speed-ups are settled tok/s ratios; warm-up = the first logged step")
    lines.append(target_line(c))
    return "\n".join(lines)


def run(run_dirs: Sequence[Path], as_json: bool = False, target: float | None = None) -> str:
    """The text `gpt2-tui compare` prints."""
    c = compare(run_dirs, target)
    return c.model_dump_json(indent=2) if as_json else format_table(c)

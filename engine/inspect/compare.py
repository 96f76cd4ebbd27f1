"""`gpt2-tui compare RUN...`: runs and their segments side by side, as a table or JSON.

Everything is read from the run directories' events (engine.run.segments), so a finished run,
a live one and one from another machine compare alike. The rows and their cells are built
here once; the text table, the Compare screen and the dashboard's segment table show them.
Speed-ups are ratios of settled tokens/s (a step-time ratio would mislead when the
micro-batch changed): against the segment before in the same run, and against the first row.
Every setting that differs between the rows (optimizer, schedule, lr, batch, model shape, data,
seed, speed switches: the config each segment trained with) is named, by the config's sections,
in the table and in the JSON (`differs`, each segment's `settings`).
Each row's recipe: what it computes beyond GPT-2 as published (the optimizer, the schedule and the
form's Recipe switches, where not at their defaults: `mlp=relu2 qk_norm`), in the `recipe` column
and each run's `recipe` in the JSON.
Time to a loss: the training time and tokens each run (and segment) took to first reach a
target val loss (`--target`; default the worst final val loss among the runs, which every run
reached), and how many times sooner than the first run that reached it (`target vs first`). The
time is the sum of step times (Eval.train_time_s): evals, checkpoints, pauses and the gaps
between segments are left out, a compile's warm-up is in.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from engine import events as ev
from engine import rundir
from engine import files
from engine.config import ONLY_UNDER, RECIPE, RunConfig
from engine.errors import UserError
from engine.settings import all_settings
from engine.text import duration_text, human, loss_text, path_text, ratio_text, short, value_text
from engine.text import shown as cell
from engine.train.contention import line as contention_line, marked
from engine.run.segments import (SETTINGS, SWITCHES, Reach, SegmentReader, SegmentSummary, default_target,
                                 final_val_loss, mark_target, speedup)  # fmt: skip


class RunComparison(BaseModel):
    run_dir: str
    best_val_loss: float | None
    segments: list[SegmentSummary]
    final_val_loss: float | None = None  # the last eval's
    to_target: Reach | None = None  # the first eval at or below Comparison.target_val_loss (None: not reached)
    # how many times sooner than the first run that reached the target this one did (its training
    # time over this one's, like `vs first`; None: this run or no run reached it)
    to_target_vs_first: float | None = None
    recipe: dict[str, Any] = {}  # its recipe settings not at GPT-2's defaults (recipe_of), by dotted name


class Comparison(BaseModel):
    """What `compare --json` prints."""

    runs: list[RunComparison]
    target_val_loss: float | None = None  # what to_target is measured to (None: no run evaluated)
    target_from: Literal["--target", "worst final val loss"] = "worst final val loss"
    # the settings that differ between the rows (segments), by the config's section ("preset" alone
    # first): each segment's `settings` holds its values of them
    differs: dict[str, list[str]] = {}


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
    runs = [r for r, _ in read]
    for r in runs:
        r.recipe = recipe_of(r.segments[0].config) if r.segments else {}
    base = next((r.to_target for r in runs if r.to_target), None)
    for r in runs:
        r.to_target_vs_first = sooner(r.to_target, base)
    names = name_differences([s for r in runs for s in r.segments])
    return Comparison(runs=runs, target_val_loss=goal, differs=by_section(names),
                      target_from="--target" if target is not None else "worst final val loss")  # fmt: skip


def differing(segs: Sequence[SegmentSummary]) -> list[str]:
    """The settings whose value is not the same in every segment, in the config's order (SETTINGS)."""
    return [n for n in SETTINGS if len({repr(s.config.get(n)) for s in segs}) > 1]


def with_their_own(names: Sequence[str]) -> list[str]:
    """`names`, and with a differing optimizer or schedule the settings that act only under one of
    its values (ONLY_UNDER: a wsd row's decay fraction, a Muon row's lr), in the config's order."""
    more = {n for n, (mode, _) in ONLY_UNDER.items() if mode in names}
    return [n for n in SETTINGS if n in names or n in more]


def acts_in(s: SegmentSummary, name: str) -> bool:
    """Whether setting `name` does anything in segment `s` (False: one of ONLY_UNDER's, its mode off)."""
    mode, value = ONLY_UNDER.get(name, (None, None))
    return mode is None or s.config.get(mode) == value


def name_differences(segs: Sequence[SegmentSummary]) -> list[str]:
    """Each segment's `settings` set to its values of the settings that differ between them; those names."""
    names = differing(segs)
    for s in segs:  # each row's values of those, and of the ones its optimizer or schedule brings
        s.settings = {n: s.config.get(n) for n in with_their_own(names) if acts_in(s, n)}
    return names


def by_section(names: Sequence[str]) -> dict[str, list[str]]:
    """Dotted names grouped by the config's section ('optim.lr' under 'optim'; 'preset' alone)."""
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(n.split(".")[0], []).append(n)
    return out


def sooner(reach: Reach | None, base: Reach | None) -> float | None:
    """How many times sooner than `base` (in training time) `reach` got to the target."""
    if reach is None or base is None or reach.train_time_s <= 0:
        return None
    return base.train_time_s / reach.train_time_s


# ------------------------------------------------------------------------------ recipes


def _default(dotted: str) -> Any:
    section, name = dotted.split(".")
    return RunConfig.model_fields[section].annotation.model_fields[name].default  # type: ignore[union-attr]


# What a run computes beyond GPT-2 as published (issue 40): the optimizer and the schedule, and
# every switch of the form's Recipe section, in the config's order, each with GPT-2's value.
RECIPE_SETTINGS: dict[str, Any] = {
    s.dotted: _default(s.dotted)
    for s in all_settings()
    if s.form == RECIPE or s.dotted in ("optim.optimizer", "optim.schedule")
}
GPT2 = "GPT-2"  # the recipe cell of a run with none: GPT-2 as published


def recipe_of(config: dict[str, Any]) -> dict[str, Any]:
    """The recipe settings of a trained-with config (SegmentSummary.config) not at GPT-2's defaults."""
    return {n: config[n] for n, gpt2 in RECIPE_SETTINGS.items() if n in config and config[n] != gpt2}


def recipe_text(recipe: dict[str, Any]) -> str:
    """'mlp=relu2 qk_norm tie_head=off': a switch turned on by its name alone; GPT2 for none."""
    words = [short(n) if v is True else f"{short(n)}={value_text(v)}" for n, v in recipe.items()]
    return cell(" ".join(words)) if words else GPT2


# ------------------------------------------------------------------------------ rows


@dataclass
class Row:
    """One segment as a table row, with the speed-ups that need its neighbours."""

    run: str
    segment: SegmentSummary
    vs_prev: float | None  # against the segment before, same run (None for a run's first)
    vs_first: float | None  # against the first row of the table
    best_val_loss: float | None  # this segment's best (SegmentSummary.best_val_loss), not the run's
    # the time to the target against the first row that reached it (sooner); None: not reached here
    target_vs_first: float | None = None


def labels(run_dirs: Sequence[str]) -> list[str]:
    """Directory names, or whole paths where two names clash."""
    names = [Path(d).name or d for d in run_dirs]
    return [n if names.count(n) == 1 else d for n, d in zip(names, run_dirs)]


def rows(runs: Sequence[tuple[str, Sequence[SegmentSummary], float | None]]) -> list[Row]:
    """(label, segments, best val loss) per run -> rows in order; each row's best val is its
    segment's own (the run's best is RunComparison.best_val_loss)."""
    out: list[Row] = []
    first: SegmentSummary | None = None
    reached = next((s.to_target for _, segs, _ in runs for s in segs if s.to_target), None)
    for label, segs, best in runs:
        for i, s in enumerate(segs):
            first = first or s
            prev = speedup(s, segs[i - 1]) if i else None
            out.append(Row(label, s, prev, speedup(s, first), s.best_val_loss, sooner(s.to_target, reached)))
    return out


_SHORTS = [short(n) for n in SETTINGS]


def setting_label(name: str) -> str:
    """'optim.optimizer' -> 'optimizer'; the dotted name where two sections share the short one
    (model.block_size, train.block_size)."""
    return short(name) if _SHORTS.count(short(name)) == 1 else name


def setting_items(s: SegmentSummary, shown: Sequence[str], base: SegmentSummary) -> list[tuple[str, bool]]:
    """('optimizer=muon', differs from the base row) for each shown setting, the ones this segment
    changed first: what a table highlights."""
    acting = [n for n in shown if acts_in(s, n)]  # a cosine row has no decay fraction to show
    order = [n for n in acting if n in s.changed] + [n for n in acting if n not in s.changed]
    return [(cell(f"{setting_label(n)}={setting_value(n, s.config.get(n))}"),
             s.config.get(n) != base.config.get(n) or not acts_in(base, n)) for n in order]  # fmt: skip


def setting_value(name: str, value: Any) -> str:
    """A value as a cell says it: a recipe switch's None is off (no softcap, no window), else value_text's."""
    return "off" if value is None and name in RECIPE_SETTINGS else value_text(value)


# The payoff first (speed, speed-ups, val loss, time to the target), the details after, the
# recipe (what the row computes beyond GPT-2) and the settings that differ last: at 80 columns
# the figures the product exists to show stay on screen however many settings differ.
# `why` stays beside the step range: what a row changed.
COLUMNS = ("run", "steps", "why", "ms/step", "tok/s", "vs prev", "vs first", "best val", "to target", "target vs first",
           "warm-up", "compile", "MFU", "peak mem", "recipe", "differs")  # fmt: skip
SETTINGS_COLUMN = COLUMNS.index("differs")
LEFT = frozenset({0, 1, 2, COLUMNS.index("recipe"), SETTINGS_COLUMN})  # text columns; the figures are right-aligned
KEY_COLUMNS = 2  # run and steps: repeated in each block of a table split to fit a narrow terminal


def cells(r: Row) -> list[str]:
    """Every column but `differs` (the last, left empty), which the caller renders with its
    highlighting."""
    s = r.segment
    return [
        cell(r.run), f"{s.from_step}-{s.to_step}", why_text(s), speed_text(s),
        "-" if s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}", ratio_text(r.vs_prev), ratio_text(r.vs_first),
        "" if r.best_val_loss is None else loss_text(r.best_val_loss), reach_text(s.to_target),
        "" if s.to_target is None else ratio_text(r.target_vs_first),
        "-" if s.first_step_time_s is None else f"{s.first_step_time_s:.2f} s", compile_text(s),
        "-" if s.mfu is None else f"{100 * s.mfu:.1f}%", human(s.peak_mem_bytes),
        recipe_text(recipe_of(s.config)), "",
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
    return "-" if s.settled_step_time_s is None else marked(f"{1000 * s.settled_step_time_s:.1f}", s.contention)


def compile_text(s: SegmentSummary) -> str:
    """A compiled segment's compile time and where its code came from; `eager` when compile
    was on but nothing ran compiled; `-` without compile (or before it was recorded)."""
    if s.compiled is None:
        return "-"
    if not s.compiled:
        return "eager (nothing compiled)"
    return f"{s.compile_s:.1f} s {s.compile_source}"


def shown_settings(segs: Sequence[SegmentSummary]) -> list[str]:
    """The settings a table's `differs` column shows: those not the same in every row (one
    segment: none), speed switches and the rest alike (optimizer, schedule, lr, shape, data, seed),
    with the ones a differing optimizer or schedule brings (with_their_own; on the rows they act in)."""
    return with_their_own(differing(segs))


def table_rows(c: Comparison) -> list[Row]:
    names = labels([r.run_dir for r in c.runs])
    return rows([(n, r.segments, r.best_val_loss) for n, r in zip(names, c.runs)])


def differs_line(names: Sequence[str]) -> str:
    """'differs: optim: optimizer schedule; train: seed', grouped by the config's sections."""
    if not names:
        return "differs: nothing (every row trained with the same settings)"
    groups = [sec if group == [sec] else f"{sec}: " + " ".join(setting_label(n) for n in group)
              for sec, group in by_section(names).items()]  # fmt: skip
    return "differs: " + "; ".join(groups)


def _line(cols: Sequence[int], row: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(row[i].ljust(widths[i]) if i in LEFT else row[i].rjust(widths[i]) for i in cols).rstrip()


def blocks(widths: Sequence[int], width: int | None, keys_n: int = KEY_COLUMNS) -> list[list[int]]:
    """The columns of a table split into blocks that each fit `width` (None: one block), in
    order, each block led by the `keys_n` key columns (run, steps): the payoff in the first."""
    every = list(range(len(widths)))
    if width is None or sum(widths) + 2 * (len(widths) - 1) <= width:
        return [every]
    keys = every[:keys_n]
    out: list[list[int]] = []
    for i in every[keys_n:]:
        if out and len(_line(out[-1] + [i], ["x" * w for w in widths], widths)) <= width:
            out[-1].append(i)
        else:
            out.append(keys + [i])
    return out


def _wrapped(text: str, width: int | None) -> list[str]:
    """A prose line folded to `width` (continuations indented), or as it is."""
    if width is None or len(text) <= width:
        return [text]
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False)


def _folded(text: str, width: int | None) -> list[str]:
    """A `differs` cell as lines of whole settings within `width` (None: one line)."""
    if width is None or len(text) <= width:
        return [text]
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]


def format_table(c: Comparison, width: int | None = None) -> str:
    """The plain-text table: settings that differ from the first row carry a `*`. `width`: the
    terminal's columns; a wider table is split into blocks of whole columns, the payoff first."""
    table = table_rows(c)
    segs = [r.segment for r in table]
    if not segs:
        return "no segments: the runs logged no steps yet"
    shown = shown_settings(segs)
    same = [n for n in SWITCHES if n not in shown and n in segs[0].switches]
    lines = []
    if same:
        same_text = " ".join(cell(f"{short(n)}={value_text(segs[0].switches[n])}") for n in same)
        lines += _wrapped(f"same in all: {same_text}", width)
    if len(segs) > 1:
        lines += _wrapped(differs_line(shown), width)  # the settings the rows list (with their own: Muon's lr)
    body = []
    for r in table:
        row = cells(r)
        items = setting_items(r.segment, shown, segs[0])
        row[SETTINGS_COLUMN] = " ".join(text + ("*" if hot else "") for text, hot in items)
        body.append(row)
    keys = sum(max(len(x[i]) for x in [list(COLUMNS), *body]) + 2 for i in range(KEY_COLUMNS))
    folded = [_folded(row[SETTINGS_COLUMN], None if width is None else max(20, width - keys)) for row in body]
    for row, parts in zip(body, folded):  # a row's settings wider than the terminal go on under it
        row[SETTINGS_COLUMN] = parts[0]
    widths = [max(len(x[i]) for x in [list(COLUMNS), *body]) for i in range(len(COLUMNS))]
    for n, cols in enumerate(blocks(widths, width)):
        lines += [""] if n else []
        lines.append(_line(cols, list(COLUMNS), widths))
        for row, parts in zip(body, folded):
            lines.append(_line(cols, row, widths))
            for part in parts[1:] if SETTINGS_COLUMN in cols else []:
                lines.append(_line(cols, [part if i == SETTINGS_COLUMN else "" for i in range(len(row))], widths))
    for note in ("* differs from the first row; speed-ups are settled tok/s ratios; target vs first = the first run's "
                 "time to target over this one's; warm-up = the first logged step", target_line(c),
                 contention_line([s.contention for s in segs], "segments")):  # fmt: skip
        lines += _wrapped(note, width) if note else []
    return "\n".join(lines)


def terminal_width() -> int | None:
    """The columns a table must fit: $COLUMNS when set, else the terminal's; None when the output
    goes to no terminal (a file, a pipe): one table, however wide."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def run(run_dirs: Sequence[Path], as_json: bool = False, target: float | None = None) -> str:
    """The text `gpt2-tui compare` prints."""
    c = compare(run_dirs, target)
    return c.model_dump_json(indent=2) if as_json else format_table(c, terminal_width())

"""The Compare screen: several runs overlaid (loss, s/step, tok/s) and their segment table.

Opened from the Runs screen (mark runs, press c) or with `gpt2-tui compare --tui RUN...`.
Runs are read from their directories on a worker thread (a long log takes seconds to
parse); `r` reads them again, for runs still going. The x axis is the step, the tokens or
the training time; time is wall time since the run's start with the gaps between its
segments (stopped, then resumed hours later) left out, so runs line up at zero. A dotted
vertical line in the run's colour marks each segment start after the first. The legend and
the segment table's `to target` column say how much training time (the sum of step times)
and how many tokens each run took to first reach the target val loss: the worst final val
loss among the runs, which every run reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual_plotext import PlotextPlot

from engine.api import events as ev
from engine.api import best_val_loss, labels, read_run
from engine.api import UserError
from engine.api import change_text, shown
from engine.api import Reach, SegmentReader, SegmentSummary, default_target, final_val_loss, mark_target, reach_text
from engine.api import recipe_of, recipe_text, setting_items, shown_settings
from engine.api import loss_text
from tui.screens import BACK
from tui.models.runstate import EMA_BETA, X_AXES, Series, XAxis
from tui.widgets.charts import log_range, thin
from tui.widgets.segments import HOT, SegmentTable
from tui.plain import PlainApp

PALETTE = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")  # plotext's names
RICH = {"orange": "dark_orange"}  # where rich names the same colour otherwise


@dataclass
class RunCurves:
    """One run's curves and segments, read from its events."""

    run_dir: Path
    label: str
    color: str
    segments: list[SegmentSummary]
    best_val_loss: float | None
    series: dict[str, Series] = field(default_factory=lambda: {k: Series() for k in ("ema", "val", "step_time", "tokens_per_s")})  # fmt: skip
    starts: list[tuple[int, int, float]] = field(default_factory=list)  # (step, tokens, time) per segment
    evals: list[tuple[int, Reach]] = field(default_factory=list)  # (segment, eval) for the time to a target
    to_target: Reach | None = None  # the first eval at or below the screen's target val loss

    @property
    def final_val_loss(self) -> float | None:
        return final_val_loss(self.evals)


def curves(run_dir: Path, label: str, color: str, events: list[Any]) -> RunCurves:
    reader = SegmentReader()
    for e in events:
        reader.feed(e)
    run = RunCurves(run_dir, label, color, reader.segments(), best_val_loss(events), evals=reader.evals)
    s = run.series
    before = 0.0  # training time of the earlier segments
    t0 = last = None
    tokens = 0
    ema: float | None = None
    for e in events:
        if isinstance(e, ev.RunStarted):
            if t0 is not None and last is not None:
                before += last - t0
            t0 = last = e.time
            run.starts.append((e.start_step, tokens, before))
            continue
        if t0 is None or not hasattr(e, "time"):
            continue
        last = max(last or e.time, e.time)
        t = before + e.time - t0
        if isinstance(e, ev.Segment) and run.starts and run.starts[-1][0] != e.step:
            run.starts.append((e.step, tokens, t))  # a live toggle
        elif isinstance(e, ev.Step):
            tokens = e.tokens
            if math.isfinite(e.loss):
                ema = e.loss if ema is None else EMA_BETA * ema + (1 - EMA_BETA) * e.loss
                s["ema"].add(e.step, tokens, t, ema)
            s["step_time"].add(e.step, tokens, t, e.step_time_s)
            s["tokens_per_s"].add(e.step, tokens, t, e.tokens_per_s)
        elif isinstance(e, ev.Eval) and math.isfinite(e.val_loss):
            s["val"].add(e.step, tokens, t, e.val_loss)
    return run


def load(run_dirs: list[Path], target: float | None = None) -> list[RunCurves]:
    """Every run, timed to `target` (target_of), or UserError naming the first that is not one."""
    read = [(d, read_run(d)) for d in run_dirs]
    names = labels([str(d) for d in run_dirs])
    runs = [curves(d, n, PALETTE[i % len(PALETTE)], e) for i, (n, (d, e)) in enumerate(zip(names, read))]
    goal = target_of(runs, target)
    for r in runs:
        r.to_target = mark_target(r.segments, r.evals, goal)
    return runs


def target_of(runs: list[RunCurves], target: float | None = None) -> float | None:
    """The val loss the screen times the runs to: --target's, else the worst final val loss among them."""
    return target if target is not None else default_target(r.final_val_loss for r in runs)


class OverlayChart(PlotextPlot):
    """One metric of several runs: a line per run (and val points for the loss)."""

    DEFAULT_CSS = "OverlayChart { height: 1fr; min-height: 10; }"

    def __init__(self, title: str, series: str, *, val: bool = False, id: str | None = None):
        super().__init__(id=id)
        self.title_text, self.series_key, self.val = title, series, val
        self.drawn: list[str] = []  # the labels of the last draw, in order
        self.axis: XAxis = "step"

    def draw(self, runs: list[RunCurves], axis: XAxis, logy: bool) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        budget = 2 * max(self.size.width, 40)
        ys_all: list[float] = []
        self.drawn, self.axis = [], axis
        for run in runs:
            lines = [(self.series_key, run.label, False)] + ([("val", f"{run.label} val", True)] if self.val else [])
            for key, label, scatter in lines:
                xs, ys = thin(run.series[key].xs(axis), run.series[key].y, budget)
                if logy:
                    xs, ys = [x for x, y in zip(xs, ys) if y > 0], [math.log10(y) for y in ys if y > 0]
                if not xs:
                    continue
                ys_all += ys
                self.drawn.append(label)
                # no plotext legend: it sat over the first third of the curves; the run's
                # colour is named in the legend line above the charts (#compare-legend)
                if scatter:
                    plt.scatter(xs, ys, color=run.color, marker="dot")
                else:
                    plt.plot(xs, ys, color=run.color, marker="braille")
            for step, tokens, t in run.starts[1:]:
                plt.vline({"step": step, "tokens": tokens, "time": t}[axis], color=run.color)
        if logy and ys_all:
            plt.ylim(*log_range(ys_all))
        plt.title(self.title_text + ("  (log10)" if logy else "") + ("  lines: train, dots: val" if self.val else ""))
        plt.xlabel({"step": "step", "tokens": "tokens", "time": "seconds (resume gaps cut)"}[axis])
        self.refresh()


COMPACT = (120, 32)  # a terminal narrower or shorter than this gets the legend without what the table says


class CompareScreen(Screen):
    DEFAULT_CSS = """
    CompareScreen #compare-legend { height: auto; padding: 0 1; background: $boost; }
    CompareScreen #compare-charts { height: 1fr; }
    CompareScreen #compare-loss { height: 1fr; min-height: 10; }
    CompareScreen #compare-grid { grid-size: 2; height: 1fr; min-height: 10; }
    CompareScreen #compare-segments { height: auto; max-height: 12; border-top: solid $primary; }
    CompareScreen.-compact #compare-segments { max-height: 8; }
    """
    BINDINGS = [Binding("x", "xaxis", "X-axis"), Binding("l", "logy", "Log-y"), Binding("r", "reload", "Reload"), BACK]

    def __init__(self, run_dirs: list[Path], target: float | None = None):
        super().__init__()
        self.run_dirs = [Path(d) for d in run_dirs]
        self.target = target  # --target: the val loss to time the runs to (None: the worst final one)
        self.runs: list[RunCurves] = []
        self.axis: XAxis = "step"
        self.logy = False
        self.loaded = False  # True once the runs are on screen

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"reading {len(self.run_dirs)} run(s) ...", id="compare-legend")
        with Vertical(id="compare-charts"):
            yield OverlayChart("loss (train EMA, val dots)", "ema", val=True, id="compare-loss")
            with Grid(id="compare-grid"):
                yield OverlayChart("s/step", "step_time", id="compare-steptime")
                yield OverlayChart("tok/s", "tokens_per_s", id="compare-toks")
        yield SegmentTable(refresh_s=0, run_column=True, id="compare-segments")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpt2-tui - compare " + " ".join(d.name for d in self.run_dirs)
        self.action_reload()

    @work(thread=True, exclusive=True, group="compare-load")
    def action_reload(self) -> None:
        try:
            runs = load(self.run_dirs, self.target)
        except UserError as err:
            self.app.call_from_thread(self.notify, str(err), severity="error")
            return
        self.app.call_from_thread(self._show, runs)

    def _show(self, runs: list[RunCurves]) -> None:
        self.runs = runs
        self.query_one(SegmentTable).show([(r.label, r.segments, r.best_val_loss) for r in runs])
        self.query_one("#compare-legend", Static).update(self.legend())
        self.redraw()
        self.loaded = True

    def legend(self) -> Text:
        """The runs in their colours, each with its recipe where one is not GPT-2's (what it computes
        beyond GPT-2: `recipe mlp=relu2 qk_norm`) and its values of the settings that differ between the rows
        (optimizer, schedule, ...: highlighted where not the first run's), each segment start
        with what it changed. On a small terminal (COMPACT) what the table below says is left to it
        (each run's recipe, settings and time to the target are its columns, a segment start its
        row): the runs' colours on one line, then the target. The keys are the footer's, the x axis
        the charts' label, log-y their title's."""
        compact = self.size.width < COMPACT[0] or self.size.height < COMPACT[1]
        self.set_class(compact, "-compact")
        out = Text()
        target = target_of(self.runs, self.target)
        segs = [s for r in self.runs for s in r.segments]
        differs = shown_settings(segs) if segs else []
        recipes = [recipe_of(r.segments[0].config) if r.segments else {} for r in self.runs]
        for r, recipe in zip(self.runs, recipes):
            out.append("\u2588\u2588 ", style=RICH.get(r.color, r.color)).append(shown(r.label), style="bold")
            if compact:
                out.append("  ")
                continue
            if any(recipes):  # all GPT-2: the table's recipe column says so
                out.append("  recipe ").append(recipe_text(recipe), style="bold")
            if differs and r.segments:
                for text, hot in setting_items(r.segments[0], differs, segs[0]):
                    out.append(" ").append(text, style=HOT if hot else "")
            if target is not None and not compact:
                reach = r.to_target
                out.append(f"  to val {loss_text(target)}: " + (f"{reach_text(reach)} (step {reach.step})" if reach else "not reached"))
            for s in r.segments[1:]:
                out.append(shown(f"  | step {s.from_step}: {change_text(s.changed) or 'unchanged'} ({s.reason})"))
            out.append("\n")
        if compact:
            out.rstrip()
            out.append("\n")
        if target is not None:
            whence = "--target" if self.target is not None else "the worst final val loss"
            out.append(f"to val {loss_text(target)} ({whence}): training time" + (
                " (the table's `to target`)" if compact else
                " = sum of step times, evals, saves, pauses and resume gaps left out"))
        out.rstrip()
        return out

    def redraw(self) -> None:
        for chart in self.query(OverlayChart):
            chart.draw(self.runs, self.axis, self.logy)

    def on_resize(self) -> None:
        if self.runs:
            self.query_one("#compare-legend", Static).update(self.legend())
            self.call_after_refresh(self.redraw)

    def action_xaxis(self) -> None:
        self.axis = X_AXES[(X_AXES.index(self.axis) + 1) % len(X_AXES)]
        self.query_one("#compare-legend", Static).update(self.legend())
        self.redraw()

    def action_logy(self) -> None:
        self.logy = not self.logy
        self.query_one("#compare-legend", Static).update(self.legend())
        self.redraw()

    def action_back(self) -> None:
        if isinstance(self.app, CompareApp):
            self.app.exit()
        else:
            self.app.pop_screen()


class CompareApp(PlainApp):
    """`gpt2-tui compare --tui RUN...`: the Compare screen alone."""

    TITLE = "gpt2-tui"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, run_dirs: list[Path], target: float | None = None):
        super().__init__()
        self.run_dirs, self.target = run_dirs, target

    def on_mount(self) -> None:
        self.push_screen(CompareScreen(self.run_dirs, self.target))


def run_compare(run_dirs: list[Path], target: float | None = None) -> int:
    """The caller has checked the directories (engine.inspect.compare.read_run): one line if bad."""
    CompareApp(run_dirs, target).run()
    return 0


__all__ = ["CompareApp", "CompareScreen", "run_compare"]

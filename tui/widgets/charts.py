"""A plotext chart that redraws only when its data changed, only when visible, and cheaply.

Redrawing a plotext chart costs tens of ms, on the thread that also wants the GIL for
training, so: the dashboard calls `maybe_redraw()` from a slow timer; a chart redraws only
when the run's state changed since its last draw and it is on screen; points are thinned
to about twice the chart's width. Log scale is drawn as log10 values with labelled ticks
(plotext's own log scale breaks on re-render). plotext puts a legend in the top-left
corner, where a loss curve starts: only charts of several lines get one, with the y range
raised so that its rows hold no data.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from dataclasses import dataclass
from typing import ClassVar

from textual_plotext import PlotextPlot

from tui.models.runstate import RunState, Series, XAxis


@dataclass(frozen=True)
class Line:
    series: str  # RunState.series key, or "val" for val-loss points
    label: str
    color: str
    scatter: bool = False


def thin(xs: list[float], ys: list[float], n: int) -> tuple[list[float], list[float]]:
    """At most about n points, as an envelope: the points are cut into about n/2 buckets of
    consecutive points and each bucket keeps its lowest and its highest point (in x order),
    so a one-point spike (the torch.compile step among settled ones) is never thinned away.
    The first and the last point are always kept; each kept point is a real (x, y) pair."""
    if len(xs) <= n or n <= 0:
        return list(xs), list(ys)
    buckets = max(1, n // 2)
    k = math.ceil(len(xs) / buckets)
    idx: list[int] = []
    for start in range(0, len(xs), k):
        span = range(start, min(start + k, len(xs)))
        lo = min(span, key=ys.__getitem__)
        hi = max(span, key=ys.__getitem__)
        idx += sorted({lo, hi})
    if idx[0] != 0:
        idx.insert(0, 0)
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _fmt_tick(v: float) -> str:
    return f"{v:.3g}"


def _log_ticks(lo: float, hi: float, n: int = 5) -> tuple[list[float], list[str]]:
    """Tick positions (log10 units) inside [lo, hi] and their labels in data units, all of
    one width: the 1-2-5 values of each decade when three fall inside, else the 1..9 ones,
    else n evenly spaced values (a narrow range holds few round values)."""
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    ticks: list[float] = []
    for mantissas in ((1, 2, 5), range(1, 10)):
        nice = [d + math.log10(m) for d in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in mantissas]
        ticks = [t for t in nice if lo - 1e-9 <= t <= hi + 1e-9]
        if len(ticks) >= 3:
            break
    if len(ticks) > n:
        k = math.ceil(len(ticks) / n)
        ticks = ticks[::k]
    if len(ticks) < 2:
        ticks = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    labels = [_fmt_tick(10.0**t) for t in ticks]
    width = max(len(x) for x in labels)
    return ticks, [x.rjust(width) for x in labels]


def off_scale(
    xs: list[float], ys: list[float], lo: float, hi: float, log: bool = False
) -> tuple[list[float], list[tuple[float, float, str]]]:
    """A y range that cuts values off (a zoom, a ylim): the values clamped to its edges, and
    per cut-off run of points one mark (x, edge y, text) with the most extreme value, e.g.
    "▲18.7", so a clipped spike still shows where it was and how high it went. `log`: the
    values are log10 ones (the text gives the data value)."""
    out: list[float] = []
    marks: list[tuple[float, float, str]] = []
    run: tuple[float, str, float] | None = None  # (x, side, most extreme y) of the run past an edge
    for x, y in zip(xs, ys):
        side = "▲" if y > hi else "▼" if y < lo else ""
        if not side:
            run = None
            out.append(y)
            continue
        edge = hi if side == "▲" else lo
        out.append(edge)
        if run is None or run[1] != side:
            run = (x, side, y)
            marks.append((x, edge, ""))
        else:
            run = (run[0], side, max(y, run[2]) if side == "▲" else min(y, run[2]))
        marks[-1] = (run[0], edge, f"{side}{10 ** run[2] if log else run[2]:.3g}")
    return out, marks


MAX_LABEL_ROWS = 3  # marker labels stacked at most this deep under the chart's top


def label_row(placed: list[int], col: int, width: int, max_rows: int) -> int | None:
    """The first label row where `width` characters from `col` overlap no label placed
    before (`placed`: per row, its first free column; updated), or None: no room."""
    for row in range(max_rows):
        if row == len(placed):
            placed.append(0)
        if col >= placed[row]:
            placed[row] = col + width + 1
            return row
    return None


_CHANGE = re.compile(r"(\S+) \S+ -> (\S+)")


def compact(label: str) -> str:
    """A segment label in fewer columns: 'compile off -> on, prefetch on -> off' ->
    'compile=on prefetch=off' (the new values: what the segment trained with)."""
    return _CHANGE.sub(r"\1=\2", label).replace(", ", " ")


def place_labels(cols_at: list[int], labels: list[str], cols: int, max_rows: int) -> list[tuple[int, int, str] | None]:
    """(start column, row, text) per label, or None where there is no room. Each starts at its
    line (moved left as far as it must to end inside `cols`: whole, never cut by the frame).
    When the labels as written leave some line without one, they are all written compactly
    (compact) if that labels more lines: every segment start named, however close together."""
    best: list[tuple[int, int, str] | None] = []
    for form in (str, compact):
        placed: list[int] = []  # per label row, the first free column
        out: list[tuple[int, int, str] | None] = []
        for col, label in zip(cols_at, labels):
            text = form(label)[: min(24, cols)]
            start = max(0, min(col, cols - len(text)))
            row = label_row(placed, start, len(text), max_rows)
            out.append(None if row is None else (start, row, text))
        if not best or sum(x is not None for x in out) > sum(x is not None for x in best):
            best = out
        if all(x is not None for x in best):
            break
    return best


def log_range(ys: list[float]) -> tuple[float, float]:
    """The y range a log chart shows: the data's, widened a little so no point sits on the frame."""
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-9:
        return lo - 0.05, hi + 0.05
    pad = 0.02 * (hi - lo)
    return lo - pad, hi + pad


class MetricChart(PlotextPlot):
    """One metric panel. `draw_seconds` totals the time spent building plots (all charts)."""

    draw_seconds: ClassVar[float] = 0.0
    draws: ClassVar[int] = 0

    DEFAULT_CSS = """
    MetricChart { height: 1fr; min-height: 8; }
    """

    def __init__(self, title: str, lines: list[Line], *, unit: str = "", unmeasured: str | None = None,
                 id: str | None = None):  # fmt: skip
        super().__init__(id=id)
        self.title_text, self.lines, self.unit = title, lines, unit
        self.unmeasured = unmeasured  # why a device may report nothing for it (the dashboard says so instead)
        self.hline: float | None = None  # e.g. the grad clip
        self.markers: list[tuple[int, str]] = []  # (step, label): a vertical line each, e.g. segment starts
        self.markers_drawn: list[tuple[float, str]] = []  # (x, label) at the last draw, for tests
        self.labels_drawn: list[str] = []  # the marker labels written at the last draw (maybe compact)
        self.zoom: tuple[float, float] | None = None  # a y range (data units) that may cut values off
        self.off_scale_drawn: list[tuple[float, float, str]] = []  # the cut-off marks at the last draw
        self._drawn: tuple[int, str, bool, int, int] | None = None

    def series_of(self, state: RunState, name: str) -> Series:
        return state.val if name == "val" else state.series[name]

    def has_data(self, state: RunState) -> bool:
        return any(len(self.series_of(state, ln.series)) for ln in self.lines)

    def maybe_redraw(self, state: RunState, axis: XAxis, logy: bool) -> bool:
        """Rebuild the plot if anything it shows changed and it is visible; True if it did."""
        key = (state.version, axis, logy, self.size.width, self.size.height)
        if key == self._drawn or not self.display or not self.region or self.size.width < 10:
            return False
        self._drawn = key
        t0 = time.perf_counter()
        self._build(state, axis, logy)
        MetricChart.draw_seconds += time.perf_counter() - t0
        MetricChart.draws += 1
        self.refresh()
        return True

    def _build(self, state: RunState, axis: XAxis, logy: bool) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        latest = ""
        budget = 2 * max(self.size.width, 10)
        all_y: list[float] = []
        legend = len(self.lines) > 1  # one line: the title names it
        zoom = self._zoom_range(logy)
        self.off_scale_drawn = []
        for ln in self.lines:
            s = self.series_of(state, ln.series)
            if not len(s):
                continue
            xs, ys = thin(s.xs(axis), s.y, budget)
            if logy:
                keep = [(x, y) for x, y in zip(xs, ys) if y > 0]
                xs, ys = [x for x, _ in keep], [math.log10(y) for _, y in keep]
            if not xs:
                continue
            if zoom is not None:  # values past the zoom: at its edge, with a mark saying how far
                ys, marks = off_scale(xs, ys, *zoom, log=logy)
                self.off_scale_drawn += marks
            all_y += ys
            label = ln.label if legend else None
            if ln.scatter:
                plt.scatter(xs, ys, color=ln.color, marker="dot", label=label)
            else:
                plt.plot(xs, ys, color=ln.color, marker="braille", label=label)
            if not latest:
                latest = f"{s.y[-1]:.4g}{self.unit}"
        if self.hline is not None and self.hline > 0:
            h = math.log10(self.hline) if logy else self.hline
            plt.hline(h, color="red")
            all_y.append(h)
        self._draw_markers(state, axis, all_y)
        for x, y, text in self.off_scale_drawn:
            plt.text(text, x, y, color="red")
        if all_y and (logy or legend or zoom):
            lo, hi = zoom if zoom else log_range(all_y) if logy else (min(all_y), max(all_y))
            if legend:
                lo, hi = self._above_legend(lo, hi)
            plt.ylim(lo, hi)  # plotext's own range may reach past the ticks: keep them all inside
            if logy:
                ticks, labels = _log_ticks(lo, hi)
                plt.yticks(ticks, labels)
        plt.title(f"{self.title_text}  {latest}".rstrip())
        plt.xlabel({"step": "step", "tokens": "tokens", "time": "seconds"}[axis])

    def _zoom_range(self, logy: bool) -> tuple[float, float] | None:
        if self.zoom is None:
            return None
        lo, hi = self.zoom
        if logy:
            if hi <= 0:
                return None
            lo, hi = math.log10(max(lo, hi * 1e-6)), math.log10(hi)
        return (lo, hi) if hi > lo else None

    def _draw_markers(self, state: RunState, axis: XAxis, all_y: list[float]) -> None:
        """A vertical line and a short label at each marker's step, on this chart's x axis (a
        step maps to the tokens or time of the first point at or after it)."""
        self.markers_drawn = []
        if not self.markers or not all_y or not self.lines:
            return
        s = self.series_of(state, self.lines[0].series)
        if not len(s):
            return
        xs_all = s.xs(axis)
        lo_x, hi_x = xs_all[0], xs_all[-1]
        top, bottom = max(all_y), min(all_y)
        rows = max(1, self.size.height - 5)  # the canvas (see _above_legend)
        cols = max(10, self.size.width - 10)  # less the y tick labels and the frame
        span = max(hi_x - lo_x, 1e-12)
        at: list[tuple[float, str]] = []
        for step, label in self.markers:
            i = bisect.bisect_left(s.step, step)
            if i >= len(s):
                continue  # no point there yet
            at.append((float(step) if axis == "step" else xs_all[i], label))
        self.markers_drawn = at
        self.labels_drawn = []
        cols_at = [int((x - lo_x) / span * cols) for x, _ in at]
        places = place_labels(cols_at, [label for _, label in at], cols, MAX_LABEL_ROWS)
        for (x, _), place in zip(at, places):
            self.plt.vline(x, color="magenta")
            if place is None:
                continue  # no room beside the others: the line alone (the Segments tab names it)
            start, row, text = place
            y = top - row * (top - bottom) / rows if top > bottom else top
            self.plt.text(text, lo_x + start / cols * span, y, color="magenta", alignment="left")
            self.labels_drawn.append(text)

    def _above_legend(self, lo: float, hi: float) -> tuple[float, float]:
        """A top for the y range that leaves the legend's rows (one per line, at the top of
        the canvas) and one more free of data. plotext's canvas is the widget's height less
        the title, the x label, the x tick labels and the two frame lines."""
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        rows, free = self.size.height - 5, len(self.lines) + 1
        return (lo, lo + (hi - lo) * rows / (rows - free)) if rows > free else (lo, hi)

    def render(self):  # type: ignore[override]
        t0 = time.perf_counter()
        out = super().render()
        MetricChart.draw_seconds += time.perf_counter() - t0
        return out

"""A plotext chart that redraws only when its data changed, only when visible, and cheaply.

Redrawing a plotext chart costs tens of ms, on the thread that also wants the GIL for
training, so: the dashboard calls `maybe_redraw()` from a slow timer; a chart redraws only
when the run's state changed since its last draw and it is on screen; points are thinned
to about twice the chart's width. Log scale is drawn as log10 values with labelled ticks
(plotext's own log scale breaks on re-render).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar

from textual_plotext import PlotextPlot

from tui.runstate import RunState, Series, XAxis


@dataclass(frozen=True)
class Line:
    series: str  # RunState.series key, or "val" for val-loss points
    label: str
    color: str
    scatter: bool = False


def thin(xs: list[float], ys: list[float], n: int) -> tuple[list[float], list[float]]:
    """Every k-th point so that at most about n remain; the last point is always kept."""
    if len(xs) <= n or n <= 0:
        return list(xs), list(ys)
    k = math.ceil(len(xs) / n)
    idx = list(range(0, len(xs), k))
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick positions (log10 units) and their labels in data units."""
    a, b = math.floor(lo), math.ceil(hi)
    if b - a < 1:
        b = a + 1
    step = max(1, (b - a) // 4)
    ticks = list(range(a, b + 1, step))
    return [float(t) for t in ticks], [f"{10.0**t:g}" for t in ticks]


class MetricChart(PlotextPlot):
    """One metric panel. `draw_seconds` totals the time spent building plots (all charts)."""

    draw_seconds: ClassVar[float] = 0.0
    draws: ClassVar[int] = 0

    DEFAULT_CSS = """
    MetricChart { height: 1fr; min-height: 8; }
    """

    def __init__(self, title: str, lines: list[Line], *, unit: str = "", id: str | None = None):
        super().__init__(id=id)
        self.title_text, self.lines, self.unit = title, lines, unit
        self.hline: float | None = None  # e.g. the grad clip
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
            all_y += ys
            if ln.scatter:
                plt.scatter(xs, ys, color=ln.color, marker="dot", label=ln.label)
            else:
                plt.plot(xs, ys, color=ln.color, marker="braille", label=ln.label)
            if not latest:
                latest = f"{s.y[-1]:.4g}{self.unit}"
        if self.hline is not None and self.hline > 0:
            h = math.log10(self.hline) if logy else self.hline
            plt.hline(h, color="red")
            all_y.append(h)
        if logy and all_y:
            ticks, labels = _log_ticks(min(all_y), max(all_y))
            plt.yticks(ticks, labels)
        plt.title(f"{self.title_text}  {latest}".rstrip())
        plt.xlabel({"step": "step", "tokens": "tokens", "time": "seconds"}[axis])

    def render(self):  # type: ignore[override]
        t0 = time.perf_counter()
        out = super().render()
        MetricChart.draw_seconds += time.perf_counter() - t0
        return out

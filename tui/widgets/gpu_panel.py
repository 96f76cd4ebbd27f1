"""The GPU panel: per GPU, utilization, memory, power, temperature and SM clock over time.

Samples arrive from engine.gpu_monitor's sampler thread (or from `gpu` events of an
attached run); `add_samples` only stores them, under a lock, so it is safe from any thread
and costs nothing. Drawing happens on the panel's own timer, only when new samples came
and the panel is on screen, at most once per `min_interval` (1 s) and slower when drawing
is expensive: the redraw shares the GIL with an in-process trainer (design.md, known risk).
Charts follow tui/widgets/charts.py: plotext, points thinned to about twice the width, and
their cost counted in MetricChart.draw_seconds so the overhead benchmark sees it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from engine.api import GpuSample
from tui.widgets.charts import MetricChart, thin

HISTORY = 3600  # samples kept per GPU: an hour at 1 Hz
MIN_INTERVAL = 1.0  # s between redraws: at most 1 Hz
MAX_INTERVAL = 10.0
DRAW_SHARE = 0.02  # the panel's drawing may take at most this share of wall time
LEGEND_MAX = 4  # more GPUs than this: no legend (it would cover the chart); the title lists them in order
COLORS = ("cyan", "orange", "green", "magenta", "yellow", "blue", "red", "white")


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    get: Callable[[GpuSample], float | None]
    top: Callable[[GpuSample], float | None] | None = None  # the y range's true ceiling, when one exists


METRICS = (
    Metric("util", "utilization %", lambda s: s.util_pct, lambda s: 100.0),
    Metric("mem", "memory used GiB", lambda s: None if s.mem_used_bytes is None else s.mem_used_bytes / 2**30,
           lambda s: None if s.mem_total_bytes is None else s.mem_total_bytes / 2**30),
    Metric("power", "power W", lambda s: s.power_w),
    Metric("temp", "temperature C", lambda s: s.temp_c),
    Metric("clock", "SM clock MHz", lambda s: None if s.sm_clock_mhz is None else float(s.sm_clock_mhz)),
)


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def gpu_line(s: GpuSample) -> str:
    """One GPU's latest reading in one line (also what tests read)."""
    if s.mem_used_bytes is None:
        mem = "-"
    else:
        total = "" if s.mem_total_bytes is None else f"/{s.mem_total_bytes / 2**30:.1f}"
        mem = f"{s.mem_used_bytes / 2**30:.1f}{total} GiB"
    return (
        f"GPU{s.index} {s.name}  util {_num(s.util_pct, '.0f')}%  mem {mem}  "
        f"power {_num(s.power_w, '.0f')} W  temp {_num(s.temp_c, '.0f')} C  SM {_num(s.sm_clock_mhz, 'd')} MHz"
    )


class GpuChart(PlotextPlot):
    """One metric, one line per GPU, x in seconds (minutes past 10) since the first sample."""

    DEFAULT_CSS = "GpuChart { height: 10; }"

    def __init__(self, metric: Metric, *, id: str | None = None):
        super().__init__(id=id)
        self.metric = metric
        self.render_seconds = 0.0  # the last render's cost, for the panel's pacing

    def build(self, history: dict[int, list[GpuSample]], t0: float) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        span = max((h[-1].t - t0 for h in history.values() if h), default=0.0)
        scale, unit = (60.0, "minutes") if span > 600 else (1.0, "seconds")
        budget = max(self.size.width, 10)  # one point per column: readings are noisy, a braille cell holds two
        latest: list[str] = []
        tops: list[float] = []
        highest = 0.0
        legend = 1 < len(history) <= LEGEND_MAX
        for n, (idx, samples) in enumerate(sorted(history.items())):
            every = list(range(len(samples)))
            kept, _ = thin(every, every, budget)  # thin first: an hour at 1 Hz is 3600 samples per GPU
            pts = [((s.t - t0) / scale, v) for s in (samples[k] for k in kept) if (v := self.metric.get(s)) is not None]
            if not pts:
                continue
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            plt.plot(xs, ys, color=COLORS[n % len(COLORS)], marker="braille", label=f"GPU{idx}" if legend else None)
            latest.append(f"{ys[-1]:.4g}")
            highest = max(highest, *ys)
            if self.metric.top is not None and (top := self.metric.top(samples[-1])) is not None:
                tops.append(top)
        if tops:  # 0 to the ceiling: 97% busy must not look like a cliff between 96 and 98
            plt.ylim(0, max(*tops, highest))  # never hide a reading above the ceiling
        plt.title(f"{self.metric.title}  {' '.join(latest)}".rstrip())
        plt.xlabel(unit)

    def render(self):  # type: ignore[override]
        t0 = time.perf_counter()
        out = super().render()
        self.render_seconds = time.perf_counter() - t0
        MetricChart.draw_seconds += self.render_seconds
        return out


class GpuPanel(Vertical):
    """Per-GPU lines and charts; or one line saying why there is nothing to show."""

    DEFAULT_CSS = """
    GpuPanel { height: auto; }
    GpuPanel #gpu-status { height: auto; padding: 0 1; }
    GpuPanel #gpu-charts { grid-size: 2; grid-rows: 10; height: auto; }
    """

    def __init__(self, unavailable: str | None = None, *, history: int = HISTORY,
                 min_interval: float = MIN_INTERVAL, id: str | None = None):  # fmt: skip
        super().__init__(id=id)
        self.unavailable = unavailable
        self.min_interval = self.interval = min_interval
        self._lock = threading.Lock()
        self._history: dict[int, deque[GpuSample]] = {}
        self._maxlen = history
        self._t0: float | None = None
        self.version = 0  # bumped by every add_samples
        self._drawn = -1
        self._last_draw = 0.0
        self.redraws = 0

    def compose(self) -> ComposeResult:
        yield Static(self.status_text(), id="gpu-status", markup=False)
        with Grid(id="gpu-charts"):
            for m in METRICS:
                yield GpuChart(m, id=f"gpu-chart-{m.key}")

    def on_mount(self) -> None:
        self.query_one("#gpu-charts").display = self.unavailable is None
        self._timer = self.set_interval(self.min_interval / 2, self.maybe_redraw)

    # ----------------------------------------------------------------- data

    def add_samples(self, samples: list[GpuSample]) -> None:
        """Store a sampling round; safe from any thread (nothing on screen changes here)."""
        with self._lock:
            for s in samples:
                if self._t0 is None:
                    self._t0 = s.t
                self._history.setdefault(s.index, deque(maxlen=self._maxlen)).append(s)
            self.version += 1

    def set_unavailable(self, reason: str | None) -> None:
        """Show one line instead of the charts (None: show the charts again)."""
        self.unavailable = reason
        if self.is_mounted:
            self.query_one("#gpu-charts").display = reason is None
            self.query_one("#gpu-status", Static).update(self.status_text())

    def latest(self) -> list[GpuSample]:
        with self._lock:
            return [h[-1] for _, h in sorted(self._history.items()) if h]

    def status_text(self) -> str:
        if self.unavailable is not None:
            return f"GPU panel: not available here — {self.unavailable}"
        lines = [gpu_line(s) for s in self.latest()]
        return "\n".join(lines) if lines else "GPU panel: waiting for the first reading"

    # ----------------------------------------------------------------- drawing

    def _on_screen(self) -> bool:
        try:
            return self.app.screen is self.screen and bool(self.region) and self.display
        except Exception:  # not mounted, or no screen yet
            return False

    def maybe_redraw(self, force: bool = False) -> bool:
        """Redraw if new samples came, the panel is visible and the interval has passed."""
        now = time.perf_counter()
        if not force and (self.version == self._drawn or now - self._last_draw < self.interval):
            return False
        if not force and not self._on_screen():
            return False
        with self._lock:
            version = self.version
            history = {i: list(h) for i, h in self._history.items()}
            t0 = self._t0
        self._drawn, self._last_draw = version, now
        self.query_one("#gpu-status", Static).update(self.status_text())
        if self.unavailable is None and history and t0 is not None:
            charts = list(self.query(GpuChart))
            start = time.perf_counter()
            for chart in charts:
                chart.build(history, t0)
                chart.refresh()
            # building is cheap next to rendering, whose cost the last draw left behind
            cost = time.perf_counter() - start + sum(c.render_seconds for c in charts)
            MetricChart.draw_seconds += cost
            MetricChart.draws += 1
            # slower when drawing costs more than DRAW_SHARE of the time between draws
            self.interval = min(MAX_INTERVAL, max(self.min_interval, cost / DRAW_SHARE))
        self.redraws += 1
        return True


__all__ = ["GpuChart", "GpuPanel", "METRICS", "gpu_line"]

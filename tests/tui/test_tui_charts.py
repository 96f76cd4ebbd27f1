"""Log-y on the dashboard's charts (issue 13, item 3): after toggling it, on and off and on
again, every chart keeps numeric y labels, at least three of them, inside the data's range.
plotext's own log scale broke on re-render; the charts plot log10 values with their own ticks.
"""

from __future__ import annotations

import asyncio
import math

from textual.app import App, ComposeResult

from harness import recorded_state
from tui.widgets.charts import Line, MetricChart, _log_ticks

SIZE = (100, 60)


class Charts(App):
    def compose(self) -> ComposeResult:
        yield MetricChart("loss", [Line("loss", "raw", "gray")], id="chart-loss")
        yield MetricChart("lr", [Line("lr", "lr", "green")], id="chart-lr")
        yield MetricChart("s/step", [Line("step_time", "s/step", "yellow")], unit=" s", id="chart-steptime")


def y_labels(chart: MetricChart) -> list[str]:
    """The y tick labels of a rendered chart: the text left of each tick mark."""
    return [line.split("┤")[0].strip() for line in str(chart.render()).splitlines() if "┤" in line]


def test_log_y_keeps_numeric_labels_after_toggling() -> None:
    state = recorded_state()
    ranges = {"chart-loss": (state.series["loss"].y), "chart-lr": state.series["lr"].y,
              "chart-steptime": state.series["step_time"].y}  # fmt: skip

    async def go() -> None:
        app = Charts()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            for logy in (False, True, False, True):
                for chart in app.query(MetricChart):
                    assert chart.maybe_redraw(state, "step", logy)
                await pilot.pause()
            for chart in app.query(MetricChart):
                labels = y_labels(chart)
                assert len(labels) >= 3, (chart.id, labels)
                values = [float(x) for x in labels]  # numeric, no run-together digits
                ys = ranges[chart.id]
                assert all(min(ys) / 1.1 <= v <= max(ys) * 1.1 for v in values), (chart.id, labels)
                assert values == sorted(values, reverse=True), (chart.id, labels)  # top to bottom

    asyncio.run(go())


def test_log_ticks_inside_any_range() -> None:
    for lo, hi in ((0.6, 1.0), (-4.2, -3.2), (-1.0, 0.0), (0.7, 0.72), (3.0, 3.0), (-9.0, 2.0)):
        ticks, labels = _log_ticks(lo, hi)
        assert 2 <= len(ticks) <= 9
        assert all(lo - 0.051 <= t <= hi + 0.051 for t in ticks), (lo, hi, ticks)
        assert len({len(x) for x in labels}) == 1  # one width: labels never run together
        assert all(math.isclose(float(x), 10**t, rel_tol=0.01) for x, t in zip(labels, ticks)), (labels, ticks)


def test_segment_labels_on_a_chart_never_overlap() -> None:
    """Issue 22: two segments close together wrote their labels over each other
    ("prefetprecision auto -> bf16"); the second goes a row lower, a third with no room is left out."""
    from tui.widgets.charts import label_row

    placed: list[int] = []
    assert label_row(placed, 10, 16, 2) == 0  # "prefetch on -> off" at column 10
    assert label_row(placed, 14, 21, 2) == 1  # "precision auto -> bf16" would overlap it: a row lower
    assert label_row(placed, 18, 5, 2) is None  # no row free there
    assert label_row(placed, 40, 5, 2) == 0  # far enough right: the top row again


def test_segment_labels_are_drawn_whole_near_either_edge() -> None:
    """A toggle early in the run and one late: each label starts at its line, or ends there
    near the right edge; neither is cut by the frame (at 80 columns the first one lost its
    start: "le off -> on")."""
    state = recorded_state()

    class One(App):
        def compose(self) -> ComposeResult:
            yield MetricChart("s/step", [Line("step_time", "s/step", "yellow")], unit=" s", id="chart-steptime")

    async def go() -> None:
        app = One()
        async with app.run_test(size=(40, 20)) as pilot:
            await pilot.pause()
            chart = app.query_one(MetricChart)
            chart.markers = [(3, "compile off -> on"), (57, "compile on -> off")]
            assert chart.maybe_redraw(state, "step", False)
            await pilot.pause()
            shown = str(chart.render())
            assert "compile off -> on" in shown and "compile on -> off" in shown, shown
            # a label longer than the room right of its line, in a narrow chart (80 columns)
            chart.markers = [(25, "precision auto -> bf16")]
            assert chart.maybe_redraw(state, "step", True)
            await pilot.pause()
            shown = str(chart.render())
            assert "precision auto -> bf16" in shown, shown

    asyncio.run(go())

"""Segment labels on the dashboard's s/step chart (issue 39): four toggles close together in
the half-width chart of an 80-column dashboard drew four lines but three labels; every segment
start is named, compactly ('compile=on') when the labels as written leave one without."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult

from harness import recorded_state
from tui.widgets.charts import Line, MetricChart

TOGGLES = [(10, "compile off -> on"), (20, "compile on -> off"), (30, "compile off -> on"), (40, "compile on -> off")]


class One(App):
    def compose(self) -> ComposeResult:
        yield MetricChart("s/step", [Line("step_time", "s/step", "yellow")], unit=" s", id="chart-steptime")


def drawn(width: int) -> str:
    state = recorded_state()

    async def go() -> str:
        app = One()
        async with app.run_test(size=(width, 24)) as pilot:
            await pilot.pause()
            chart = app.query_one(MetricChart)
            chart.markers = TOGGLES
            assert chart.maybe_redraw(state, "step", False)
            await pilot.pause()
            assert [label for _, label in chart.markers_drawn] == [label for _, label in TOGGLES]
            return str(chart.render())

    return asyncio.run(go())


def test_four_toggles_four_labels_at_80_columns() -> None:
    shown = drawn(40)  # the s/step chart: half of an 80-column dashboard
    assert shown.count("compile") == 4, shown
    assert shown.count("compile=on") == 2 and shown.count("compile=off") == 2, shown


def test_labels_as_written_where_they_fit() -> None:
    shown = drawn(160)
    assert shown.count("compile off -> on") == 2 and shown.count("compile on -> off") == 2, shown


def test_a_segment_table_is_drawn_with_its_cells_whole_at_once() -> None:
    """CI's 80x24 payoff test saw `res` for `resume prefetch=off`: a DataTable sizes a new row's
    cells only when idle, so a frame drawn between a redraw and that idle cut every cell to its
    header's width. The table gives each column its width as it draws."""
    from harness import DATA, run_events
    from tui.plain import PlainTable
    from tui.widgets.segments import SegmentTable

    class Segments(App):
        def compose(self) -> ComposeResult:
            yield SegmentTable(refresh_s=0)

    async def go() -> None:
        app = Segments()
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            table = app.query_one(SegmentTable)
            for event in run_events(DATA / "tui-run"):
                table.feed(event)
            assert table.redraw(force=True) and table.row_count > 0
            for block in table.query_children(PlainTable):  # before any idle: what the next frame shows
                for i, column in enumerate(block.ordered_columns):
                    cells = [block.get_row_at(r)[i] for r in range(block.row_count)]
                    width = column.content_width if column.auto_width else column.width
                    assert width >= max(len(str(column.label)), *(c.cell_len for c in cells)), (str(column.label), cells)

    asyncio.run(go())

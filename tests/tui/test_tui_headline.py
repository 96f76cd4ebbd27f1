"""The headline scene (issue 15): toggle a live run and watch the compile warm-up settle.

- both the loss and the s/step chart are on the dashboard's first screen at 120x40 and at
  80x24, and thinning a series for a chart keeps each bucket's envelope (min and max), so
  the compile step's spike never vanishes; values a zoom cuts off get an off-scale mark;
- a run that died (kill -9) says WRITER GONE within seconds on the dashboard that launched it;
- a toggle posted but not yet taken shows as pending on the Switches screen, and the same
  change again is refused there;
- keys typed into the setup form from its first paint all reach their field, in order.

The apps run for real (Pilot); waits are bounded polls (tests/pilot_wait.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tui.app import GPT2App
from tui.screens.dashboard import DashboardScreen
from tui.widgets.charts import MetricChart, off_scale, thin
from pilot_wait import until

DATA = Path(__file__).parents[1] / "data"


# ------------------------------------------------------------------ item 2: the charts that matter


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
def test_loss_and_step_time_charts_are_on_the_first_screen(size: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without scrolling, both charts lie wholly inside the charts' view, and are tall enough
    to read (the recorded 30-step nano run, tests/data/tui-run)."""
    monkeypatch.chdir(DATA)

    async def go() -> None:
        app = GPT2App(attach_dir=Path("tui-run"))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.session.state.finished, "the run read")
            await pilot.pause(0.6)
            view = app.screen.query_one("#charts-scroll").region
            assert view.bottom <= size[1] and view.height > 0
            for chart_id in ("#chart-loss", "#chart-steptime"):
                chart = app.screen.query_one(chart_id, MetricChart)
                r = chart.region
                assert r.height >= 10, (chart_id, r)
                assert view.y <= r.y and r.bottom <= view.bottom and r.x >= 0 and r.right <= size[0], (chart_id, r, view)
                assert chart._drawn is not None, f"{chart_id} not drawn"

    asyncio.run(go())


def test_thinning_keeps_the_compile_spike_at_every_length() -> None:
    """One 18.7 s step among 2 s ones, anywhere in a series of any length, survives thinning to
    any budget; so does the dip of the lowest value; at most about n points remain."""
    for length in range(1, 400):
        for pos in {0, length // 3, length - 1}:
            ys = [2.0 + 0.01 * (i % 7) for i in range(length)]
            ys[pos] = 18.7
            if length > 2:
                ys[(pos + length // 2) % length] = 0.5
            xs = list(range(length))
            for n in (2, 3, 10, 50, 240):
                tx, ty = thin(xs, ys, n)
                assert 18.7 in ty, (length, pos, n)
                assert min(ty) == min(ys) and tx[-1] == xs[-1] and tx[0] == 0, (length, pos, n)
                assert len(tx) <= max(n, 2) + 2, (length, n, len(tx))
                assert all(ys[x] == y for x, y in zip(tx, ty)) and tx == sorted(tx)


def test_values_cut_off_by_a_zoom_get_an_off_scale_mark() -> None:
    xs = list(range(100))
    ys = [2.0] * 100
    ys[3], ys[4], ys[50] = 18.7, 12.0, 0.1
    clamped, marks = off_scale(xs, ys, 1.0, 3.0)
    assert max(clamped) == 3.0 and min(clamped) == 1.0
    assert marks == [(3, 3.0, "▲18.7"), (50, 1.0, "▼0.1")]
